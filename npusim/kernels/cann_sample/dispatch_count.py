"""The CANN sample dispatch's counts and prefix sums: the cum-sum cores send each expert's
count to its rank (CalAndSendCnt), wait for every source's and form the prefix table
(WaitDispatch, GatherSumRecvCnt, GetCumSum, CalRecvAndSetFlag), and set
expert_token_nums (SetExpertTokenNums). Comments name the Ascend C steps."""

from __future__ import annotations

import numpy as np

from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.cumsum import clear_cum_sum_column
from npusim.kernels.common.split import split_to_core
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32, align256, ceil_div

ONE_F32 = np.float32(1.0)


def load_expert_ids(ctx: KernelContext, t: MoeTiling, name: str) -> Wait:
    """ExpIdsCopy: pad with -1 on V, then DataCopyPad the BS*K ids GM -> UB."""
    n = t.BS * t.K
    buf = ctx.alloc(name, align256(4 * n))
    count = align256(4 * n) // 4
    ctx.vector("dup_ids", count, np.int32, writes=[buf], fn=lambda: buf.view(np.int32).fill(-1))
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
    yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("expert_ids"), 0, 4 * n, name="copy_ids"))
    ids = ctx.ub_read(buf, np.int32, n, ops=0)  # SyncFunc<MTE2_S>
    return buf, ids


