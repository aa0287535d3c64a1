"""The simpy environment npusim runs on, counting the events it processes; and the garbage
collector pause its event loops run under."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from heapq import heappop, heappush

import simpy
from simpy.core import EmptySchedule, SimTime, StopSimulation
from simpy.events import NORMAL, PENDING, Event

from npusim.engine.compiled import adopt

INF = math.inf

# the compiled build (or this source loaded under another name, as the tests do) sifts the
# heap with its own code, comparing C fields; the pure module leaves it to heapq, in C,
# calling Entry.__lt__: a sift in Python would cost the pure path more
SIFT_HERE = __name__ != "npusim.engine.env"


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


class Entry:
    """One scheduled event with its key: its time, its priority and its id (simpy's
    order, simpy/core.py `schedule`, `heappush(self._queue, (now + delay, priority, eid,
    event))`), as fields; in the compiled build C fields compared directly, where simpy's
    tuples compare item by item through the float and int objects."""

    __slots__ = ("at", "priority", "eid", "event")

    at: float
    priority: int
    eid: int
    event: Event

    def __lt__(self, other: Entry) -> bool:  # before(self, other), for heapq
        return self.at < other.at or (self.at == other.at and (
            self.priority < other.priority or (
                self.priority == other.priority and self.eid < other.eid)))


def before(a: Entry, b: Entry) -> bool:
    """Whether a pops before b: (time, priority, id) in order, a total order (ids are
    unique), so any correct heap pops the same sequence as simpy's."""
    return a.at < b.at or (a.at == b.at and (a.priority < b.priority or (
        a.priority == b.priority and a.eid < b.eid)))


class EventQueue:
    """simpy's event queue (`Environment._queue`, `_eid`) as a binary heap of Entry, with
    the event ids counted here. `SimEnv.schedule` is this queue's `schedule`: every event
    simpy makes (a succeeded or failed Event, a Timeout, a process's Initialize) is pushed
    without a Python frame or a tuple in the compiled build."""

    __slots__ = ("env", "heap", "eid")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.heap: list[Entry] = []
        self.eid = 0

    def next_eid(self) -> int:
        """The next event id (an alarm takes one as a Timeout would)."""
        eid = self.eid
        self.eid = eid + 1
        return eid

    def schedule(self, event: Event, priority: int = NORMAL, delay: SimTime = 0) -> None:
        """simpy's Environment.schedule: `event` at now + `delay`, after those scheduled
        before it with the same time and priority."""
        entry = Entry.__new__(Entry)  # no __init__ call: the fields set here
        entry.at = self.env._now + delay
        entry.priority = priority
        entry.eid = self.eid
        self.eid += 1
        entry.event = event
        if SIFT_HERE:
            self.push(entry)
        else:
            heappush(self.heap, entry)  # push(), without its frame

    def push(self, entry: Entry) -> None:
        heap = self.heap
        if not SIFT_HERE:
            heappush(heap, entry)
            return
        pos = len(heap)
        heap.append(entry)
        while pos > 0:  # up from the new leaf while the parent pops later
            up = (pos - 1) >> 1
            parent = heap[up]
            if not before(entry, parent):
                break
            heap[pos] = parent
            pos = up
        heap[pos] = entry

    def pop(self) -> Entry:
        """The first entry, taken out (the heap must not be empty)."""
        heap = self.heap
        if not SIFT_HERE:
            return heappop(heap)
        last = heap.pop()
        n = len(heap)
        if n == 0:
            return last
        first = heap[0]
        pos = 0
        child = 1
        while child < n:  # down from the root, the earlier child up, until last fits
            right = child + 1
            if right < n and before(heap[right], heap[child]):
                child = right
            low = heap[child]
            if not before(low, last):
                break
            heap[pos] = low
            pos = child
            child = 2 * pos + 1
        heap[pos] = last
        return first

    def clear(self) -> None:
        """Drop every entry and its event's callbacks (SimEnv.close)."""
        for entry in self.heap:
            entry.event.callbacks = None
        self.heap.clear()


class SimEnv(simpy.Environment):
    """simpy.Environment in nanoseconds that counts processed events (for speed reports),
    with one alarm that can be moved.

    `step()` is simpy's own except for the alarm, and does not count; `advance()`, the loop
    a launch runs, counts its events into `events_processed`. The queue is an EventQueue
    (simpy's order; `schedule` is its method, so simpy's events land in it).

    The alarm is the flow network's timer. It fires exactly where a Timeout scheduled at
    the same moment would (same time, priority and place in simpy's order), but setting it
    again cancels the earlier setting: a Timeout that is superseded still has to be popped
    as an event that does nothing, and at W = 64 those were a third of all events."""

    def __init__(self) -> None:
        super().__init__(initial_time=0.0)
        del self._eid  # ids come from the queue
        self._queue = EventQueue(self)
        self.schedule = self._queue.schedule  # the queue's method itself: no frame here
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
        self._alarm_eid = self._queue.next_eid()
        self._alarm_fn = fn

    def _alarm_first(self) -> bool:
        at = self._alarm_at
        if at == INF:
            return False
        heap = self._queue.heap
        if not heap:
            return True
        e = heap[0]
        return at < e.at or (at == e.at and (e.priority > NORMAL or (
            e.priority == NORMAL and self._alarm_eid < e.eid)))

    def peek(self) -> SimTime:
        heap = self._queue.heap
        t = heap[0].at if heap else INF
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
        self._queue.clear()
        self._alarm_at = INF
        self._alarm_fn = None

    def step(self) -> None:
        """simpy's Environment.step (simpy/core.py) on this queue, the alarm first when it
        is due first."""
        if self._alarm_first():
            self._now = self._alarm_at
            fn = self._alarm_fn
            self._alarm_at = INF
            self._alarm_fn = None
            fn()
            return
        queue = self._queue
        if not queue.heap:
            raise EmptySchedule
        entry = queue.pop()
        self._now = entry.at
        event = entry.event
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation:
            # simpy's run(until): the callbacks not run yet stay, and the event comes
            # first when the run resumes
            event.callbacks = callbacks[callbacks.index(callback) + 1:]
            queue.schedule(event, -1)
            raise
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


def run_events(env: SimEnv, done: simpy.Event, limit_at: float, every: int,
               report: Callable[[float, int], None]) -> str:
    """SimEnv.advance's loop (a function, so the compiled core can type its locals)."""
    queue = env._queue
    heap = queue.heap
    steps = 0
    t = INF
    try:
        while done._value is PENDING:
            at = env._alarm_at
            if heap:  # peek() and _alarm_first(), inlined
                first = heap[0]
                t = first.at
                nxt = at if at < t else t
                alarm = at != INF and (at < t or (at == t and (first.priority > NORMAL or (
                    first.priority == NORMAL and env._alarm_eid < first.eid))))
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
                env._now = t
                entry = queue.pop() if SIFT_HERE else heappop(heap)
                event = entry.event
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
    adopt(globals(), "npusim.engine._env", ("Entry", "EventQueue", "run_events"))
