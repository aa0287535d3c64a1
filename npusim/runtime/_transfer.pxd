# C types for the compiled build of transfer.py (an "augmenting" .pxd: Cython compiles
# transfer.py as npusim.runtime._transfer with these declarations; the pure module ignores
# this file). A queued copy or put keeps its places and sizes as C longs, its cap and
# latencies as C doubles, and reaches its op, pipe and UB buffer as C types of the other
# builds (so it is adopted only with them: npusim.engine.compiled.REQUIRES).
import cython

# (under other names: the module imports the Python names of the same classes)
from npusim.hw._pipe cimport Op as COp, TransferPipe as CTransferPipe
from npusim.hw._ub cimport UBBuffer as CUBBuffer, UnifiedBuffer as CUnifiedBuffer


cdef class _Send:
    cdef public object ctx
    cdef public COp op
    cdef public CTransferPipe pipe
    cdef public object atomic
    cdef public object strided
    cdef public CUBBuffer src
    cdef public long src_offset
    cdef public long src_span
    cdef public object dst
    cdef public long dst_offset
    cdef public long dst_span
    cdef public long nbytes
    cdef public object path
    cdef public double cap
    cdef public double latency
    cdef public double ack

    cpdef done(self, double t)
    cpdef retire(self)


cdef class _Copy:
    cdef public object ctx
    cdef public COp op
    cdef public CTransferPipe pipe
    cdef public object strided
    cdef public object src
    cdef public long src_offset
    cdef public long src_span
    cdef public CUBBuffer dst
    cdef public long dst_offset
    cdef public long dst_span
    cdef public long nbytes
    cdef public long moved
    cdef public object path
    cdef public double cap
    cdef public double latency

    @cython.locals(local=CUnifiedBuffer, at=cython.long, nbytes=cython.long)
    cpdef done(self, double t)
