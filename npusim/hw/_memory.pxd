# C types for the compiled build of memory.py (an "augmenting" .pxd: Cython compiles
# memory.py as npusim.hw._memory with these declarations; the pure module ignores this
# file). A region's rank and size are C longs; the write path's and the put claims' block
# and range arithmetic runs on typed locals. `__dict__` keeps a region open to what other
# modules note on it, and its Python subclasses (host tensors, heap tensors) as they are.
import cython


cdef class Region:
    cdef public object name
    cdef public long rank
    cdef public long nbytes
    cdef public dict watchers
    cdef dict __dict__

    @cython.locals(end=cython.long, page=cython.long, hit=list)
    cpdef _notify(self, long offset, long nbytes)


cdef class Watcher:
    cdef public long offset
    cdef public long nbytes
    cdef public object on_change
    cdef public object region


cdef class DenseRegion(Region):
    cdef public object _written
    cdef public object buf


cdef class RowTableRegion(Region):
    cdef public object rows
    cdef public object buf


cdef class SparseRegion(DenseRegion):
    cdef public list zones
    cdef public list _zone_starts
    cdef public list _put_firsts
    cdef public list _put_buckets
    cdef public list _steps
    cdef public dict _step_index

    @cython.locals(i=cython.long, a=cython.long, b=cython.long)
    cpdef zone_problem(self, long offset, long nbytes)
    @cython.locals(end=cython.long, b=cython.long, lo=cython.long, hi=cython.long)
    cpdef release(self, long offset, long nbytes)
    @cython.locals(end=cython.long, i=cython.long, b=cython.long, k=object)
    cpdef claim(self, long offset, long nbytes, tuple who)
    @cython.locals(a=cython.long, b=cython.long)
    cdef _overlap(self, tuple cols, long j, long offset, long end)
