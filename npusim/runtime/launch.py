"""Launching a kernel on every core of every rank, and telling a hang from a finish.

The simulator runs until every core's program has returned. If the event queue empties
first, no core can ever make progress: that is a deadlock, reported with the waiting
cores grouped by what they wait for (every one of them in the error's list), never a
hang. A simulated-time limit stops runaway loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from npusim import progress
from npusim.engine.env import collector_paused
from npusim.errors import BlockedError, DeadlockError, KernelError, SimTimeLimitError
from npusim.hw.machine import Machine
from npusim.runtime.blocked import Unfinished, summarise
from npusim.runtime.context import KernelContext

Program = Callable[[KernelContext], Generator[Any, Any, None]]


@dataclass
class LaunchResult:
    start_ns: float
    end_ns: float
    core_end_ns: list[list[float]]  # [rank][core]
    contexts: list[list[KernelContext]]


def launch(machine: Machine, program: Program, start_ns: float | None = None,
           time_limit_ns: float = 1e9, cores: int | None = None,
           kind: str | None = None, launch_ns: float | None = None) -> LaunchResult:
    """Run `program` on `cores` cores (default all) of one kind (default the machine's
    first) of every rank, from `start_ns`, after `launch_ns` (default: kernel.launch_ns)."""
    env = machine.env
    t0 = env.now if start_ns is None else start_ns
    first = t0 + (machine.cfg.kernel.launch_ns if launch_ns is None else launch_ns)
    kind = kind or machine.kinds[0].name
    n = cores if cores is not None else len(machine.ranks[0].cores_of[kind])
    contexts: list[list[KernelContext]] = []
    ends = [[0.0] * n for _ in machine.ranks]
    procs = []
    for rank in machine.ranks:
        rank.window.new_call()
        row = []
        for c in range(n):
            for buf in rank.cores_of[kind][c].buffers.values():
                buf.reset(new_call=True)
            ctx = KernelContext(machine, rank, c, first, kind)
            ctx.num_cores = n
            row.append(ctx)
            procs.append(env.process(_run(ctx, program, ends)))
        rank.barrier.parties = n
        contexts.append(row)
    done = env.all_of(procs)
    limit_at = t0 + time_limit_ns
    step = env.step
    peek = env.peek
    steps = 0
    report, every = progress.tick, progress.TICK_MASK  # a look at the clock now and then
    try:
        with collector_paused():
            while not done.triggered:
                nxt = peek()
                if nxt == math.inf:
                    raise _stopped(DeadlockError, contexts, procs,
                                   f"deadlock at {env.now / 1000:.3f} us: no core can make "
                                   "progress", "blocked")
                if nxt > limit_at:
                    raise _stopped(SimTimeLimitError, contexts, procs,
                                   f"simulated-time limit of {time_limit_ns / 1000:.1f} us "
                                   "reached", "still running")
                step()
                steps += 1
                if not steps & every:
                    report(env.now, env.events_processed + steps)
    finally:
        env.events_processed += steps
    if not done.ok:
        raise done.value
    end = max(max(r) for r in ends)
    return LaunchResult(t0, end, ends, contexts)


def _run(ctx: KernelContext, program: Program, ends: list[list[float]]
         ) -> Generator[Any, Any, None]:
    try:
        yield from program(ctx)
        yield from ctx.drain()
    except KernelError as exc:
        raise exc.located(ctx.rank_id, ctx.core_id, ctx.step) from None
    ends[ctx.rank_id][ctx.core_id] = ctx.t


def _stopped(kind: type[BlockedError], contexts: list[list[KernelContext]], procs: list,
             head: str, state: str) -> BlockedError:
    """The error for a run stopped with cores unfinished: a short summary, and one line
    per unfinished core for blocked.txt."""
    flat = [ctx for row in contexts for ctx in row]
    left = [Unfinished.of(ctx) for ctx, proc in zip(flat, procs, strict=True) if proc.is_alive]
    ranks = len({u.rank for u in left})
    summary = (f"{head}; {len(left)} of {len(flat)} cores {state} on "
               f"{ranks} of {len(contexts)} ranks: {summarise(left)}")
    return kind(summary, [u.line for u in left])
