"""moe_dispatch_kernel (the cann-recipes-infer article "NPU DeepSeek SHMEM通信优化实践";
tile-ai/tilelang-ascend examples/dispatch_combine/dispatch_combine_shmem.py main_dispatch) as a
per-core program of the MIX launch.

T.Kernel(ai_core_num, is_npu=True) as (cid, vid): block cid is one AIC and two AIVs,
cur_vid = vid + 2 * cid. The AIC scope only matches the AIV scope's three T.sync_all.
The AIV scope, step by step (the article's comments are the phase names):

- send (发数据, AlltoAllDispatch): Bs * K (token, k) pairs split over the aiv_num cores
  (send_token_num, remainder per vid). Per pair, cal_token_send_expert_cnt (fill, sub,
  abs, mins, reduce_sum over the earlier pairs' ids, a barrier_all between) gives the
  pair's repeat index among the sends to its expert; the x row is copied GM -> x_ub, the
  triple (rank, token, k) stored as int32 at element (H + 16) / 2, and
  T.shmem_ub_put_nbi puts ub_size elements to row (rank * Bs * L + le * Bs + repeat) of
  the destination's win_data.
- status (发状态, SetStatus): experts split over the cores the same way; per expert the
  count macro over all Bs * K ids, [flag 1 (int32), count] stored in win_status_ub;
  barrier_all, T.sync_all, then per expert an 8-word put to entry le * W + rank of the
  expert's rank.
- wait (等状态, WaitDispatch): the core's own entries [start, start + n) copied in and
  their flag words reduce-summed (reduce_sum_mask, mask 1) until the float sum equals
  reinterpret_float(n) (the int32 1 flags are float denormals); the entries cleared.
- prefix (SyncCntOnCore, GetCumSum): the core's row total (gathermask of the count words
  + sum) to workspace[cur_vid]; barrier_all, T.sync_all; workspace copied in, the totals
  of the cores before it summed (gathermask + sum): the core's first output row.
- copy (本地win区数据拷贝): per entry i (src = i % W, le = i / W), per received row: the
  row's H elements and its triple copied win_data -> UB, then to expand_x_out and
  expand_ids; ep_receive_count of the core's entries copied out.
- token_nums (UpdateTokenNumsOut): T.sync_all, then the last core derives
  expert_token_nums_out from ep_receive_count with scalar loads between dcci's.

main_dispatch runs one step per phase, each named after its Ascend C moe_distribute_dispatch
stage: alltoall_dispatch, set_status, wait_dispatch, get_cum_sum, local_window_copy,
update_token_nums.

Where the article elides code ("..."), the steps follow the public example; the docs page
(docs/kernels/tilelang_shmem.md) says which is which.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.split import split_share
from npusim.kernels.tilelang_shmem.lowering import (
    Wait,
    barrier_all,
    fill,
    sync_all,
    sync_func,
    tile_op,
    vector_check_ns,
)
from npusim.kernels.tilelang_shmem.tiling import (
    ASSIST,
    FLOAT_ALIGN,
    STATUS_BYTES,
    TRIPLE_BYTES,
    TileLangTiling,
    f32_bits,
)
from npusim.runtime.conditions import SumEquals
from npusim.runtime.context import KernelContext

I32, F32, I64 = np.int32, np.float32, np.int64
PHASES = ("send", "status", "wait", "prefix", "copy", "token_nums")


def dispatch_program(t: TileLangTiling):
    def program(ctx: KernelContext) -> Wait:
        if ctx.core.kind.name == "aic":  # with T.Scope("C")
            for _ in range(3):
                yield from sync_all(ctx)
            return
        yield from main_dispatch(ctx, t)

    return program


class Bufs:
    """The kernel's T.alloc_ub buffers (the ones the steps touch)."""

    def __init__(self, ctx: KernelContext, t: TileLangTiling) -> None:
        s, spc, n = t.shape, t.status_per_core, t.shape.BS * t.shape.K
        # the put reads ub_size elements from x_ub (more than its H + 22 when the row is
        # padded); on the device the bytes past x_ub belong to the next buffers
        self.x_ub = ctx.alloc("x_ub", max(2 * t.x_ub_elems, t.row_bytes))
        self.x_win_ub = ctx.alloc("x_win_ub", 2 * s.H)
        self.expert_ids_ub = ctx.alloc("expert_ids_ub", 4 * n)
        self.dst_expert_id_ub = ctx.alloc("dst_expert_id_ub", 4 * n)
        self.sub_ub = ctx.alloc("sub_ub", 4 * n)
        self.win_status_ub = ctx.alloc("win_status_ub", spc * STATUS_BYTES)
        self.status_sum_ub = ctx.alloc("status_sum_ub", spc * STATUS_BYTES)
        self.status_sum_out = ctx.alloc("status_sum_out", spc * STATUS_BYTES)
        self.gather_mask_out_ub = ctx.alloc("gather_mask_out_ub", 4 * spc)
        self.receive_count_ub = ctx.alloc("receive_count_max_ub", 4 * spc)
        self.sum_local_ub = ctx.alloc("sum_local_ub", t.aiv_num * STATUS_BYTES)
        self.sum_continue_ub = ctx.alloc("sum_continue_ub", 4 * t.aiv_num)
        self.win_status_ub_single = ctx.alloc("win_status_ub_single", STATUS_BYTES)
        self.status_sum_on_core_ub = ctx.alloc("status_sum_on_core_ub", STATUS_BYTES)
        self.recv_cnt_sum_out_ub = ctx.alloc("recv_cnt_sum_out_ub", STATUS_BYTES)
        self.status_local_data = ctx.alloc("status_local_data", TRIPLE_BYTES)
        self.state_reset_ub = ctx.alloc("state_reset_ub", spc * STATUS_BYTES)


