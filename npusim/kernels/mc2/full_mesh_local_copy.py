"""LocalWindowCopy of the full-mesh dispatch: every core drains its share of the status
indices' rows, as their block flags arrive, into the outputs."""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.drain import drain_round_robin, valid_expert_info
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.dispatch_local_copy import RowOutputs
from npusim.kernels.mc2.full_mesh_count import run_pos_record
from npusim.kernels.mc2.full_mesh_send import packed_offset
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.mc2.window import SPLIT_BLOCK_DATA_SIZE, SPLIT_BLOCK_SIZE
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32

F32, I32 = np.float32, np.int32
FLAG_DATA = SPLIT_BLOCK_DATA_SIZE  # a block's flag follows its 480 B of data


def local_window_copy(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """LocalWindowCopy: WaitCumSumFlag, SetValidExpertInfo (my share of the W * L indices,
    the 950's core 0 also writes expert_token_nums), WaitAndFormatOutput."""
    ctx.ub.reset()  # tpipe_->Reset()
    rank = ctx.rank_id
    n_cs = tl.count_cores(t, rank)
    wl = t.status_count(rank)
    rscv_align = align32(4 * wl)
    ctx.alloc("scalar", 32)
    ready = ctx.alloc("status_wait", 32 * n_cs)
    cum_buf = ctx.alloc("cumsum", rscv_align)
    zero = ctx.alloc("status_clean", 32 * n_cs)
    i0, i1 = split_to_core(wl, t.cores, ctx.core_id)
    yield from wait_cum_sum_flag(ctx, t, n_cs, ready, zero)
    if i1 <= i0:
        return
    slot = t.window.dispatch
    exp_info = align32(4 * (i1 - i0))
    for name in ("expert_map", "expert_finish", "expert_left"):
        ctx.alloc(name, exp_info)
    ctx.alloc("flag_mask", 64)
    clean = ctx.alloc("clean_up", slot.blocks * 32)
    tbuf_bytes = (
        tl.FULL_MESH_MAX_UB_SIZE
        - (32 + rscv_align + 2 * n_cs * 32)
        - 3 * exp_info
        - 64
        - slot.blocks * 32
    )
    tbuf = ctx.alloc("tokens", tbuf_bytes)
    valid = yield from set_valid_expert_info(ctx, t, cum_buf, i0, i1)
    if not valid:
        return
    max_tokens = tbuf_bytes // slot.slot
    yield from wait_and_format_output(ctx, t, state, valid, clean, tbuf, max_tokens)
    run_pos_record(ctx, t, 4)
    yield from ctx.drain()


def wait_cum_sum_flag(ctx: KernelContext, t: Mc2Tiling, n_cs: int, ready, zero) -> Wait:
    """WaitCumSumFlag: the count cores' soft flags for this core, then cleared."""
    win = ctx.window()
    flag_off = t.window.status.cumsum_flag(n_cs, ctx.core_id)
    yield from ctx.wait_until(
        win,
        flag_off,
        32 * n_cs,
        SumEquals(I32, 8.0 * n_cs),
        ready,
        name="wait_cumsum_flag",
        check_ns=ctx.check_ns(n_cs),
    )
    run_pos_record(ctx, t, 3)
    ctx.vector("dup_zero", 8 * n_cs, F32, writes=[zero])
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(win, flag_off, zero, 32 * n_cs, name="clear_cumsum_flag")


def set_valid_expert_info(ctx: KernelContext, t: Mc2Tiling, cum_buf, i0: int, i1: int) -> Wait:
    """SetValidExpertInfo: my copy of the prefix table; per index of mine with rows its
    (index, first output row, finished, left)."""
    core, wl = ctx.core_id, t.status_count(ctx.rank_id)
    yield from ctx.wait(
        ctx.copy_in(cum_buf, ctx.tensor("workspace"), 4 * core * wl, 4 * wl, name="read_prefix")
    )
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    cum = ctx.ub_read(cum_buf, I32, wl, ops=0).astype(np.int64)
    if t.arch == "arch35" and core == 0:
        _token_nums_from_prefix(ctx, t, cum)
    ctx.scalar(4 * (i1 - i0))
    return valid_expert_info(cum, i0, i1)


def wait_and_format_output(
    ctx: KernelContext, t: Mc2Tiling, state: int, valid: list, clean, tbuf, max_tokens: int
) -> Wait:
    """WaitAndFormatOutput: round robin over my indices with rows left, each probe reading
    the block flags of up to maxCopyTokenCnt rows (CheckDataArriveWithFlag); arrived rows
    are copied out (CopyInAndOut) and, once an index is drained, its block flags zeroed
    (ClearLocalWindowDataFlags), one strided copy per row."""
    rank, win, slot = ctx.rank_id, ctx.window(), t.window.dispatch
    ctx.vector(
        "dup_clean", slot.blocks * 8, F32, writes=[clean], fn=lambda: clean.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(1)
    outs = _Outputs(ctx, t)

    def block_of(idx: int) -> int:
        return _recv_block(t, state, idx, rank)

    def copy_rows(src: int, row: int, n: int) -> Wait:
        yield from outs.copy_in_and_out(ctx, src, tbuf, row, n)

    def after(block: int, finish: int, drained: bool) -> Wait:
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
        if drained:  # zero every block flag of the index, one copy per row
            for i in range(finish):
                ctx.copy_out(
                    win,
                    block + i * slot.slot + FLAG_DATA,
                    clean,
                    0,
                    strided=Strided(slot.blocks, 32, dst_gap=SPLIT_BLOCK_SIZE - 32),
                    name="clean_block_flags",
                )

    yield from drain_round_robin(
        ctx, valid, max_tokens, block_of, slot.slot, slot.blocks, tbuf, copy_rows, after
    )


def _recv_block(t: Mc2Tiling, state: int, idx: int, rank: int) -> int:
    """The window block of status index idx = local * W + src: src * L + local, on the 950
    ((src + me) % W) * L + local; src on a shared rank."""
    if t.is_shared_rank(rank):
        return t.window.dispatch_block(state, idx)
    local, src = divmod(idx, t.W)
    if t.arch == "arch35":
        src = (src + rank) % t.W
    return t.window.dispatch_block(state, src * t.L + local)


def _token_nums_from_prefix(ctx: KernelContext, t: Mc2Tiling, cum: np.ndarray) -> None:
    """The 950's expert_token_nums (SetValidExpertInfo, core 0): each local expert's last
    prefix entry, less the one before for counts (type 1)."""
    le, W = t.local_experts(ctx.rank_id), t.W
    ends = cum.reshape(le, W)[:, -1]
    nums = ends if t.expert_token_nums_type == 0 else np.diff(ends, prepend=0)
    buf = ctx.alloc("token_nums", align32(8 * t.L))
    ctx.ub_write(buf, 0, nums.astype(np.int64), ops=3 * le)
    ctx.copy_out(ctx.tensor("expert_token_nums"), 0, buf, 8 * le, name="write_expert_token_nums")


class _Outputs(RowOutputs):
    """The output tensors CopyInAndOut writes."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling) -> None:
        super().__init__(ctx, t)
        self.t = t

    def copy_in_and_out(self, ctx: KernelContext, src: int, tbuf, row: int, n: int) -> Wait:
        """CopyInAndOut: n rows window -> UB without their flags (480 B pieces), then the
        scales, the rows and the triplets out by strided copies; the expert scales from the
        window directly."""
        slot = self.t.window.dispatch
        win = ctx.window()
        stride = slot.blocks * SPLIT_BLOCK_DATA_SIZE
        yield from ctx.wait(
            ctx.copy_in(
                tbuf,
                win,
                src,
                0,
                name="copy_tokens",
                strided=Strided(slot.blocks * n, SPLIT_BLOCK_DATA_SIZE, src_gap=32),
            )
        )
        ops = self.write(ctx, slot, tbuf, row, n, stride, scales_first=True)
        if self.es is not None:
            yield from self.expert_scales(ctx, ops, src + packed_offset(slot.expert_scale_offset),
                                          tbuf, row, n, slot.slot)
