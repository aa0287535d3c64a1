# C types for the compiled build of pipe.py (an "augmenting" .pxd: Cython compiles pipe.py
# as npusim.hw._pipe with these declarations; the pure module ignores this file).
import cython


cdef class Op:
    cdef public str name
    cdef public str pipe
    cdef public double start_at
    cdef public object done_at
    cdef public object _event
    cdef public object env

    cpdef complete(self, double t)


cdef class FixedPipe:
    cdef public str name
    cdef public double free_at
    cdef public double busy_ns
    cdef public object last

    @cython.locals(start=cython.double, end=cython.double)
    cpdef tuple reserve(self, double earliest, double duration)


cdef class TransferPipe:
    cdef public str name
    cdef public object env
    cdef public object later
    cdef public object queue
    cdef public bint streaming
    cdef public long inflight
    cdef public object last
    cdef public double busy_ns
    cdef public double busy_union_ns
    cdef public long _flying
    cdef public double _busy_since
    cdef public bint fence_next
    cdef public dict open

    cpdef issue(self, Op op)
    @cython.locals(t=cython.double)
    cpdef began(self, Op op)
    cpdef landed(self, Op op, double t)
    @cython.locals(fenced=bint)
    cpdef submit(self, double earliest, object begin)
    cpdef sent(self)
    cpdef delivered(self, Op op=*)
    @cython.locals(earliest=cython.double, fenced=bint)
    cpdef _next(self)
    cpdef _start(self, double earliest, object begin)
