# C types for the compiled build of env.py (an "augmenting" .pxd: Cython compiles env.py
# as npusim.engine._env with these declarations; the pure module ignores this file).
import cython


@cython.locals(queue=list, steps=cython.long, at=cython.double, t=cython.double,
               nxt=cython.double, alarm=cython.bint, callbacks=list)
cpdef str run_events(object env, object done, double limit_at, long every, object report)
