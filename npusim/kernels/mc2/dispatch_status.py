"""The dispatch's status steps: SetStatus (each core's counts to their receivers) and
WaitDispatch (poll, clear, A3's SyncCntOnCore, SyncAll)."""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2.dispatch_send import _cal_token_send_expert_cnt
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32, ceil_div

F32, I32 = np.float32, np.int32
ONE = np.float32(1.0)


class SumAtLeast(SumEquals):
    """At least `value` flags set: the poll that first sees a new arrival."""

    def __call__(self, data: np.ndarray) -> bool:
        return self.total(data) >= self.value - self.tolerance


def set_status(ctx: KernelContext, t: Mc2Tiling, state: int, id_info) -> Wait:
    """SetStatus: count per status expert of my share, SyncAll, one 32 B put each."""
    ids_buf, ids, active = id_info
    rank = ctx.rank_id
    S_r, E = t.shape.S_r, t.shape.E
    total = S_r + E
    e0, e1 = split_to_core(total, t.cores, ctx.core_id)
    n_pairs = ids.size
    nbuf = max(1, e1 - e0)
    status = ctx.alloc("status", align32(32 * nbuf))
    counts = []
    for i in range(e0, e1):
        if i < S_r:
            R = t.shape.R
            ctx.scalar(2)
            counts.append(active if i % R == rank % R else 0)
        else:
            yield from _cal_token_send_expert_cnt(ctx, ids_buf, n_pairs)
            counts.append(int(np.count_nonzero(ids == i - S_r)))

    def fill() -> None:
        v = status.view(I32).reshape(-1, 8)
        v[:] = 0
        v[:, 0] = ONE.view(I32)
        v[: len(counts), 1] = counts

    ctx.vector("dup_status", 8 * nbuf, I32, writes=[status], fn=fill)
    ctx.scalar(len(counts))
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    yield from ctx.sync_all()
    win = t.window
    for j, i in enumerate(range(e0, e1)):
        if i < S_r:
            dst, entry = i, rank
        else:
            e = i - S_r
            dst, entry = t.expert_rank(e), (e % t.L) * t.W + rank
        win.put(ctx, dst, win.dispatch_status(state, entry), status, 32, src_offset=32 * j,
                name="put_status")
    yield from ctx.pipe_barrier("mte3")


def wait_dispatch(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """WaitDispatch: poll my entries' flags, clear them, (A3) SyncCntOnCore, SyncAll.
    Returns the counts of my entries (None for a core without entries)."""
    s0, s1 = split_to_core(t.status_count(ctx.rank_id), t.cores, ctx.core_id)
    n = s1 - s0
    if n <= 0:
        yield from ctx.sync_all()
        return None
    win = ctx.window()
    base = t.window.dispatch_status(state, s0)
    wait_buf = ctx.alloc("wait_status", max(32 * n, 256))
    compact = t.arch == "arch35"  # the 950 reads only the 4 B flags
    flags = ctx.alloc("flags", align32(4 * n)) if compact else wait_buf
    perf = yield from _wait_status_flags(ctx, t, base, s0, n, wait_buf, flags)
    if compact:
        yield from ctx.wait(ctx.copy_in(wait_buf, win, base, 32 * n, name="reread_status"))
    if t.performance_info:  # AtomicMax into performance_info: per-core rows, core 0 reduces
        pbuf = ctx.alloc("perf", align32(8 * t.W))
        ctx.ub_write(pbuf, 0, perf, ops=1)
        yield from ctx.wait(
            ctx.copy_out(
                ctx.tensor("performance_info_cores"),
                8 * t.W * ctx.core_id,
                pbuf,
                8 * t.W,
                name="write_performance_info",
            )
        )
    counts = yield from wait_dispatch_clear_status(ctx, win, base, wait_buf, n)
    if t.arch == "arch22":
        yield from sync_cnt_on_core(ctx, t, wait_buf, n, int(counts.sum()))
    yield from ctx.sync_all()
    return counts


def _wait_status_flags(
    ctx: KernelContext, t: Mc2Tiling, base: int, s0: int, n: int, wait_buf, flags
) -> Wait:
    """The poll of my n entries' flags (the 950: only their 4 B flags, into `flags`), with
    PerformanceInfoPerRank: per source rank the first sighting of its flag, in whole us.
    Returns those times (zeros without performance_info)."""
    win = ctx.window()
    compact = t.arch == "arch35"
    per_entry = 4 * ctx.issue_ns * n if t.performance_info else 0.0  # PerformanceInfoPerRank
    # the reduce, then the compare and PerformanceInfoPerRank's writes
    check = ctx.check_ns(ceil_div(n, 64) if compact else n, scalar=0) + (
        2 * ctx.issue_ns + per_entry
    )
    t_start = ctx.t
    perf = np.zeros(t.W, np.int64)
    seen = np.zeros(n, bool)
    # without performance_info one wait for all flags; with it, one per newly seen flag, so
    # each entry's first sighting is timed (the operator's loop reads them all each time)
    targets = range(1, n + 1) if t.performance_info else (n,)
    for target in targets:
        if target <= seen.sum():
            continue
        cond = SumAtLeast(F32, float(target), stride=0 if compact else 32)
        if compact:
            yield from ctx.wait_until(
                win,
                base,
                0,
                cond,
                flags,
                strided=Strided(n, 4, src_gap=28),
                name="wait_status",
                check_ns=check,
            )
        else:
            yield from ctx.wait_until(
                win, base, 32 * n, cond, wait_buf, name="wait_status", check_ns=check
            )
        if t.performance_info:
            f = flags.view(F32, n) if compact else wait_buf.view(F32, 8 * n)[::8]
            new = (f > 0.5) & ~seen
            us = int((ctx.t - t_start) // 1000)  # GetSystemCycle() / CYCLES_PER_US
            for i in np.flatnonzero(new):
                src = (s0 + int(i)) % t.W
                perf[src] = max(perf[src], us)
            seen |= new
    return perf


def sync_cnt_on_core(ctx: KernelContext, t: Mc2Tiling, wait_buf, n: int, total: int) -> Wait:
    """SyncCntOnCore (A3): my counts' sum into every reader's workspace column."""
    C = t.cores
    ctx.vector("gather_counts", repeats=n, reads=[wait_buf])
    ctx.vector("sum_counts", n, F32)
    yield from ctx.pipe_barrier("vector")
    ctx.scalar(2)
    readers = min(t.W * t.L, C)
    sums = ctx.alloc("sum_core", 32 * C)

    def dup() -> None:
        sums.view(I32).reshape(C, 8)[:, 0] = total

    ctx.vector("dup_sum", 8 * readers, I32, writes=[sums], fn=dup)
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(
        ctx.tensor("workspace"),
        512 * C * ctx.core_id,
        sums,
        0,
        strided=Strided(readers, 32, dst_gap=480),
        name="write_workspace",
    )
    yield from ctx.drain()


def wait_dispatch_clear_status(ctx: KernelContext, win, base: int, wait_buf, n: int) -> Wait:
    """WaitDispatchClearStatus: the n entries' counts, then their flags zeroed and written
    back (Duplicate, one copy)."""
    counts = wait_buf.view(I32, 8 * n).reshape(n, 8)[:, 1].astype(np.int64).copy()

    def clear() -> None:
        wait_buf.view(I32, 8 * n).reshape(n, 8)[:, 0] = 0

    ctx.vector("clear_flags", repeats=ceil_div(n, 8), writes=[wait_buf], fn=clear)
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(ctx.copy_out(win, base, wait_buf, 32 * n, name="clear_status"))
    return counts
