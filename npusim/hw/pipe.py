"""A core's pipes: in-order instruction queues that run concurrently with each other.

Scalar and vector instructions have a cost known at issue (cycles from the config), so
they advance a pipe's clock without simulator events. MTE transfers last as long as the
shared resources on their path allow, so they are queued and started one after the
other as the previous one completes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import simpy

from npusim.engine.compiled import adopt

INF = math.inf


class Op:
    """Handle of an issued instruction: when it completes, and an event to wait on."""

    __slots__ = ("name", "pipe", "start_at", "done_at", "_event", "env")

    def __init__(self, env: simpy.Environment, name: str, pipe: str) -> None:
        self.env = env
        self.name = name
        self.pipe = pipe
        self.start_at = INF
        self.done_at: float | None = None
        self._event: simpy.Event | None = None

    def event(self) -> simpy.Event:
        """An event that fires when the op completes (made only when someone waits)."""
        if self._event is None:
            self._event = self.env.event()
        return self._event

    def complete(self, t: float) -> None:
        """Mark done. A transfer's event is the delivery event itself (already firing);
        only an op whose event was made separately needs to trigger it."""
        self.done_at = t
        ev = self._event
        if ev is not None and not ev.triggered:
            ev.succeed()


class FixedPipe:
    """A pipe whose instructions take a known time (scalar, vector)."""

    __slots__ = ("name", "free_at", "busy_ns", "last")

    def __init__(self, name: str) -> None:
        self.name = name
        self.free_at = 0.0
        self.busy_ns = 0.0
        self.last: Op | None = None

    def reserve(self, earliest: float, duration: float) -> tuple[float, float]:
        start = earliest if earliest > self.free_at else self.free_at
        end = start + duration
        self.free_at = end
        self.busy_ns += duration
        return start, end


class TransferPipe:
    """An MTE pipe: transfers stream out one after the other, in issue order; a transfer's
    flight latency overlaps the next one's streaming. A fence (PipeBarrier on this pipe)
    holds the next transfer until every earlier one has been delivered.

    Transfers are delivered in issue order only while their latencies are equal: a put
    to a near die issued after one to a far die lands first. So the last transfer issued
    is not the last to complete, and a barrier waits for every open one (`open`)."""

    __slots__ = ("name", "env", "queue", "streaming", "inflight", "last", "busy_ns",
                 "fence_next", "later", "open", "_flying", "_busy_since", "busy_union_ns")

    def __init__(self, env: simpy.Environment, name: str,
                 later: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        self.name = name
        self.env = env
        # later(t, fn): run fn at time t (the flow network's timer, which starts the
        # transfer anyway; a simpy timeout when the pipe stands alone)
        self.later = later or self._timeout_at
        # made when a transfer has to wait and dropped once drained: an idle pipe holds no
        # deque (a deque keeps a 64-slot block, 728 B; a W 768 dispatch has 73,728 pipes)
        self.queue: deque[tuple[float, Callable[[], None], bool]] | None = None
        self.streaming = False
        self.inflight = 0
        self.last: Op | None = None
        self.busy_ns = 0.0  # sum of transfer spans (their flight latencies overlap)
        # time with at least one transfer in flight (what a profiler's pipe ratio
        # measures), kept as the run goes, so a pipe's memory does not grow with the
        # transfers it carries (it kept every transfer's span, sorted at the end)
        self.busy_union_ns = 0.0
        self._flying = 0
        self._busy_since = 0.0
        self.fence_next = False
        self.open: dict[Op, None] = {}  # issued, not yet delivered, in issue order

    def issue(self, op: Op) -> None:
        """Note a transfer the core has issued (before submit)."""
        self.last = op
        self.open[op] = None

    def began(self, op: Op) -> None:
        """`op` starts streaming now."""
        t = self.env._now
        op.start_at = t
        if not self._flying:
            self._busy_since = t
        self._flying += 1

    def landed(self, op: Op, t: float) -> None:
        """`op` is delivered at t, the current time: deliveries come in time order, so a
        count of the transfers in flight gives the busy union."""
        self.busy_ns += t - op.start_at
        self._flying -= 1
        if not self._flying:
            self.busy_union_ns += t - self._busy_since

    def submit(self, earliest: float, begin: Callable[[], None]) -> None:
        """Run begin() at max(earliest, now) once the pipe is free (and fenced ones done)."""
        fenced = self.fence_next
        self.fence_next = False
        if self.streaming or self.queue or (fenced and self.inflight):
            if self.queue is None:
                self.queue = deque()
            self.queue.append((earliest, begin, fenced))
            return
        self._start(earliest, begin)  # free pipe, nothing ahead: no queueing

    def fence(self) -> None:
        self.fence_next = True

    def sent(self) -> None:
        """The streaming transfer's last byte has left: the next one may stream."""
        self.streaming = False
        if self.queue:
            self._next()

    def delivered(self, op: Op | None = None) -> None:
        if op is not None:
            del self.open[op]
        self.inflight -= 1
        if self.queue and self.queue[0][2]:
            self._next()

    def _next(self) -> None:
        if self.streaming or not self.queue:
            return
        earliest, begin, fenced = self.queue[0]
        if fenced and self.inflight:
            return
        self.queue.popleft()
        if not self.queue:
            self.queue = None
        self._start(earliest, begin)

    def _start(self, earliest: float, begin: Callable[[], None]) -> None:
        self.streaming = True
        self.inflight += 1
        if earliest > self.env._now:
            self.later(earliest, begin)
        else:
            begin()

    def _timeout_at(self, t: float, fn: Callable[[], None]) -> None:
        self.env.timeout(t - self.env.now).callbacks.append(lambda _e: fn())


if __name__ == "npusim.hw.pipe":  # this module, not its compiled build: use the build
    adopt(globals(), "npusim.hw._pipe", ("Op", "FixedPipe", "TransferPipe"))
