"""moe_init_routing_quant_v2, full-load dynamic-quant path (tiling key 21000;
dispatch_ffn_combine_kernel/moe_init_routing_quant_v2/moe_v2_fullload_dynamic_quant.h),
as DispatchAndCombine calls it on every AIV (dispatch_ffn_combine_kernel.hpp:744-751):

- each of the gather's cores (AIV index < needCoreNum) copies all BS * K expert ids in and
  sorts them itself (SortCompute 89-166: two Sort passes, by expert then back by route);
- core 0 writes expandedRowIdx (route -> sorted position) to the workspace (CopyOutIdx);
- the last core counts the routes per global expert (ComputeExpertTokenCountOrCumsum,
  flag 2 = counts) into this rank's row of the token-per-expert matrix in the segment;
- every core quantises the x rows its routes come from (Compute 215-253: Abs, ReduceMax,
  s = amax / 127, Div, CAST_TRUNC to fp16, CAST_ROUND to int8) and writes the row with its
  scale (H + 32 B) at each of its routes' sorted positions, H + 512 B apart, in the
  segment (CopyOutXQuant1H 256-304).

The Sort instruction (Sort32 + in-UB merges of 4 lists) is costed as one elementwise pass
of its 8 B proposals per merge level: the preset has no Sort figure of its own.
"""

from __future__ import annotations

import math

import numpy as np

from npusim.kernels.moe_layer.dispatch_ffn_combine import reference as ref
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import SORT32, DfcTiling
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

F32, I32 = np.float32, np.int32
BLOCK_BYTES = 32  # the scale's block after the int8 row (intriParams: cols + BLOCK_BYTES)


def _sort_levels(n: int) -> int:
    """Sort32 then merges of 4 lists until one is left."""
    return 1 + max(0, math.ceil(math.log(max(n // SORT32, 1), 4)))


def routing_quant(ctx: KernelContext, t: DfcTiling, core: int) -> Wait:
    """One AIV's share of moe_init_routing_quant_v2; `core` is its AIV index."""
    if core >= t.gather_cores:
        return
    seg, n, sn = t.segment, t.routes, t.sort_num
    ids_ub = ctx.alloc("expert_idx", sn * 8)  # ids, then the row indices
    sorted_ub = ctx.alloc("sorted", sn * 8)
    row_idx_ub = ctx.alloc("expanded_row_idx", sn * 4)
    yield from ctx.wait(ctx.copy_in(ids_ub, ctx.tensor("expert_ids"), 0, n * 4,
                                    name="sort_data_copy_in"))
    levels = _sort_levels(sn)

    def sort() -> None:
        order = ref.expert_order(ids_ub.view(I32, n))
        dst = np.empty(n, I32)
        dst[order] = np.arange(n, dtype=I32)
        row_idx_ub.view(I32, n)[:] = dst
        sorted_ub.view(I32, n)[:] = ids_ub.view(I32, n)[order]

    elementwise = [("cast_f32", sn, F32), ("muls_neg", sn, F32), ("duplicate", sn, F32),
                   ("concat", sn * 2, F32), ("extract", sn * 2, F32), ("cast", sn, F32),
                   ("muls_neg", sn, F32), ("cast_i32", sn, F32), ("muls_neg", sn, F32),
                   ("arith_progression", sn, I32), ("concat", sn * 2, F32),
                   ("extract", sn * 2, F32)]
    sorts = [("sort", sn * 2 * levels, F32)] * 2
    yield from ctx.wait(ctx.vector_seq("sort_compute", elementwise + sorts, reads=[ids_ub],
                                       writes=[row_idx_ub, sorted_ub], fn=sort))
    if core == 0:  # CopyOutIdx
        ctx.copy_out(ctx.tensor("expanded_row_idx"), 0, row_idx_ub, n * 4,
                     name="copy_out_idx")
    if core == t.gather_cores - 1:  # ComputeExpertTokenCountOrCumsum, counts
        E = t.W * t.L
        cnt = ctx.alloc("expert_tokens_count", max(E * 4, 32))
        ctx.loop(n)
        ctx.ub_write(cnt, 0, np.bincount(sorted_ub.view(I32, n), minlength=E).astype(I32),
                     ops=E)
        yield from ctx.wait(ctx.copy_out(ctx.window(), seg.count_at(ctx.rank_id, 0, 0), cnt,
                                         E * 4, name="copy_out_expert_tokens"))
    yield from _quant_rows(ctx, t, core, row_idx_ub)


def _quant_rows(ctx: KernelContext, t: DfcTiling, core: int, row_idx_ub: object) -> Wait:
    """CopyOutXQuant1H: per x row of this core's routes, quantise once, store per route."""
    H, K = t.H, t.K
    first = core * t.gather_rows
    last = min(first + t.gather_rows, t.routes) - 1
    x_ub = ctx.alloc("x_in", H * 4)
    tmp = ctx.alloc("quant_tmp", H * 4)
    out = ctx.alloc("x_quant_out", H + BLOCK_BYTES)
    dst_of = ctx.ub_read(row_idx_ub, I32, t.routes, ops=0)
    x, win = ctx.tensor("x"), ctx.window()
    stores: list = []
    for row in range(first // K, last // K + 1):
        yield from ctx.wait(ctx.copy_in(x_ub, x, row * H * 2, H * 2, name="copy_in_x"))
        yield from ctx.wait(*stores)
        stores = []

        def quant() -> None:
            q, s = ref.routing_quant(x_ub.view(BF16, H)[None, :])
            out.view(np.int8, H)[:] = q[0]
            out.view(F32, 1, H)[:] = s

        op = ctx.vector_seq("dynamic_quant", [
            ("cast_f32", H, F32), ("abs", H, F32), ("reduce_max", H, F32),
            ("duplicate", H, F32), ("div", H, F32), ("cast_trunc_f16", H, F32),
            ("cast_round_i8", H, np.float16)], reads=[x_ub], writes=[out, tmp],
            fn=None if t.timing_only else quant)
        yield from ctx.wait(op)
        ctx.scalar(1)  # maxValue = GetValue(0) / 127.0f
        for route in range(max(first, row * K), min(last, row * K + K - 1) + 1):
            stores.append(ctx.copy_out(win, t.segment.offset_a + int(dst_of[route])
                                       * t.row_bytes, out, H + BLOCK_BYTES,
                                       name="copy_out_x_quant"))
    yield from ctx.wait(*stores)
