# C types for the compiled build of env.py (an "augmenting" .pxd: Cython compiles env.py
# as npusim.engine._env with these declarations; the pure module ignores this file).
import cython

cdef bint SIFT_HERE


@cython.final
@cython.freelist(1024)
cdef class Entry:
    cdef public double at
    cdef public long priority
    cdef public long eid
    cdef public object event


cdef bint before(Entry a, Entry b)


@cython.final
cdef class EventQueue:
    cdef public object env
    cdef public list heap
    cdef public long eid

    cpdef long next_eid(self)
    @cython.locals(entry=Entry)
    cpdef schedule(self, object event, long priority=*, double delay=*)
    @cython.locals(heap=list, pos=Py_ssize_t, up=Py_ssize_t, parent=Entry)
    cpdef push(self, Entry entry)
    @cython.locals(heap=list, last=Entry, first=Entry, low=Entry, n=Py_ssize_t,
                   pos=Py_ssize_t, child=Py_ssize_t, right=Py_ssize_t)
    cpdef Entry pop(self)
    @cython.locals(entry=Entry)
    cpdef clear(self)


@cython.locals(queue=EventQueue, heap=list, first=Entry, entry=Entry, steps=cython.long, at=cython.double,
               t=cython.double, nxt=cython.double, alarm=cython.bint, callbacks=list)
cpdef str run_events(object env, object done, double limit_at, long every, object report)
