# C types for the compiled build of ub.py (an "augmenting" .pxd: Cython compiles ub.py as
# npusim.hw._ub with these declarations; the pure module ignores this file). A buffer's
# hazard times are C doubles (as Python floats), its place and size C longs.
import cython


cdef class UBBuffer:
    cdef public UnifiedBuffer ub
    cdef public object name
    cdef public long offset
    cdef public long nbytes
    cdef public double write_ready
    cdef public double read_busy
    cdef public object writer
    cdef public bint all_written

    @cython.locals(item=cython.long, start=cython.long, end=cython.long)
    cpdef view(self, object dtype, object count=*, long byte_offset=*)
    cpdef mark_written(self)
    @cython.locals(at=cython.long)
    cpdef bytes_at(self, long byte_offset, long nbytes)
    cpdef clear(self)


cdef class UnifiedBuffer:
    cdef public object label
    cdef public long capacity
    cdef public long alignment
    cdef public object data
    cdef public object written
    cdef public long top
    cdef public long high
    cdef public list buffers

    @cython.locals(a=cython.long, size=cython.long, buf=UBBuffer)
    cpdef UBBuffer alloc(self, object name, long nbytes)
    @cython.locals(end=cython.long, first=cython.long, last=cython.long, head=cython.long,
                   tail=cython.long)
    cpdef mark(self, long start, long nbytes)
    @cython.locals(end=cython.long, lo=cython.long, hi=cython.long, off=cython.long,
                   head=cython.long, tail=cython.long, marks=bytes)
    cpdef long unwritten(self, long start, long nbytes) except? -2
