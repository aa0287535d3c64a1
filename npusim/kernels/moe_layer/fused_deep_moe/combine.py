"""B3 / B4: CamMoeDistributeCombine's deep-fuse branch (CAMC:767-808) after the GMM2
epilogues.

- sub-block 0, AllToAllSend: CrossCoreSetFlag<0> + wait of SEND_SYNC_EVENT_ID 9 (every AIV
  of the rank has finished its epilogue's sends), SetStatus (583-600: fp32 1.0 in 32 B
  into status entry (this rank) of area 1 of each of its ranks; the W ranks split over
  the blocks, SplitCoreCal 395-407), then wait RECV_SYNC_EVENT_ID 10;
- sub-block 1, ReducePermute: set 9; WaitDispatch (602-640): spin until its ranks' status
  words add up to their count, then set + wait 10; LocalWindowCopy (643-747): its tokens
  (BS over the blocks, or each token's columns over BS-sized groups of blocks when
  BS < blocks), per token the K rows from its own combine half at (expert, the pair's
  slot index from expand_idx), acc += f32(row) * weight (Muls, Add), Cast RINT to bf16,
  out; then wait 9.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from npusim.kernels.common.overlap import note_compute, note_remote
from npusim.kernels.common.split import split_to_core
from npusim.kernels.moe_layer.fused_deep_moe.roles import (
    COMBINE_STATE,
    SUM_TARGET,
    LaunchTiling,
)
from npusim.kernels.moe_layer.fused_deep_moe_base.window import STATE_OFFSET, STATUS_ONE
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext

F32, I32 = np.float32, np.int32
SEND_SYNC_EVENT_ID, RECV_SYNC_EVENT_ID = 9, 10  # CAMC:23-24
UB_ALIGN = 32
TOLERANCE = 0.5


def all_to_all_send(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    ctx.cross_core_set_flag(0, SEND_SYNC_EVENT_ID, "mte3")
    yield from ctx.cross_core_wait_flag(SEND_SYNC_EVENT_ID)
    yield from ctx.drain()
    lo, hi = split_to_core(lt.world, lt.aic, b)
    if lo < lt.world:
        buf = ctx.alloc("status_flag", UB_ALIGN)
        words = np.zeros(8, I32)
        words[0] = STATUS_ONE
        ctx.ub_write(buf, 0, words)
        at = lt.window.status_entry(COMBINE_STATE, ctx.rank_id)
        ops = [note_remote(ctx, ctx.put(r, at, buf, UB_ALIGN, name="set_status"), "combine")
               for r in range(lo, hi)]
        yield from ctx.wait(*ops)
    yield from ctx.cross_core_wait_flag(RECV_SYNC_EVENT_ID)


def reduce_permute(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    ctx.cross_core_set_flag(0, SEND_SYNC_EVENT_ID, "mte3")
    lo, hi = split_to_core(lt.world, lt.aic, b)
    if lo < lt.world:
        yield from ctx.spin_until(
            ctx.window(), lt.window.status_entry(COMBINE_STATE, lo),
            SumEquals(F32, SUM_TARGET * (hi - lo), stride=STATE_OFFSET, tolerance=TOLERANCE),
            (hi - lo) * STATE_OFFSET, name="wait_dispatch")
    ctx.cross_core_set_flag(0, RECV_SYNC_EVENT_ID, "mte3")
    yield from ctx.cross_core_wait_flag(RECV_SYNC_EVENT_ID)
    yield from local_window_copy(ctx, lt, b)
    yield from ctx.cross_core_wait_flag(SEND_SYNC_EVENT_ID)


def token_share(bs: int, h: int, cores: int, b: int) -> tuple[int, int, int, int] | None:
    """LocalWindowCopy's split: (first token, end token, first column, columns) of block
    b, or None when it has no share (CAMC:645-670)."""
    if bs < cores:
        per_token = cores // bs
        if b >= bs * per_token:
            return None
        length = (h // UB_ALIGN) // per_token * UB_ALIGN
        offset = length * (b % per_token)
        if b % per_token == per_token - 1:
            length = h - (per_token - 1) * length
        return b // per_token, b // per_token + 1, offset, length
    lo, hi = split_to_core(bs, cores, b)
    return lo, hi, 0, h


def local_window_copy(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    t, win = lt.t, lt.window
    share = token_share(t.BS, t.H, t.aic, b)
    if share is None:
        return
    lo, hi, col, length = share
    n = t.BS * t.K
    idx_ub, ids_ub = ctx.alloc("index_counts", n * 4), ctx.alloc("expert_ids", n * 4)
    w_ub = ctx.alloc("expand_scales", n * 4)
    yield from ctx.wait(
        ctx.copy_in(idx_ub, ctx.tensor("expand_idx"), 0, n * 4, name="copy_expand_idx"),
        ctx.copy_in(ids_ub, ctx.tensor("expert_ids"), 0, n * 4, name="copy_expert_ids"),
        ctx.copy_in(w_ub, ctx.tensor("expert_scales"), 0, n * 4, name="copy_expert_scales"))
    idx, ids = ctx.ub_read(idx_ub, I32, n, ops=0), ctx.ub_read(ids_ub, I32, n, ops=0)
    weights = ctx.ub_read(w_ub, F32, n, ops=0)
    rows = [ctx.alloc(f"moe_sum{i}", length * 2) for i in range(2)]
    acc = ctx.alloc("sum_float", length * 4)
    out = ctx.alloc("sum_bf16", length * 2)
    y = ctx.tensor("output")
    store = None
    readers: list[Any] = [None, None]  # the Add still reading each row buffer
    for tok in range(lo, hi):
        if store is not None:
            yield from ctx.wait(store)
        ctx.vector("duplicate", length, F32, writes=[acc],
                   fn=lambda: acc.view(F32, length).fill(0))
        for k in range(t.K):
            e = int(ids[tok * t.K + k])
            if e < 0:
                continue
            wv = F32(weights[tok * t.K + k])
            ctx.scalar(2)
            row = rows[k % 2]
            if readers[k % 2] is not None:
                yield from ctx.wait(readers[k % 2])
            at = win.combine_row(ctx.rank_id, COMBINE_STATE, e // t.L, e % t.L,
                                 int(idx[tok * t.K + k])) + col * 2
            yield from ctx.wait(ctx.copy_in(row, ctx.window(), at, length * 2,
                                            name="copy_combined_row"))
            op = ctx.vector_seq("weighted_add", [("cast_f32", length, ml_dtypes.bfloat16),
                                                 ("muls", length, F32), ("add", length, F32)],
                                reads=[row, acc], writes=[acc],
                                fn=_accumulate(row, acc, length, wv))
            readers[k % 2] = note_compute(ctx, op, "vector")
        cast = ctx.vector("cast_bf16", length, F32, reads=[acc], writes=[out],
                          fn=lambda: out.view(ml_dtypes.bfloat16, length).__setitem__(
                              slice(None), acc.view(F32, length).astype(ml_dtypes.bfloat16)))
        yield from ctx.wait(cast)
        store = ctx.copy_out(y, (tok * t.H + col) * 2, out, length * 2, name="copy_output")
    if store is not None:
        yield from ctx.wait(store)


def _accumulate(row: Any, acc: Any, length: int, w: np.float32) -> Any:
    def effect() -> None:
        v = (row.view(ml_dtypes.bfloat16, length).astype(F32) * w).astype(F32)
        a = acc.view(F32, length)
        a[:] = (a + v).astype(F32)
    return effect