# --------------------------------------------------------------------------- counts
def cal_and_send_cnt(ctx: KernelContext, t: MoeTiling, state: int, m: int) -> Wait:
    """CalAndSendCnt: count the ids of each expert of my range, put (1.0, count) entries.

    With shared experts the range covers S_r + E status "experts" (ops-transformer V2
    SetStatus): index i < S_r is shared rank i, which gets count BS if this rank sends to
    it (i mod R == r mod R) and 0 otherwise, at its status entry of source r; index
    S_r + e is MoE expert e as in the sample."""
    ids_buf, ids = yield from load_expert_ids(ctx, t, "cs_expert_ids")
    n_sr = t.shape.S_r
    e0, e1 = split_to_core(n_sr + t.E, t.n_cumsum, m)
    entries = [ctx.alloc(f"status{e}", 32) for e in range(e0, e1)]
    n_entries = ceil_div(n_sr + t.E, 8) * 8  # Align8(S_r + E)

    def flags() -> None:
        for b in entries:
            b.view(np.float32).fill(0)
            b.view(np.float32)[0] = ONE_F32

    ctx.vector("dup_status", n_entries * 8, np.int32, writes=entries)
    ctx.vector("dup_flag", repeats=n_entries // 8, writes=entries, fn=flags)
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    n = t.BS * t.K
    for i, buf in zip(range(e0, e1), entries, strict=True):
        if i < n_sr:  # a shared rank: every token of mine, or none
            R = t.shape.R
            ctx.scalar(2)
            count = t.BS if i % R == ctx.rank_id % R else 0
            dst, le = i, 0
        else:
            e = i - n_sr
            for op in ("dup", "sub", "abs", "mins"):
                ctx.vector(op, n, np.int32, reads=[ids_buf])
            ctx.vector("reduce_sum", n, np.float32, reads=[ids_buf])
            yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
            count = int(np.count_nonzero(ids == e))
            dst, le = t.expert_rank(e), e % t.L
        ctx.ub_write(buf, 4, np.array([count], np.int32))
        off = t.window.dispatch_status_entry(state, le, ctx.rank_id)
        ctx.put(dst, off, buf, 32, name="put_status")
    yield from ctx.drain()


# --------------------------------------------------------------------------- prefix sums
def wait_and_prefix_sum(ctx: KernelContext, t: MoeTiling, state: int, m: int) -> Wait:
    """WaitDispatch + CalRecvAndSetFlag (+ SetExpertTokenNums on cum-sum core 0).

    A MoE rank has W*L status entries (local expert major); a shared rank has W, one per
    source rank, and a single expert_token_nums entry."""
    ctx.ub.reset()
    wl = t.status_count(ctx.rank_id)
    n_local = t.local_experts(ctx.rank_id)
    n_cs = t.n_cumsum
    s0, s1 = split_to_core(wl, n_cs, m)
    n_s = s1 - s0
    wait_buf = ctx.alloc("wait_status", align256(32 * max(n_s, 1)))
    handoff = ctx.alloc("partial_sums", 32 * n_cs)
    row_buf = ctx.alloc("prefix_slice", align32(4 * max(n_s, 1)))
    ones = ctx.alloc("ready_ones", 32 * ctx.num_cores)
    column = ctx.alloc("handoff_column", 32 * n_cs)
    all_status = ctx.alloc("all_status", 32 * wl)
    token_nums = ctx.alloc("expert_token_nums", align32(8 * n_local))
    counts = yield from wait_dispatch(ctx, t, state, s0, n_s, wait_buf)
    yield from gather_sum_recv_cnt(ctx, t, m, int(counts.sum()), max(n_s, 1), wait_buf, handoff)
    before = yield from get_cum_sum(ctx, t, m, column)
    yield from cal_recv_and_set_flag(ctx, t, m, s0, before, counts, row_buf, ones)
    if m == 0:
        yield from set_expert_token_nums(ctx, t, state, all_status, token_nums)
    yield from ctx.drain()


def wait_dispatch(
    ctx: KernelContext, t: MoeTiling, state: int, s0: int, n_s: int, wait_buf
) -> Wait:
    """WaitDispatch: poll my n_s statuses until every flag is 1.0 (ReduceSum of the flags
    == n_s), then clear the flags (word 0 of each entry), keep the counts and write back.
    Returns the counts."""
    win = ctx.window()
    status_base = t.window.dispatch_status_entry(state, 0, 0)
    check_ns = ctx.check_ns(max(1, ceil_div(n_s, 8)))
    if not n_s:
        return np.zeros(0, np.int64)
    yield from ctx.wait_until(
        win,
        status_base + 32 * s0,
        32 * n_s,
        SumEquals(np.float32, float(n_s), stride=32),
        wait_buf,
        name="wait_status",
        check_ns=check_ns,
    )
    counts = wait_buf.view(np.int32, 8 * n_s).reshape(n_s, 8)[:, 1].astype(np.int64)

    def clear_flags() -> None:
        wait_buf.view(np.int32, 8 * n_s).reshape(n_s, 8)[:, 0] = 0

    ctx.vector("clear_flags", repeats=n_s, writes=[wait_buf], fn=clear_flags)
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(
        ctx.copy_out(win, status_base + 32 * s0, wait_buf, 32 * n_s, name="clear_status")
    )
    return counts


def gather_sum_recv_cnt(
    ctx: KernelContext, t: MoeTiling, m: int, partial: int, repeats: int, wait_buf, handoff
) -> Wait:
    """GatherSumRecvCnt: my partial sum, sent to every cum-sum core (row m of the matrix)."""
    n_cs = t.n_cumsum
    ctx.vector("gather_counts", repeats=repeats, reads=[wait_buf])
    ctx.vector("sum_counts", repeats, np.float32)
    yield from ctx.pipe_barrier("vector")
    ctx.scalar(2)

    def fill_handoff() -> None:
        v = handoff.view(np.int32).reshape(n_cs, 8)
        v[:] = 0
        v[:, 0] = partial
        v[:, 1] = ONE_F32.view(np.int32)

    ctx.vector("dup_partial", n_cs * 8, np.int32, writes=[handoff], fn=fill_handoff)
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(
        ctx.window(), t.window.status.cumsum_cal(n_cs, m), handoff, 32 * n_cs, name="put_partial"
    )


def get_cum_sum(ctx: KernelContext, t: MoeTiling, m: int, column) -> Wait:
    """GetCumSum: poll column m (one entry from each cum-sum core) until every flag is 1.0,
    clear it; returns the partial sums of the cum-sum cores before m."""
    n_cs, win, status = t.n_cumsum, ctx.window(), t.window.status
    col = Strided(n_cs, 32, src_gap=(n_cs - 1) * 32)
    yield from ctx.wait_until(
        win,
        status.cumsum_cal(n_cs, 0, m),
        0,
        SumEquals(np.float32, float(n_cs), stride=32, offset=4),
        column,
        strided=col,
        name="wait_partials",
        check_ns=ctx.check_ns(max(1, ceil_div(n_cs, 8))),
    )
    cells = column.view(np.int32).reshape(n_cs, 8)
    before = int(cells[:m, 0].sum())
    ctx.vector("gather_prefix", repeats=max(m, 1), reads=[column])
    yield from ctx.pipe_barrier("vector")
    yield from clear_cum_sum_column(ctx, status, column, n_cs, m)
    return before


def cal_recv_and_set_flag(
    ctx: KernelContext,
    t: MoeTiling,
    m: int,
    s0: int,
    before: int,
    counts: np.ndarray,
    row_buf,
    ones,
) -> Wait:
    """CalRecvAndSetFlag: the inclusive prefix over index le*W + src for my slice (by the
    scalar unit) into ep_recv_count and every core's copy of the table, then every core's
    ready flag raised."""
    n_s, n_cs, wl = len(counts), t.n_cumsum, t.status_count(ctx.rank_id)
    prefix = (before + np.cumsum(counts)).astype(np.int32)
    if n_s:
        ctx.ub_write(row_buf, 0, prefix, ops=2 * n_s)
        ctx.copy_out(
            ctx.tensor("ep_recv_count"), 4 * s0, row_buf, 4 * n_s, name="write_ep_recv_count"
        )
        workspace = ctx.tensor("workspace")
        for c in range(ctx.num_cores):  # my slice into every core's copy of the table
            ctx.copy_out(workspace, 4 * (c * wl + s0), row_buf, 4 * n_s, name="write_workspace")
    ctx.vector(
        "dup_ready",
        ctx.num_cores * 8,
        np.int32,
        writes=[ones],
        fn=lambda: ones.view(np.int32).fill(1),
    )
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(
        ctx.window(),
        t.window.status.cumsum_flag(n_cs, 0, m),
        ones,
        0,
        strided=Strided(ctx.num_cores, 32, dst_gap=(n_cs - 1) * 32),
        name="set_ready",
    )


def set_expert_token_nums(
    ctx: KernelContext, t: MoeTiling, state: int, all_status, token_nums
) -> Wait:
    """SetExpertTokenNums (cum-sum core 0): re-read all statuses (flag + count) of this
    state, reduce over the sources, write int64 (cumsum or counts)."""
    n_local, wl = t.local_experts(ctx.rank_id), t.status_count(ctx.rank_id)
    status_base = t.window.dispatch_status_entry(state, 0, 0)
    yield from ctx.wait(
        ctx.copy_in(all_status, ctx.window(), status_base, 32 * wl, name="read_all_status")
    )
    per_le = all_status.view(np.int32).reshape(n_local, t.world, 8)[:, :, 1]
    nums = per_le.sum(axis=1).astype(np.int64)
    for _ in range(n_local):
        ctx.vector("reduce_sum", 2 * t.world, np.float32, reads=[all_status])
    yield from ctx.pipe_barrier("vector")
    if t.expert_token_nums_type == "cumsum":
        nums = np.cumsum(nums)
    ctx.ub_write(token_nums, 0, nums.astype(np.int64), ops=2 * n_local)
    ctx.copy_out(
        ctx.tensor("expert_token_nums"), 0, token_nums, 8 * n_local, name="write_expert_token_nums"
    )
