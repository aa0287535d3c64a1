"""The poll loop of a kernel context: a core polling GM until a condition holds.

Kernels poll flags and counts in round robin (``CheckDataArriveWithFlag``, WaitDispatch's
status reads, a scalar spin on a signal word); each poll costs its read and its check.
The loop is event driven: no event is spent per poll while the watched bytes do not
change (npusim.hw.memory watchers), and the winner is the first poll, in rotation order
and time, that would see its condition hold. :class:`PollLoop` holds these calls of
:class:`npusim.runtime.context.KernelContext`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.hw.memory import Region, Watcher
from npusim.hw.pipe import Op
from npusim.hw.ub import UBBuffer
from npusim.runtime.conditions import Condition, Wait
from npusim.runtime.transfer import Strided


@dataclass
class Poll:
    """One GM area a poll loop reads: contiguous `nbytes` or a strided read, a condition on
    the bytes read, the UB buffer they land in and the vector/scalar check cost (ns).

    `into` None: a scalar read that lands in no UB buffer (a spin); `read_ns`, if given,
    replaces the MTE2 read's cost (SHMEM's signal_wait_until: a dcci and a line fill)."""

    region: Region
    offset: int
    cond: Condition
    into: UBBuffer | None  # None: a scalar spin (the value lands in a register)
    nbytes: int = 0
    into_offset: int = 0
    strided: Strided | None = None
    check_ns: float = 0.0
    read_ns: float | None = None
    # another rank's symmetric window read through aclshmem_ptr (a SHMEM remote poll);
    # read_ns must then carry the remote read's cost
    remote: bool = False

    @property
    def span(self) -> int:
        return self.strided.src_span() if self.strided else self.nbytes

    def sample(self) -> np.ndarray:
        """The bytes a read would return now (gathered for a strided read)."""
        raw = self.region.read(self.offset, self.span)
        return self.strided.gather(raw) if self.strided else raw


class PollLoop:
    """A kernel context's polls (KernelContext mixes it in; no state of its own)."""

    __slots__ = ()

    def check_ns(self, repeats: int, instrs: int = 1, scalar: float = 2.0) -> float:
        """What a poll's check costs after its read (a Poll's or wait_until's check_ns):
        `instrs` vector instructions of `repeats` repeats in all (a ReduceSum, a
        GatherMask + CompareScalar), then `scalar` scalar ops (the compare, a scan)."""
        v = self.cfg.vector
        return ((instrs * v.issue_cycles + repeats * v.cycles_per_repeat) * self.cycle_ns
                + scalar * self.issue_ns)

    def wait_until(self, region: Region, offset: int, nbytes: int, cond: Condition,
                   into: UBBuffer, into_offset: int = 0, name: str = "poll",
                   strided: Strided | None = None, check_ns: float = 0.0) -> Wait:
        """Poll GM until `cond` holds: loop { copy GM -> UB; check } (event driven).

        The wait ends at the first poll whose read lands after the watched bytes satisfy
        `cond`; no event is spent per poll while nothing changes. The last polled bytes
        are left in `into`."""
        yield from self.poll_round_robin(
            [Poll(region, offset, cond, into, nbytes, into_offset, strided, check_ns)], 0, name)

    def spin_until(self, region: Region, offset: int, cond: Condition, nbytes: int = 4,
                   delay_cycles: float = 0.0, name: str = "spin") -> Generator[Any, Any, Any]:
        """A scalar spin on GM (ReadGmByPassDCache in a loop, `delay_cycles` between
        reads): event driven like wait_until, each read costing one slot + the GM read
        latency (`mte.gm_to_ub_latency_ns`) + the delay (none after the read that sees
        `cond` hold). Returns the bytes it saw."""
        delay = self._amount(delay_cycles, name, "delay_cycles") * self.cycle_ns
        yield from self.poll_round_robin([Poll(region, offset, cond, None, nbytes, 0, None,
                                               delay)], 0, name)
        self.t -= delay  # the loop leaves at the read that saw it, without the delay
        return self._polled

    def poll_round_robin(self, polls: list[Poll], start: int = 0, name: str = "poll",
                         observe: Callable[[int, float, np.ndarray], None] | None = None
                         ) -> Generator[Any, Any, int]:
        """Poll several GM areas in turn, starting at polls[start], until one satisfies its
        condition; return its index. Models the kernels' round-robin poll loops: each poll
        costs its read (latency + bytes / port) plus its check; the winner is the first
        poll, in rotation order and time, that sees its condition hold.

        observe(i, at, data), if given, hears of every content poll i will read: at the
        start and after each write into its area, with the time `at` of the first read that
        sees it (possibly after the winner's: the caller drops those)."""
        m = len(polls)
        if m == 0:
            raise self.error(f"{name}: nothing to poll")
        if self._whole(start, name, "start") >= m:
            raise self._refused(name, "start", start, f"a poll's index, 0 to {m - 1}")
        self._check_polls(polls, name)
        yield from self.sync()
        env = self.env
        tail = self.cfg.sync.poll_cycles * self.cycle_ns
        landing, cycle = self._poll_schedule(polls, start, tail)
        t0 = self.t

        def first_poll_after(i: int, t: float) -> float:
            q = math.ceil(max(0.0, t - t0 - landing[i]) / cycle - 1e-9)
            return t0 + landing[i] + q * cycle

        best: list[Any] = [math.inf, -1, 0]  # wake time, poll index, version
        woke = env.event()
        # fire -> on_change -> arm -> fire is a reference cycle; it goes through this
        # list, emptied when the wait ends, so the closures are freed without the collector
        handlers: list[Any] = []

        def arm(i: int, at: float) -> None:
            best[0], best[1] = at, i
            best[2] += 1
            version = best[2]
            env.timeout(max(0.0, at - env.now)).callbacks.append(
                lambda _e, v=version: handlers and handlers[0](v))

        def fire(version: int) -> None:
            if version != best[2] or woke.triggered:
                return
            i = best[1]
            sample = polls[i].sample()
            if polls[i].cond(sample):
                for w in watchers:
                    w.region.unwatch(w)
                woke.succeed((i, sample))
                return
            best[0], best[1] = math.inf, -1  # changed back meanwhile: look again
            for j in range(m):
                on_change(j)

        def on_change(i: int) -> None:
            if woke.triggered:
                return
            if observe is not None:
                observe(i, first_poll_after(i, env.now), polls[i].sample())
            if polls[i].cond(polls[i].sample()):
                at = first_poll_after(i, env.now)
                if at < best[0]:
                    arm(i, at)

        handlers.append(fire)
        watchers = []
        for i, p in enumerate(polls):
            w = Watcher(p.offset, p.span, lambda i=i: on_change(i))
            w.region = p.region
            p.region.watch(w)
            watchers.append(w)
        for i in range(m):
            on_change(i)
        self._poll, self._poll_name = polls[start], name
        yield from self._block(woke, f"{name} on the window of rank {self.rank_id}", name)
        handlers.clear()
        watchers.clear()
        self._poll = None
        i, data = woke.value
        self.t = max(self.t, env.now) + polls[i].check_ns + tail
        self._polled = data
        if polls[i].into is not None:
            self._land(polls[i], data, name)
        return i

    def _poll_schedule(self, polls: list[Poll], start: int, tail: float
                       ) -> tuple[list[float], float]:
        """One rotation from polls[start]: when each poll's first read lands (from now)
        and the rotation's length; a poll costs its issue, read, check and loop tail."""
        mte = self.cfg.mte
        m = len(polls)
        landing = [0.0] * m
        acc = 0.0
        for i in [(start + j) % m for j in range(m)]:
            p = polls[i]
            read = (p.read_ns if p.read_ns is not None
                    else mte.gm_to_ub_latency_ns + self._charged(p) / mte.gm_to_ub_gbps)
            landing[i] = acc + self.issue_ns + read
            acc += self.issue_ns + read + p.check_ns + tail
        return landing, acc

    def _land(self, p: Poll, data: np.ndarray, name: str) -> None:
        """The winning poll's bytes into its UB buffer, ready at the core's clock."""
        at = p.into.offset + p.into_offset
        if p.strided is None:
            self.ub.data[at:at + p.nbytes] = data
        else:
            p.strided.scatter(self.ub.data[at:at + p.strided.dst_span()], data)
        self._mark(at, p.strided.dst_span() if p.strided else p.nbytes, p.strided,
                   dst_side=True)
        p.into.write_ready = self.t
        p.into.writer = name

    def _charged(self, p: Poll) -> int:
        return p.strided.charged(self._burst) if p.strided else p.nbytes

    def wait_parts(self) -> tuple[str, str, int | None]:
        """What this core waits for, split for grouping many blocked cores: the part
        common to cores stopped at the same place in the program (pipe and instruction,
        poll name), the part about this core's bytes ('' if none) and their address."""
        why = self.waiting
        if why is None:
            return "no wait (computing or issuing)", "", None
        if isinstance(why, Op):
            return f"wait for {why.pipe} {why.name!r}", "", None
        poll = self._poll
        if poll is not None:
            return (f"{self._poll_name} on its own window",
                    f"{poll.span} B, {poll.cond.describe(poll.sample())}", poll.offset)
        return why, "", None

    def describe_wait(self) -> str:
        """What this core is blocked on, with the current value for a poll."""
        if self.waiting is None:
            return "not waiting"
        if isinstance(self.waiting, Op):
            return f"{self.waiting.pipe} {self.waiting.name!r} to complete"
        poll = self._poll
        if poll is not None:
            return (f"{self.waiting}: {poll.span} B at window offset 0x{poll.offset:x}, "
                    f"{poll.cond.describe(poll.sample())}")
        return self.waiting