def cal_token_send_expert_cnt(
    ctx: KernelContext, b: Bufs, dst_expert_id: int, cal_cnt: int
) -> Wait:
    """The macro: fill dst_expert_id_ub with the expert, sub the ids, abs, mins 1 and
    reduce_sum over the first cal_cnt ids, a barrier_all between; dst_expert_id_ub[0]
    holds how many of those ids differ from the expert."""
    ids = b.expert_ids_ub.view(I32, cal_cnt).copy()
    fill(ctx, b.dst_expert_id_ub, dst_expert_id, I32)
    yield from barrier_all(ctx)
    tile_op(ctx, "sub", cal_cnt, I32, (b.expert_ids_ub, b.dst_expert_id_ub), (b.sub_ub,))
    yield from barrier_all(ctx)
    tile_op(ctx, "abs", cal_cnt, F32, (b.sub_ub,), (b.dst_expert_id_ub,))
    tile_op(ctx, "mins", cal_cnt, I32, (b.dst_expert_id_ub,), (b.sub_ub,))
    yield from barrier_all(ctx)

    def differ() -> None:
        b.dst_expert_id_ub.view(I32, 1)[0] = int(np.count_nonzero(ids != dst_expert_id))

    tile_op(ctx, "reduce_sum", cal_cnt, F32, (b.sub_ub,), (b.dst_expert_id_ub,), differ)
    yield from barrier_all(ctx)


def main_dispatch(ctx: KernelContext, t: TileLangTiling) -> Wait:
    """The AIV scope: one step per phase of the article, in its order."""
    cur_vid = ctx.kind_index
    b = Bufs(ctx, t)
    ctx.scalar(8)  # cur_vid, the split's divisions and selects
    with ctx.phase("send"):
        yield from alltoall_dispatch(ctx, t, b)
    with ctx.phase("status"):
        start_expert, n = yield from set_status(ctx, t, b)
    # n is status_num_per_core: the entries this core waits for
    with ctx.phase("wait"):
        yield from wait_dispatch(ctx, t, b, start_expert, n)
    with ctx.phase("prefix"):
        counts, begin = yield from get_cum_sum(ctx, t, b, n)
    with ctx.phase("copy"):
        yield from local_window_copy(ctx, t, b, start_expert, counts, begin)
    with ctx.phase("token_nums"):
        yield from sync_all(ctx)
        last_core = min(t.total_expert_num, t.aiv_num) - 1
        if cur_vid == last_core:
            update_token_nums(ctx, t)


