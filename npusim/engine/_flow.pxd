# C types for the compiled build of flow.py (an "augmenting" .pxd: Cython compiles flow.py
# as npusim.engine._flow with these declarations; the pure module ignores this file).
import cython

cdef bint TYPED


cdef class Resource:
    cdef public str name
    cdef public str kind
    cdef public object rank
    cdef public double bandwidth
    cdef public dict caps
    cdef public double cap_sum
    cdef public double level
    cdef public dict groups
    cdef public object bytes
    cdef public long nflows

    @cython.locals(left=cython.double, n=cython.long, cap=cython.double, cnt=cython.long)
    cpdef double _water_fill(self)
    @cython.locals(c=cython.long)
    cpdef add_cap(self, double cap, long delta)


cdef class Group:
    cdef public FlowNetwork net
    cdef public tuple path
    cdef public double cap
    cdef public double rate
    cdef public double clock
    cdef public double t_last
    cdef public list heap
    cdef public double wake_at
    cdef public long wake_seq
    cdef public double anchor_at
    cdef public long anchor_seq

    @cython.locals(rate=cython.double, r=Resource)
    cpdef double current_rate(self)
    cpdef settle(self, double now)
    @cython.locals(net=FlowNetwork, now=cython.double, r=Resource, f=Flow, done=list,
                   tag=cython.double)
    cpdef fire(self)


@cython.final
@cython.freelist(256)
cdef class Wake:
    cdef public double at
    cdef public long seq
    cdef public object item

    cpdef bint before(self, Wake other)


@cython.locals(w=Wake)
cdef Wake wake(double at, long seq, object item)


cdef class Flow:
    cdef public object size
    cdef public Group group
    cdef public double latency
    cdef public object on_done
    cdef public object on_sent
    cdef public object event
    cdef public double tag
    cdef public long seq

    cpdef bint before(self, Flow other)


cdef class FlowNetwork:
    cdef public object env
    cdef public long active
    cdef public long _seq
    cdef public dict _groups
    cdef public list _wakes
    cdef public long _compact_at
    cdef public long _timer_version
    cdef public double _timer_at
    cdef public object observer
    cdef public dict _pending
    cdef public list _joining
    cdef public dict _dirty
    cdef public long _batch
    cdef public list _calls
    cdef public bint _alarm
    cdef public object _tick_fn

    cpdef call_at(self, double t, object fn)
    @cython.locals(now=cython.double, cap=cython.double, f=Flow, r=Resource, g=Group)
    cpdef start(self, object size, object cap_gbps, tuple path, object latency_ns,
                object on_done, object on_sent=*, object event=*)
    @cython.locals(now=cython.double, old_levels=dict, r=Resource, g=Group, rerate=dict,
                   new=cython.double, old=cython.double, rate=cython.double, dirty=dict,
                   delta=cython.long, cap=cython.double)
    cpdef _flush(self)
    @cython.locals(wakes=list, seq=cython.long, first=cython.double, g=Group, h=list,
                   delay=cython.double, t=cython.double, lead=Flow)
    cpdef _arm_groups(self, double now)
    cpdef _reanchor(self, Group g)
    cpdef _compact(self)
    @cython.locals(delay=cython.double)
    cpdef _arm_timer(self, double t)
    @cython.locals(now=cython.double, wakes=list, calls=list, group=Group, nxt=cython.double,
                   seq=cython.long, w=Wake)
    cpdef _tick(self)
    @cython.locals(ev=object, g=Group)
    cpdef _finish(self, Flow f)
