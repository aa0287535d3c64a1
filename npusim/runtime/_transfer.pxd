# C types for the compiled build of transfer.py (an "augmenting" .pxd: Cython compiles
# transfer.py as npusim.runtime._transfer with these declarations; the pure module ignores
# this file). A queued copy or put keeps its places and sizes as C longs, its cap and
# latencies as C doubles, and reaches its op, pipe and UB buffer as C types of the other
# builds (so it is adopted only with them: npusim.engine.compiled.REQUIRES).
import cython

# (under other names: the module imports the Python names of the same classes)
from npusim.hw._pipe cimport FixedPipe as CFixedPipe, Op as COp, TransferPipe as CTransferPipe
from npusim.hw._memory cimport Region as CRegion
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


# A kernel context's hot state and calls: the core's clock, its time limit and issue slot
# as C doubles, its counters as dicts, the buffers, pipes and ops it checks and makes as the
# other builds' C types. KernelContext (a Python class) derives from it and adds its own
# slots and a __dict__; a kernel program's read of a field here goes through a descriptor.
cdef class TransferPath:
    cdef public object env
    cdef public object machine
    cdef public object rank
    cdef public object core
    cdef public object ub
    cdef public object trace
    cdef public double t
    cdef public double t_limit
    cdef public double issue_ns
    cdef public object step
    cdef public object waiting
    cdef public dict counters
    cdef public dict transfers
    cdef public dict _sent_at
    cdef public object _atomic
    cdef public object _local
    cdef public object _burst
    cdef public object _mte2_cap
    cdef public object _mte2_latency

    @cython.locals(dur=cython.double, start=cython.double)
    cpdef scalar(self, object ops=*)
    @cython.locals(p=CFixedPipe, start=cython.double, end=cython.double, b=CUBBuffer, op=COp)
    cpdef fixed(self, object pipe, object name, object duration_ns, object reads=*,
                object writes=*, object fn=*, object issue_slots=*)
    @cython.locals(local=CUnifiedBuffer)
    cpdef _check_ub(self, CUBBuffer buf, object byte_offset, object nbytes, object what)
    cpdef _check_source(self, CUBBuffer src, object offset, object span, object strided,
                        object what)
    @cython.locals(at=cython.long, local=CUnifiedBuffer, first=cython.long, pitch=cython.long,
                   i=cython.long)
    cpdef _check_written(self, CUBBuffer buf, object byte_offset, object span, object strided,
                         object what)
    cpdef _check_gm(self, CRegion region, object offset, object nbytes, object what)
    cpdef _check_local(self, CUBBuffer buf, object what)
    cpdef tuple _issue_transfer(self, object nbytes, object strided, object name)
    cpdef _claim_landing(self, CUBBuffer dst, object span, object name)
    cpdef _count(self, CTransferPipe pipe, object name, object nbytes, object remote)
    cpdef _finish(self, CTransferPipe pipe, COp op, double t, object nbytes)
    @cython.locals(op=COp, pipe=CTransferPipe, copy=_Copy)
    cpdef copy_in(self, object dst, object src, object src_offset, object nbytes,
                  object dst_offset=*, object name=*, object strided=*)
    @cython.locals(op=COp, pipe=CTransferPipe, send=_Send)
    cpdef _send(self, object dst, object dst_offset, object src, object src_offset,
                object nbytes, object name, object route, object strided=*, object remote=*,
                object claim=*)
