"""The CANN sample dispatch's LocalWindowCopy: every core waits for the prefix table
(WaitCumSumFlag) and copies the received rows of its blocks from the window to the
outputs as their flags arrive (WaitAndFormatOutput, CopyInAndOut). Comments name the
Ascend C steps."""

from __future__ import annotations

import numpy as np

from npusim.kernels.cann_sample.layout import (
    SPLIT_BLOCK_BYTES,
    SPLIT_BLOCK_DATA,
    UB_USABLE_FOR_LOCAL_COPY,
)
from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.drain import drain_round_robin, valid_expert_info
from npusim.kernels.common.split import split_to_core
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import KiB, align32

UB_BUDGET_NON_QUANT = 190 * KiB  # MAX_UB_SIZE of the non-quantised local copy
UB_HEADROOM = 16 * KiB  # 256 KiB UB - the sample's 240 KiB budget


def local_window_copy(ctx: KernelContext, t: MoeTiling, state: int) -> Wait:
    """Wait for the prefix table, then drain my status indices' tokens into the outputs."""
    ctx.ub.reset()
    n_cs = t.n_cumsum
    wl = t.status_count(ctx.rank_id)
    ready = ctx.alloc("ready", 32 * n_cs)
    cum_buf = ctx.alloc("cumsum", align32(4 * wl))
    zero = ctx.alloc("ready_clear", 32 * n_cs)
    yield from wait_cum_sum_flag(ctx, t, ready, zero)
    i0, i1 = split_to_core(wl, ctx.num_cores, ctx.core_id)
    if i1 <= i0:
        return
    budget = UB_BUDGET_NON_QUANT if t.dispatch_quant == "none" else UB_USABLE_FOR_LOCAL_COPY
    # The sample's budget is sized for 256 KiB of UB; on a smaller UB (Atlas A3, 192 KiB)
    # keep the same 16 KiB of headroom below the capacity (docs/kernels/cann_sample.md).
    budget = min(budget, ctx.ub.capacity - UB_HEADROOM)
    small = 32 + align32(4 * wl) + 64 * n_cs + 3 * align32(4 * (i1 - i0)) + 64
    tbuf_bytes = budget - small
    max_tokens = tbuf_bytes // t.record.slot_bytes
    tbuf = ctx.alloc("tokens", tbuf_bytes)
    flag_zero = ctx.alloc("flag_zero", 32)
    # SetValidExpertInfo: my copy of the prefix table, then per index the rows left.
    yield from ctx.wait(
        ctx.copy_in(
            cum_buf, ctx.tensor("workspace"), 4 * ctx.core_id * wl, 4 * wl, name="read_prefix"
        )
    )
    cum = ctx.ub_read(cum_buf, np.int32, wl, ops=0).astype(np.int64)
    ctx.scalar(4 * (i1 - i0))
    valid = valid_expert_info(cum, i0, i1)
    if not valid:
        return
    yield from wait_and_format_output(ctx, t, state, valid, tbuf, max_tokens, flag_zero)


def wait_cum_sum_flag(ctx: KernelContext, t: MoeTiling, ready, zero) -> Wait:
    """WaitCumSumFlag: every cum-sum core has raised my ready flag (8 x int32 1 each);
    then cleared."""
    n_cs, win = t.n_cumsum, ctx.window()
    ready_off = t.window.status.cumsum_flag(n_cs, ctx.core_id)
    yield from ctx.wait_until(
        win,
        ready_off,
        32 * n_cs,
        SumEquals(np.int32, 8.0 * n_cs),
        ready,
        name="wait_ready",
        check_ns=ctx.check_ns(n_cs),
    )
    ctx.vector(
        "dup_zero", 8 * n_cs, np.int32, writes=[zero], fn=lambda: zero.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(win, ready_off, zero, 32 * n_cs, name="clear_ready")


def wait_and_format_output(
    ctx: KernelContext, t: MoeTiling, state: int, valid: list, tbuf, max_tokens: int, flag_zero
) -> Wait:
    """WaitAndFormatOutput: round robin over my indices with rows left; arrived rows copied
    out (CopyInAndOut), a drained index's block flags cleared for the next call."""
    rec, win = t.record, ctx.window()
    ctx.vector(
        "dup_pattern", 16, np.int32, writes=[flag_zero], fn=lambda: flag_zero.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")

    def block_of(idx: int) -> int:
        return _block_base(t, state, idx, ctx.rank_id)

    def copy_rows(src: int, row: int, n: int) -> Wait:
        yield from copy_in_and_out(ctx, t, tbuf, src, row, n)

    def after(block: int, finish: int, drained: bool) -> Wait:
        if drained:  # clear every block flag of this index for the next call
            yield from ctx.pipe_barrier("mte3")
            ctx.vector("dup_zero", 8, np.int32, writes=[flag_zero])
            yield from ctx.pipe_barrier("vector")
            ctx.copy_out(
                win,
                block + SPLIT_BLOCK_DATA,
                flag_zero,
                0,
                strided=Strided(rec.blocks * finish, 4, src_gap=-4, dst_gap=SPLIT_BLOCK_BYTES - 4),
                name="clear_block_flags",
            )
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>

    yield from drain_round_robin(
        ctx, valid, max_tokens, block_of, rec.slot_bytes, rec.blocks, tbuf, copy_rows, after
    )


def copy_in_and_out(ctx: KernelContext, t: MoeTiling, tbuf, src: int, row: int, n: int) -> Wait:
    """CopyInAndOut: strip the flags on the way in, then three strided copies out."""
    rec = t.record
    stride = rec.blocks * SPLIT_BLOCK_DATA  # a token's bytes in UB once the flags are gone
    yield from ctx.wait(
        ctx.copy_in(
            tbuf,
            ctx.window(),
            src,
            0,
            name="copy_tokens",
            strided=Strided(rec.blocks * n, SPLIT_BLOCK_DATA, src_gap=32),
        )
    )
    scale_bytes = rec.scale_bytes
    out_scales = ctx.tensor("dynamic_scales")
    if scale_bytes and t.dispatch_quant == "mxfp8":
        ctx.copy_out(
            out_scales,
            row * scale_bytes,
            tbuf,
            0,
            src_offset=rec.scale_offset,
            strided=Strided(n, scale_bytes, src_gap=stride - scale_bytes),
            name="write_scales",
        )
    elif t.dispatch_quant == "int8":
        ctx.copy_out(
            out_scales,
            row * 4,
            tbuf,
            0,
            src_offset=rec.scale_offset,
            strided=Strided(n, 4, src_gap=stride - 4),
            name="write_scales",
        )
    row_bytes = rec.data_bytes
    ctx.copy_out(
        ctx.tensor("expand_x"),
        row * row_bytes,
        tbuf,
        0,
        strided=Strided(n, row_bytes, src_gap=stride - row_bytes),
        name="write_expand_x",
    )
    ctx.copy_out(
        ctx.tensor("assist_info_for_combine"),
        row * 12,
        tbuf,
        0,
        src_offset=rec.triplet_offset,
        strided=Strided(n, 12, src_gap=stride - 12),
        name="write_assist_info",
    )


def _block_base(t: MoeTiling, state: int, idx: int, rank: int) -> int:
    """Window block of status index idx: source idx on a shared rank, else (le, src)."""
    if t.is_shared_rank(rank):
        return t.window.shared_block(state, idx)
    le, src = divmod(idx, t.world)
    return t.window.dispatch_block(state, src, le)
