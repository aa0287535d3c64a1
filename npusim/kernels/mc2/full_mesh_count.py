"""The count cores of the full-mesh dispatch (CalCumSum): the counts sent by expert
(A3) or by rank (950), WaitDispatch, CalRecvAndSetFlag (the prefix table handed to the
copying cores through the workspace and a soft flag)."""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.cumsum import clear_cum_sum_column
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.dispatch_local_copy import set_expert_token_nums
from npusim.kernels.mc2.dispatch_send import _cal_token_send_expert_cnt
from npusim.kernels.mc2.dispatch_status import wait_dispatch_clear_status
from npusim.kernels.mc2.full_mesh_send import exp_ids_copy_and_mask_cal
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.mc2.window import STATE_OFFSET
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32, align_up, ceil_div

F32, I32 = np.float32, np.int32
ONE = np.float32(1.0)


def cal_cum_sum(ctx: KernelContext, t: Mc2Tiling, state: int, m: int) -> Wait:
    """CalCumSum on count core m: the counts out, my share of the status entries in, the
    prefix table to every core; A3's first count core SetExpertTokenNums."""
    with ctx.phase("set_status"):
        ids_buf, flat, tokens = yield from exp_ids_copy_and_mask_cal(ctx, t)
        if t.arch == "arch35":
            yield from cal_and_send_cnt_by_rank(ctx, t, state, m, ids_buf, flat, tokens.size)
        else:
            yield from cal_and_send_cnt_by_exp(ctx, t, state, m, ids_buf, flat, tokens.size)
    if t.arch == "arch22":
        ctx.ub.reset()  # tpipe_->Reset() before BufferInit
    with ctx.phase("wait_dispatch"):
        counts, s0 = yield from wait_dispatch(ctx, t, state, m)
        yield from cal_recv_and_set_flag(ctx, t, m, counts, s0)
    if t.arch == "arch22" and m == 0:
        with ctx.phase("token_nums"):
            yield from set_expert_token_nums(ctx, t, state)


