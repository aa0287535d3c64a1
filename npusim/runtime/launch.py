"""Launching a kernel on every core of every rank, and telling a hang from a finish.

The simulator runs until every core's program has returned. If the event queue empties
first, no core can ever make progress: that is a deadlock, reported with the waiting
cores grouped by what they wait for (every one of them in the error's list), never a
hang. A simulated-time limit stops runaway loops, also one that only advances its core's
own clock (KernelContext.t_limit), and a wall-clock limit one that charges nothing. An
exception a program raises, or a value it yields that is not an event, is a KernelError
naming the core and the program's line (npusim.runtime.fault).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from simpy.events import PENDING

from npusim import progress
from npusim.engine.env import collector_paused
from npusim.errors import (
    BlockedError,
    DeadlockError,
    KernelError,
    NpusimError,
    SimTimeLimitError,
    WallClockLimitError,
)
from npusim.hw.cores import kind as core_kind
from npusim.hw.machine import Barrier, Machine
from npusim.runtime import userguard
from npusim.runtime.blocked import Unfinished, summarise
from npusim.runtime.context import KernelContext
from npusim.runtime.crosscore import FlagBoard
from npusim.runtime.fault import PastTimeLimit, bad_yield, raised, raised_at, where_in
from npusim.runtime.userguard import WallClockLimit

Program = Callable[[KernelContext], Generator[Any, Any, None]]


@dataclass
class LaunchResult:
    start_ns: float
    end_ns: float
    core_end_ns: list[list[float]]  # [rank][core]
    contexts: list[list[KernelContext]]


def launch(machine: Machine, program: Program, start_ns: float | None = None,
           time_limit_ns: float = 1e9, cores: int | None = None,
           kind: str | None = None, launch_ns: float | None = None,
           wall_limit_s: float | None = None, free_local: bool = False) -> LaunchResult:
    """Run `program` on `cores` cores (default all) of one kind (default the machine's
    first) of every rank, from `start_ns`, after `launch_ns` (default: kernel.launch_ns);
    stop after `wall_limit_s` seconds of wall time (default: no limit, or the session
    around it), or at Ctrl-C. `free_local`: each core's local buffers (UB, L1, ...) give
    their memory back as its program ends, for a caller that never reads them after
    (a scenario's run; kept by default for a test or notebook that looks at them)."""
    try:
        with userguard.session(wall_limit_s):
            return _launch(machine, program, start_ns, time_limit_ns, cores, kind,
                           launch_ns, wall_limit_s, free_local)
    finally:  # no core runs now: a program closed from here on is freed, not faulty
        machine.env._active_proc = None


def _launch(machine: Machine, program: Program, start_ns: float | None,
            time_limit_ns: float, cores: int | None, kind: str | None,
            launch_ns: float | None, wall_limit_s: float | None, free_local: bool
            ) -> LaunchResult:
    env = machine.env
    t0 = env.now if start_ns is None else start_ns
    limit_at = t0 + time_limit_ns
    first = t0 + (machine.cfg.kernel.launch_ns if launch_ns is None else launch_ns)
    stagger = machine.cfg.kernel.block_stagger_ns
    kind = kind or machine.kinds[0].name
    mix = core_kind(kind).parts
    per_block = sum(count for _, count in mix) if mix else 1
    have = len(machine.ranks[0].cores_of[kind]) // per_block
    n = cores if cores is not None else have
    if not 1 <= n <= have:
        unit = "blocks" if mix else f"{kind} cores"
        raise KernelError(f"a launch on {n} {unit} per rank; allowed: 1 to {have}, the "
                          f"{unit} a rank has")
    contexts: list[list[KernelContext]] = []
    ends = [[0.0] * (n * per_block) for _ in machine.ranks]
    procs = []
    for rank in machine.ranks:
        rank.window.new_call()
        row = _mix_row(machine, rank, mix, n, first, stagger) if mix else []
        for c in range(n if not mix else 0):
            for buf in rank.cores_of[kind][c].buffers.values():
                buf.reset(new_call=True)
            ctx = KernelContext(machine, rank, c, first + c * stagger, kind)
            ctx.num_cores = n
            row.append(ctx)
        kinds: dict[str, list[int]] = {}
        for ctx in row:
            kinds.setdefault(ctx.core.kind.name, []).append(ctx.core_id)
        board = FlagBoard(env, kinds)
        for ctx in row:
            ctx.flags = board
            ctx.t_limit = limit_at
            procs.append(env.process(_run(ctx, program, ends, free_local)))
        rank.barrier.parties = len(row)
        rank.barriers = {"all": Barrier(env, len(row), machine.cfg.sync.syncall_ns),
                         **{k: Barrier(env, len(rows), machine.cfg.sync.syncall_ns)
                            for k, rows in kinds.items()}}
        contexts.append(row)
    done = env.all_of(procs)
    report, every = progress.tick, progress.TICK_MASK  # a look at the clock now and then
    running = dict(zip(procs, (ctx for row in contexts for ctx in row), strict=True))
    hit: list[Any] = [None]  # the process running when the limit or Ctrl-C came

    def stop(exc: BaseException) -> None:
        """End the event loop at once, whichever core the stop was raised into."""
        hit[0] = env.active_process
        if done._value is PENDING:
            done._ok, done._value, done._defused = False, exc, True

    try:
        with collector_paused(), userguard.span(stop):
            stopped = env.advance(done, limit_at, every, report)
        if stopped == "done" and not done.ok:  # a core's program failed, or a stop
            raise done.value
    except WallClockLimit as exc:  # which core ran, then every unfinished one
        raise _stopped(WallClockLimitError, contexts, procs,
                       str(_wall_error(env, wall_limit_s, running.get(hit[0]), exc)),
                       "still running") from exc
    except PastTimeLimit as exc:  # a core that never yielded: the run stops at the limit
        raise _stopped(SimTimeLimitError, contexts, procs,
                       f"simulated-time limit of {time_limit_ns / 1000:.1f} us reached ({exc})",
                       "still running") from None
    except (NpusimError, MemoryError):
        raise
    except (Exception, SystemExit) as exc:  # simpy's, around a program: what it yielded
        ctx = running.get(env.active_process)
        if ctx is None:
            raise
        what = _yielded(exc)
        if what is None:
            raise raised(ctx, exc) from exc
        raise bad_yield(ctx, getattr(env.active_process, "_generator", None), what) from exc
    if stopped == "idle":
        raise _stopped(DeadlockError, contexts, procs,
                       f"deadlock at {env.now / 1000:.3f} us: no core can make progress",
                       "blocked")
    if stopped == "limit":
        raise _stopped(SimTimeLimitError, contexts, procs,
                       f"simulated-time limit of {time_limit_ns / 1000:.1f} us reached",
                       "still running")
    end = max(max(r) for r in ends)
    return LaunchResult(t0, end, ends, contexts)


def _mix_row(machine: Machine, rank: Any, parts: tuple, blocks: int, first: float,
             stagger: float) -> list[KernelContext]:
    """A MIX launch's contexts on one rank, block by block (aic b, aiv 2b, aiv 2b+1):
    every core knows its block, its sub-block and the block's other cores. The cores of
    one block start together, block b `stagger` ns after block b - 1."""
    row: list[KernelContext] = []
    for b in range(blocks):
        block = []
        for part, count in parts:
            for j in range(count):
                index = b * count + j
                if index >= len(rank.cores_of[part.name]):
                    raise KernelError(f"a MIX launch of {blocks} blocks needs {blocks * count} "
                                      f"{part.name} cores; the rank has "
                                      f"{len(rank.cores_of[part.name])}")
                for buf in rank.cores_of[part.name][index].buffers.values():
                    buf.reset(new_call=True)
                ctx = KernelContext(machine, rank, index, first + b * stagger, part.name)
                ctx.core_id = len(row)
                ctx.core_label = f"{ctx.core_id} ({part.name} {index})"
                ctx.block_idx, ctx.sub_block_idx, ctx.kind_index = b, j, index
                ctx.block_num, ctx.num_cores = blocks, blocks * count
                ctx.block = block
                block.append(ctx)
                row.append(ctx)
    return row


def _run(ctx: KernelContext, program: Program, ends: list[list[float]], free_local: bool
         ) -> Generator[Any, Any, None]:
    me = ctx.env.active_process  # this core's process: its first step runs here
    try:
        yield from program(ctx)
        yield from ctx.drain()
        if free_local:  # a core ends long before the run at large EP: 0.5 GiB at W 768
            for buf in ctx.core.buffers.values():
                buf.release()
    except KernelError as exc:
        raise exc.located(ctx.rank_id, ctx.core_label, ctx.step) from None
    except (NpusimError, MemoryError):  # npusim's own reports
        raise
    except BaseException as exc:  # noqa: BLE001 - the program's own fault: a kernel error
        if isinstance(exc, GeneratorExit) and ctx.env.active_process is not me:
            raise  # the generator closed as it is freed, not one the program raised
        stop = userguard.stopping(exc)  # the wall-clock limit or the user's Ctrl-C
        if stop is not None:
            raise stop from None if stop is exc else exc
        raise raised(ctx, exc) from exc
    ends[ctx.rank_id][ctx.core_id] = ctx.t


def _wall_error(env: Any, limit_s: float | None, ctx: KernelContext | None,
                exc: BaseException) -> KernelError:
    """The error for the wall-clock limit: the core that was running and where its program
    was (none: the limit came between two cores' steps)."""
    head = (f"wall-clock limit of {limit_s:g} s (run.wall_time_limit_s) reached "
            f"at simulated time {env.now / 1000:.3f} us")
    if ctx is None:
        return KernelError(f"{head}, no core running")
    return ctx.error(f"{head} while the core ran without yielding (a loop that never "
                     f"waits?){where_in(raised_at(exc.__cause__ or exc))}")


_BAD_YIELD = 'Invalid yield value "'  # simpy's RuntimeError for a yield of a non-event


def _yielded(exc: BaseException) -> str | None:
    """What a program yielded, if exc is simpy's refusal of it."""
    text = str(exc)
    at = text.find(_BAD_YIELD)
    if not isinstance(exc, RuntimeError) or at < 0:
        return None
    return text[at + len(_BAD_YIELD):].rstrip('"')[:80]



def _stopped(kind: type[BlockedError], contexts: list[list[KernelContext]], procs: list,
             head: str, state: str) -> BlockedError:
    """The error for a run stopped with cores unfinished: a short summary, and one line
    per unfinished core for blocked.txt (one stopped in a charge past the limit: with
    where its program was; the one the wall-clock limit stopped too)."""
    flat = [ctx for row in contexts for ctx in row]
    left, lines = [], []
    for ctx, proc in zip(flat, procs, strict=True):
        past = proc._value if not proc.is_alive and not proc._ok else None
        if proc.is_alive or isinstance(past, PastTimeLimit | WallClockLimit):
            u = Unfinished.of(ctx)
            left.append(u)
            lines.append(u.line + (f"; {past}{past.where}"
                                   if isinstance(past, PastTimeLimit) else ""))
    ranks = len({u.rank for u in left})
    summary = (f"{head}; {len(left)} of {len(flat)} cores {state} on "
               f"{ranks} of {len(contexts)} ranks: {summarise(left)}")
    return kind(summary, lines)