def alltoall_dispatch(ctx: KernelContext, t: TileLangTiling, b: Bufs) -> Wait:
    """发数据: each of the core's (token, k) pairs put, with its triple, to its expert's
    win_data row after the rows of the earlier pairs sent to that expert."""
    s = t.shape
    L, Bs, K = s.L, s.BS, s.K
    rank, win = ctx.rank_id, t.window
    start_send, send_num = split_share(Bs * K, t.aiv_num, ctx.kind_index)
    fill(ctx, b.state_reset_ub, 0.0, F32)
    fill(ctx, b.x_ub, 0.0, np.uint16)  # model only: the bytes the put reads past x_ub
    ctx.copy_in(b.expert_ids_ub, ctx.tensor("expert_ids"), 0, 4 * Bs * K)
    yield from sync_func(ctx, "mte2", "s")
    x = ctx.tensor("x")
    for cur in range(start_send, start_send + send_num):
        ctx.loop(1)
        expert = int(ctx.ub_read(b.expert_ids_ub, I32, 1, 4 * cur)[0])
        yield from cal_token_send_expert_cnt(ctx, b, expert, cur)
        differ = int(ctx.ub_read(b.dst_expert_id_ub, I32, 1)[0])
        repeat = 0 if cur == 0 else cur - differ
        ctx.scalar(4)  # repeat, dest_rank_id, dest_expert_id, token_in_topkid
        dest_rank, dest_expert = divmod(expert, L)
        if repeat >= Bs:
            raise ctx.error(
                f"expert {expert} gets more than Bs = {Bs} rows from rank "
                f"{rank}: win_data holds Bs rows per (source, expert); the "
                "seed's routing gives each token K distinct experts"
            )
        load = ctx.copy_in(b.x_ub, x, (cur // K) * s.token_bytes, s.token_bytes)
        yield from ctx.wait(load)  # sync_func mte2 -> v -> s
        ctx.ub_write(b.x_ub, t.triple_at, np.array([rank, cur // K, cur % K], I32), ops=3)
        ctx.shmem.put_ub(
            dest_rank,
            win.data_row(rank * Bs * L + dest_expert * Bs + repeat),
            b.x_ub,
            t.row_bytes,
            name="shmem_ub_put_nbi data",
        )


def set_status(ctx: KernelContext, t: TileLangTiling, b: Bufs) -> Wait:
    """发状态: per expert of the core, [flag 1, count] put to entry le * W + rank of the
    expert's rank once every core has sent its rows; returns (start_expert, expert_num)."""
    s = t.shape
    W, L, Bs, K = s.W, s.L, s.BS, s.K
    rank, win = ctx.rank_id, t.window
    start_expert, expert_num = split_share(t.total_expert_num, t.aiv_num, ctx.kind_index)
    for cur_expert in range(start_expert, start_expert + expert_num):
        ctx.loop(1)
        yield from cal_token_send_expert_cnt(ctx, b, cur_expert, Bs * K)
        count = Bs * K - int(ctx.ub_read(b.dst_expert_id_ub, I32, 1)[0])
        at = (cur_expert - start_expert) * STATUS_BYTES
        ctx.ub_write(b.win_status_ub, at, np.array([1, count, 0, 0, 0, 0, 0, 0], I32), ops=2)
    yield from barrier_all(ctx)
    yield from sync_all(ctx)  # every core has sent its rows
    yield from barrier_all(ctx)
    for cur_expert in range(start_expert, start_expert + expert_num):
        ctx.loop(1)
        dest_rank, local_expert = divmod(cur_expert, L)
        at = (cur_expert - start_expert) * STATUS_BYTES

        def move(at: int = at, single=b.win_status_ub_single) -> None:
            single.view(np.uint8, STATUS_BYTES)[:] = b.win_status_ub.view(
                np.uint8, STATUS_BYTES, at
            )

        tile_op(
            ctx,
            "copy ub->ub",
            FLOAT_ALIGN,
            F32,
            (b.win_status_ub,),
            (b.win_status_ub_single,),
            move,
        )
        yield from ctx.pipe_barrier("vector")
        ctx.shmem.put_ub(
            dest_rank,
            win.status_entry(local_expert * W + rank),
            b.win_status_ub_single,
            STATUS_BYTES,
            name="shmem_ub_put_nbi status",
        )
        yield from sync_func(ctx, "mte3", "s")
    return start_expert, expert_num


def wait_dispatch(
    ctx: KernelContext, t: TileLangTiling, b: Bufs, start_expert: int, n: int
) -> Wait:
    """等状态: poll the core's n status entries until every flag is set, then clear them."""
    if not n:
        return
    win = t.window
    target = f32_bits(n)  # aiv_expert_fp_num
    yield from ctx.wait_until(
        ctx.window(),
        win.status_entry(start_expert),
        n * STATUS_BYTES,
        SumEquals(F32, target, stride=STATUS_BYTES, offset=0),
        b.status_sum_ub,
        name="wait status",
        check_ns=vector_check_ns(ctx, n * FLOAT_ALIGN, F32),
    )
    yield from sync_func(ctx, "v", "mte3")
    ctx.copy_out(
        ctx.window(),
        win.status_entry(start_expert),
        b.state_reset_ub,
        n * STATUS_BYTES,
        name="clear status",
    )


def get_cum_sum(ctx: KernelContext, t: TileLangTiling, b: Bufs, n: int) -> Wait:
    """SyncCntOnCore + GetCumSum: the core's row total through workspace, then the totals
    of the cores before it summed; returns (the n counts, the core's first output row)."""
    cur_vid = ctx.kind_index
    counts = (
        [int(c) for c in b.status_sum_ub.view(I32, n * FLOAT_ALIGN)[1::FLOAT_ALIGN]] if n else []
    )
    tile_op(ctx, "gathermask", n, F32, (b.status_sum_ub,), (b.gather_mask_out_ub,))
    yield from ctx.pipe_barrier("vector")

    def total() -> None:
        b.status_sum_on_core_ub.view(I32, FLOAT_ALIGN)[:] = 0
        b.status_sum_on_core_ub.view(I32, 1)[0] = sum(counts)

    tile_op(ctx, "sum", n, F32, (b.gather_mask_out_ub,), (b.status_sum_on_core_ub,), total)
    yield from sync_func(ctx, "v", "mte3")
    workspace = ctx.tensor("workspace")
    ctx.copy_out(workspace, cur_vid * STATUS_BYTES, b.status_sum_on_core_ub, STATUS_BYTES)
    yield from barrier_all(ctx)
    yield from sync_all(ctx)
    ctx.copy_in(b.sum_local_ub, workspace, 0, t.aiv_num * STATUS_BYTES)
    yield from barrier_all(ctx)
    totals = b.sum_local_ub.view(I32, t.aiv_num * FLOAT_ALIGN)[::FLOAT_ALIGN]
    tile_op(ctx, "gathermask", cur_vid, I32, (b.sum_local_ub,), (b.sum_continue_ub,))
    yield from barrier_all(ctx)

    def prefix() -> None:
        b.recv_cnt_sum_out_ub.view(I32, FLOAT_ALIGN)[:] = 0
        b.recv_cnt_sum_out_ub.view(I32, 1)[0] = int(totals[:cur_vid].sum())

    tile_op(ctx, "sum", cur_vid, F32, (b.sum_continue_ub,), (b.recv_cnt_sum_out_ub,), prefix)
    yield from ctx.pipe_barrier("vector")
    begin = int(ctx.ub_read(b.recv_cnt_sum_out_ub, I32, 1)[0]) if cur_vid else 0
    return counts, begin


def local_window_copy(
    ctx: KernelContext, t: TileLangTiling, b: Bufs, start_expert: int, counts: list[int], begin: int
) -> Wait:
    """本地win区数据拷贝: each received row and its triple win_data -> UB -> expand_x_out
    and expand_ids from row begin on; the running ends to ep_receive_count."""
    s = t.shape
    W, L, Bs, H = s.W, s.L, s.BS, s.H
    win, n = t.window, len(counts)
    expand_x, expand_ids = ctx.tensor("expand_x_out"), ctx.tensor("expand_ids")
    ends = []
    for i in range(n):
        ctx.loop(1)
        count = counts[i]
        ctx.scalar(6)  # count, receive_count_max_ub[i], win_data_offset
        entry = start_expert + i
        first = (entry % W) * (Bs * L) + (entry // W) * Bs
        ends.append(begin + count)
        for j in range(count):
            ctx.loop(1)
            row = win.data_row(first + j)
            ctx.copy_in(b.x_win_ub, ctx.window(), row, 2 * H)
            ctx.copy_in(b.status_local_data, ctx.window(), row + t.triple_at, TRIPLE_BYTES)
            yield from sync_func(ctx, "mte2", "v")
            yield from barrier_all(ctx)
            ctx.copy_out(expand_ids, (begin + j) * 4 * ASSIST, b.status_local_data, TRIPLE_BYTES)
            ctx.copy_out(expand_x, (begin + j) * s.token_bytes, b.x_win_ub, s.token_bytes)
            yield from barrier_all(ctx)
        begin += count
    yield from barrier_all(ctx)
    if n:
        ctx.ub_write(b.receive_count_ub, 0, np.array(ends, I32), ops=n)
        ctx.copy_out(ctx.tensor("ep_receive_count"), 4 * start_expert, b.receive_count_ub, 4 * n)
    yield from ctx.pipe_barrier("mte3")


def update_token_nums(ctx: KernelContext, t: TileLangTiling) -> None:
    """expert_token_nums_out[le] = ep_receive_count[W (le + 1) - 1] - the previous one, as
    scalar loads and stores between DataCacheCleanAndInvalid of single lines."""
    W, L = t.shape.W, t.shape.L
    dc = ctx.dcache
    recv, nums = ctx.tensor("ep_receive_count"), ctx.tensor("expert_token_nums_out")
    dc.dcci_line(recv, 0)
    prev = int(ctx.gm_read_scalar(recv, 4 * (W - 1), I32))
    ctx.gm_write_scalar(nums, 0, prev, I64)
    dc.dcci_line(nums, 0)
    for le in range(1, L):
        ctx.loop(1)
        dc.dcci_line(recv, 4 * (W * le - 1))
        dc.dcci_line(recv, 4 * (W * le + W - 1))
        pre = int(ctx.gm_read_scalar(recv, 4 * (W * le - 1), I32))
        cur = int(ctx.gm_read_scalar(recv, 4 * (W * le + W - 1), I32))
        ctx.scalar(1)
        ctx.gm_write_scalar(nums, 8 * le, cur - pre, I64)
        dc.dcci_line(nums, 8 * le)