def _status_buffer(ctx: KernelContext, t: Mc2Tiling, entries: int, split: bool = False):
    """statusTensor_: Align8(S_r + E) entries of (1.0, count) (two Duplicates). `split`: one
    32 B buffer per entry (npusim's UB hazards are per buffer; ByExp writes an entry while
    the put of the one before still reads the tensor)."""
    n = align_up(entries, 8)
    bufs = (
        [ctx.alloc(f"status{i}", 32) for i in range(n)] if split else [ctx.alloc("status", 32 * n)]
    )

    def flags() -> None:
        for b in bufs:
            v = b.view(I32).reshape(-1, 8)
            v[:] = 0
            v[:, 0] = ONE.view(I32)

    ctx.vector("dup_status", 8 * n, I32, writes=bufs)
    ctx.vector("dup_flag", repeats=n // 8, writes=bufs, fn=flags)
    return bufs


def _mask_cnt(t: Mc2Tiling, flat: np.ndarray, active: int) -> int:
    """maskCnt: activeBS * K with a 1-D mask, else BS * K ids to count over."""
    return active * t.K if t.x_active_mask == "1d" else flat.size


def _count(t: Mc2Tiling, rank: int, i: int, flat: np.ndarray, active: int) -> int:
    """Status "expert" i: shared rank i (activeBS if it is my replica) or MoE expert i - S_r."""
    S_r = t.shape.S_r
    if i < S_r:
        return active if i % t.shape.R == rank % t.shape.R else 0
    return int(np.count_nonzero(flat == i - S_r))


def cal_and_send_cnt_by_exp(
    ctx: KernelContext, t: Mc2Tiling, state: int, m: int, ids_buf, flat: np.ndarray, active: int
) -> Wait:
    """CalAndSendCntByExp (A3): my contiguous share of the S_r + E status experts, each a
    CalTokenSendExpertCnt over all ids and one 32 B put to its rank."""
    rank = ctx.rank_id
    total = t.shape.S_r + t.shape.E
    e0, e1 = split_to_core(total, tl.count_cores(t, rank), m)
    status = _status_buffer(ctx, t, e1 - e0, split=True)
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    for i in range(e0, e1):
        if i < t.shape.S_r:
            ctx.scalar(2)
        else:
            yield from _cal_token_send_expert_cnt(ctx, ids_buf, _mask_cnt(t, flat, active))
        buf = status[i - e0]
        ctx.ub_write(buf, 4, np.array([_count(t, rank, i, flat, active)], I32))
        if i < t.shape.S_r:
            dst, entry = i, rank
        else:
            e = i - t.shape.S_r
            dst, entry = t.expert_rank(e), (e % t.L) * t.W + rank
        ctx.put(dst, t.window.dispatch_status(state, entry), buf, 32, name="put_status")
    yield from ctx.drain()


def cal_and_send_cnt_by_rank(
    ctx: KernelContext, t: Mc2Tiling, state: int, m: int, ids_buf, flat: np.ndarray, active: int
) -> Wait:
    """CalAndSendCntByRank (950): destination ranks m, m + n_cs, ...; the L counts of a MoE
    rank (a CalTokenSendExpertCnt each) go in one strided put of L entries W apart."""
    rank = ctx.rank_id
    S_r, L, W = t.shape.S_r, t.L, t.W
    n_cs = tl.count_cores(t, rank)
    status = _status_buffer(ctx, t, S_r + t.shape.E)[0]
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    dsts = list(range(m, W, n_cs))
    for d in dsts:
        items = [d] if d < S_r else range(S_r + (d - S_r) * L, S_r + (d - S_r + 1) * L)
        for i in items:
            if i >= S_r:
                yield from _cal_token_send_expert_cnt(ctx, ids_buf, _mask_cnt(t, flat, active))
            else:
                ctx.scalar(2)
            ctx.ub_write(status, 32 * i + 4, np.array([_count(t, rank, i, flat, active)], I32))
    for d in dsts:
        base = t.window.dispatch_status(state, rank)
        if d < S_r:
            ctx.put(d, base, status, 32, src_offset=32 * d, name="put_status")
        else:
            first = S_r + (d - S_r) * L
            ctx.put(
                d,
                base,
                status,
                0,
                src_offset=32 * first,
                name="put_status",
                strided=Strided(L, 32, dst_gap=(W - 1) * 32),
            )
    yield from ctx.drain()


def run_pos_record(ctx: KernelContext, t: Mc2Tiling, pos: int) -> None:
    """RunPosRecord: a 4 B DFX write after the core's state word."""
    buf = ctx.alloc(f"run_pos{pos}", 32)
    ctx.ub_write(buf, 0, np.array([pos], np.uint32))
    ctx.copy_out(
        ctx.window(), t.window.dispatch_state_word(ctx.core_id) + 4, buf, 4, name="run_pos"
    )


def wait_dispatch(ctx: KernelContext, t: Mc2Tiling, state: int, m: int) -> Wait:
    """WaitDispatch: poll my share of the status entries until every flag is 1.0, clear the
    flags (WaitDispatchClearStatus), GatherSumRecvCnt: my counts' sum, written n_cs times
    (with a 1.0 each) into row m of the partial sums at 868 KiB."""
    rank = ctx.rank_id
    n_cs = tl.count_cores(t, rank)
    s0, s1 = split_to_core(t.status_count(rank), n_cs, m)
    n = s1 - s0
    win = ctx.window()
    base = t.window.dispatch_status(state, s0)
    wait_buf = ctx.alloc("wait_status", align_up(32 * n, 256))
    yield from ctx.wait_until(
        win,
        base,
        32 * n,
        SumEquals(F32, float(n), stride=32),
        wait_buf,
        name="wait_status",
        check_ns=ctx.check_ns(n),
    )
    run_pos_record(ctx, t, 2)
    counts = yield from wait_dispatch_clear_status(ctx, win, base, wait_buf, n)
    ctx.vector("gather_counts", repeats=n, reads=[wait_buf])
    yield from ctx.pipe_barrier("vector")
    ctx.vector("sum_counts", align32(4 * n) // 4, F32)
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(1)
    total = int(counts.sum())
    sums = ctx.alloc("sum_core", 32 * t.cores)

    def dup() -> None:
        v = sums.view(I32).reshape(t.cores, 8)
        v[:, 0] = total  # the sum's bits (the kernel sums int counts as fp32 denormals)
        v[:, 1] = ONE.view(I32)

    ctx.vector("dup_sum", repeats=ceil_div(n_cs, 8), writes=[sums])
    ctx.vector("dup_flag", repeats=ceil_div(n_cs, 8), writes=[sums], fn=dup)
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
    ctx.copy_out(
        win, t.window.status.cumsum_cal(n_cs, m), sums, n_cs * STATE_OFFSET, name="put_partial"
    )
    return counts, s0


def cal_recv_and_set_flag(
    ctx: KernelContext, t: Mc2Tiling, m: int, counts: np.ndarray, s0: int
) -> Wait:
    """CalRecvAndSetFlag: GetCumSum, my slice of ep_recv_count, copied into every core's
    row of the workspace, then my ready flag into every core's row at 876 KiB."""
    rank = ctx.rank_id
    n_cs = tl.count_cores(t, rank)
    C = t.cores
    wl = t.status_count(rank)
    win = ctx.window()
    status = t.window.status
    before = yield from get_cum_sum(ctx, t, m)
    n = counts.size
    prefix = ctx.alloc("prefix", max(align32(4 * n), align32(4 * wl)))
    ctx.ub_write(prefix, 0, (before + np.cumsum(counts)).astype(I32), ops=2 * n)
    ctx.copy_out(ctx.tensor("ep_recv_count"), 4 * s0, prefix, 4 * n, name="write_ep_recv_count")
    ws = ctx.tensor("workspace")
    for c in range(C):  # "copy aivNum_ times": my slice into every core's prefix table
        ctx.copy_out(ws, 4 * (c * wl + s0), prefix, 4 * n, name="write_workspace")
    ones = ctx.alloc("sync_on_core", 32 * C)
    ctx.vector(
        "dup_ready", repeats=ceil_div(C, 8), writes=[ones], fn=lambda: ones.view(I32).fill(1)
    )
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
    yield from ctx.pipe_barrier("mte3")  # PipeBarrier<PIPE_MTE3>: the table before the flag
    ctx.copy_out(
        win,
        status.cumsum_flag(n_cs, 0, m),
        ones,
        0,
        strided=Strided(C, 32, dst_gap=(n_cs - 1) * 32),
        name="set_cumsum_flag",
    )
    yield from ctx.drain()


def get_cum_sum(ctx: KernelContext, t: Mc2Tiling, m: int) -> Wait:
    """GetCumSum: poll column m of the partial sums until every count core's 1.0 is in,
    sum the earlier ones, clear the column. Returns that sum."""
    n_cs, C = tl.count_cores(t, ctx.rank_id), t.cores
    win, status = ctx.window(), t.window.status
    col = ctx.alloc("sum_local", 32 * C)
    gather = ctx.alloc("sum_continue", align32(4 * C))
    yield from ctx.wait_until(
        win,
        status.cumsum_cal(n_cs, 0, m),
        0,
        SumEquals(F32, float(n_cs), stride=32, offset=4),
        col,
        strided=Strided(n_cs, 32, src_gap=(n_cs - 1) * 32),
        name="wait_partials",
        check_ns=ctx.check_ns(n_cs),
    )
    cells = col.view(I32, 8 * n_cs).reshape(n_cs, 8)
    before = int(cells[:m, 0].sum())
    if m:
        ctx.vector("gather_sums", repeats=m, reads=[col], writes=[gather])
        yield from ctx.pipe_barrier("vector")
        ctx.vector("sum_sums", align32(4 * m) // 4, F32, reads=[gather])
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(1)
    yield from clear_cum_sum_column(ctx, status, col, n_cs, m)
    return before
