"""The simpy environment npusim runs on, counting the events it processes; and the garbage
collector pause its event loops run under."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from heapq import heappop

import simpy
from simpy.core import SimTime
from simpy.events import NORMAL, PENDING

from npusim.engine.compiled import adopt

INF = math.inf


class Pending(simpy.Event):
    """simpy's Event, with every attribute it gets when it fires set at creation.

    simpy sets `_ok` and `_value` only when an Event is triggered, and adding attributes
    an instance did not have gives it a dictionary of its own: 240 B more per event (168
    B in all instead of 392) and a dictionary built on the hot path. A transfer's delivery
    is such an event, and a W 768 dispatch has hundreds of thousands in flight at once."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.callbacks = []
        self._value = PENDING
        self._ok = False  # read only once the event has fired


class SimEnv(simpy.Environment):
    """simpy.Environment in nanoseconds that counts processed events (for speed reports),
    with one alarm that can be moved.

    `step()` is simpy's own except for the alarm, and does not count; `advance()`, the loop
    a launch runs, counts its events into `events_processed`.

    The alarm is the flow network's timer. It fires exactly where a Timeout scheduled at
    the same moment would (same time, priority and place in simpy's order), but setting it
    again cancels the earlier setting: a Timeout that is superseded still has to be popped
    as an event that does nothing, and at W = 64 those were a third of all events."""

    def __init__(self) -> None:
        super().__init__(initial_time=0.0)
        self.events_processed = 0
        self._alarm_at = INF
        self._alarm_eid = 0
        self._alarm_fn: Callable[[], None] | None = None

    def event(self) -> Pending:
        return Pending(self)

    def alarm(self, delay: float, fn: Callable[[], None]) -> None:
        """Run fn() `delay` ns from now, in the order a Timeout(delay) made now would run;
        replaces the alarm set before, if it has not fired."""
        self._alarm_at = self._now + delay
        self._alarm_eid = next(self._eid)
        self._alarm_fn = fn

    def _alarm_first(self) -> bool:
        at = self._alarm_at
        if at == INF:
            return False
        q = self._queue
        if not q:
            return True
        t, prio, eid, _ = q[0]
        return at < t or (at == t and (prio > NORMAL or (prio == NORMAL and self._alarm_eid < eid)))

    def peek(self) -> SimTime:
        t = super().peek()
        return self._alarm_at if self._alarm_at < t else t

    def advance(self, done: simpy.Event, limit_at: float, every: int,
                report: Callable[[float, int], None]) -> str:
        """Process events until `done` has fired ("done"), none is left ("idle") or the
        next lies past `limit_at` ("limit"); report(now, events) after every `every` + 1
        events (`every` a mask: 2^k - 1), and add the events to `events_processed`.

        The loop a launch runs: peek, then step, with this environment's alarm and
        simpy's Environment.step inlined (the same order and the same failure of an
        event nobody defused, without three calls per event): `run_events`."""
        return run_events(self, done, limit_at, every, report)

    def close(self) -> None:
        """Drop the events left in the queue (a launch stops at the event it waits for) and
        their callbacks, and the alarm: they point back here through the processes and the
        flow network, cycles that only a full collection would free."""
        for entry in self._queue:
            entry[3].callbacks = None
        self._queue.clear()
        self._alarm_at = INF
        self._alarm_fn = None

    def step(self) -> None:
        if self._alarm_first():
            self._now = self._alarm_at
            fn = self._alarm_fn
            self._alarm_at = INF
            self._alarm_fn = None
            fn()
            return
        super().step()


def run_events(env: SimEnv, done: simpy.Event, limit_at: float, every: int,
               report: Callable[[float, int], None]) -> str:
    """SimEnv.advance's loop (a function, so the compiled core can type its locals)."""
    queue = env._queue
    pop = heappop
    steps = 0
    try:
        while done._value is PENDING:
            at = env._alarm_at
            if queue:  # peek() and _alarm_first(), inlined
                t, prio, eid, event = queue[0]
                nxt = at if at < t else t
                alarm = at != INF and (at < t or (at == t and (prio > NORMAL or (
                    prio == NORMAL and env._alarm_eid < eid))))
            else:
                nxt = at
                alarm = True
            if nxt == INF:
                return "idle"
            if nxt > limit_at:
                return "limit"
            if alarm:
                env._now = at
                fn = env._alarm_fn
                env._alarm_at = INF
                env._alarm_fn = None
                fn()
            else:
                env._now, _, _, event = pop(queue)
                callbacks, event.callbacks = event.callbacks, None
                for callback in callbacks:
                    callback(event)
                if not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
            steps += 1
            if not steps & every:
                report(env._now, env.events_processed + steps)
        return "done"
    finally:
        env.events_processed += steps


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while an event loop runs.

    A simulation allocates millions of short-lived objects (events, heap entries, spans),
    and the collector's full passes walk every live one: at W = 64 they took half of the
    run time. Nothing in the loop relies on the collector (the engine and the runtime
    break the reference cycles they make), so reference counting frees the memory; the
    collector runs again afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


if __name__ == "npusim.engine.env":  # this module, not its compiled build: use the build
    adopt(globals(), "npusim.engine._env", ("run_events",))
