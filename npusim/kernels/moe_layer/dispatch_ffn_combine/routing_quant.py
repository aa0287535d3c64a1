"""moe_init_routing_quant_v2's two dynamic-quant paths. The full-load one (tiling key 21000;
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

When the sort and a row do not fit (IsFullLoad false) and BS * K <= sortLoopMaxElement, the
host picks tiling key 11000 (moe_init_routing_quant_v2.cpp 58-125), every step on every AIV
with a SyncAll after each of the first three:

- MoeV2SortOneCore: core 0 sorts all BS * K ids in one Sort (by expert, then route) and
  writes the sorted ids and their routes (expandDstToSrcRow) to the workspace; core
  coreNum - 1 zeroes the expert counts first (moe_v2_sort_one_core.h Init, Process);
- MoeV2ExpertTokenOut: each of the split's cores (ceil(BS * K / 40) sorted routes each)
  counts its slice's experts by scalar and atomically adds them to the counts;
- MoeV2SrcToDstOp: each core scatters its slice's sorted positions to expandedRowIdx
  (route -> position), one 4 B copy per route;
- MoeV2GatherDynamicQuant: each core reads its routes' expandedRowIdx and quantises and
  stores as the full-load kernel does (CopyOutXQuant1H, the same arithmetic).

The Sort instruction (Sort32 + in-UB merges of 4 lists) is costed as one elementwise pass
of its 8 B proposals per merge level: the preset has no Sort figure of its own.
"""

from __future__ import annotations

import math

import numpy as np

from npusim.kernels.moe_layer.dispatch_ffn_combine import reference as ref
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import ROUTING_AIV, SORT32, DfcTiling
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up, ceil_div

F32, I32 = np.float32, np.int32
BLOCK_BYTES = 32  # the scale's block after the int8 row (intriParams: cols + BLOCK_BYTES)
ASSIST_NUM = 256  # MoeV2SrcToDstOp's assist table, int32 (moe_v2_common.h)


def _sort_levels(n: int) -> int:
    """Sort32 then merges of 4 lists until one is left."""
    return 1 + max(0, math.ceil(math.log(max(n // SORT32, 1), 4)))


def routing_quant(ctx: KernelContext, t: DfcTiling, core: int) -> Wait:
    """One AIV's share of moe_init_routing_quant_v2; `core` is its AIV index."""
    if not t.full_load:
        yield from _sort_one_core_path(ctx, t, core)
        return
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
    yield from _quant_rows(ctx, t, core, row_idx_ub, 0)


def _sort_one_core_path(ctx: KernelContext, t: DfcTiling, core: int) -> Wait:
    """Tiling key 11000: sort on core 0, then count, scatter and gather split over the
    AIVs, a SyncAll between steps (the split's rows are the gather's: both take
    ceil(BS * K / aivNum))."""
    n, sn, E = t.routes, t.sort_num, t.W * t.L
    seg, win, ws = t.segment, ctx.window(), ctx.tensor("sort_workspace")
    sorted_at, dst_to_src_at = 0, 4 * (n + -n % 8)  # Align(totalLength, 8 int32)
    if core == ROUTING_AIV - 1:  # Init: InitGlobalMemory(expertTokensCountOrCumsumGm, E, 0)
        zeros = ctx.alloc("expert_tokens_zero", max(E * 4, 32))
        ctx.ub_write(zeros, 0, np.zeros(E, I32), ops=E)
        yield from ctx.wait(ctx.copy_out(win, seg.count_at(ctx.rank_id, 0, 0), zeros, E * 4,
                                         name="init_expert_tokens"))
    if core == 0:  # MoeV2SortOneCore: CopyIn, SortCompute, CopyOut
        in_ub = ctx.alloc("sort_in", sn * 8)  # ids, then the row indices
        sorted_ub = ctx.alloc("sorted", sn * 8)
        out_ub = ctx.alloc("sort_out", sn * 8)  # sorted ids, then expandDstToSrcRow
        yield from ctx.wait(ctx.copy_in(in_ub, ctx.tensor("expert_ids"), 0, n * 4,
                                        name="sort_data_copy_in"))

        def sort() -> None:
            order = ref.expert_order(in_ub.view(I32, n))
            out_ub.view(I32, 2 * sn)[:n] = in_ub.view(I32, n)[order]
            out_ub.view(I32, 2 * sn)[sn:sn + n] = order

        instrs = [("arith_progression", sn, I32), ("cast_f32", sn, F32), ("muls_neg", sn, F32)]
        instrs += [("duplicate", SORT32, F32)] if n % SORT32 else []
        instrs += [("concat", sn * 2, F32), ("sort", sn * 2 * _sort_levels(sn), F32),
                   ("extract", sn * 2, F32), ("muls_neg", sn, F32), ("cast_i32", sn, F32)]
        yield from ctx.wait(ctx.vector_seq("sort_compute", instrs, reads=[in_ub],
                                           writes=[sorted_ub, out_ub], fn=sort))
        yield from ctx.wait(
            ctx.copy_out(ws, sorted_at, out_ub, n * 4, name="copy_out_sorted"),
            ctx.copy_out(ws, dst_to_src_at, out_ub, n * 4, src_offset=sn * 4,
                         name="copy_out_dst_to_src"))
    yield from ctx.sync_all()
    rows, first = t.gather_rows, core * t.gather_rows
    mine = max(0, min(rows, n - first))
    if mine:  # MoeV2ExpertTokenOut, count mode: atomic adds of the slice's counts
        ids_ub = ctx.alloc("expert_idx_in", align_up(mine, 8) * 4)
        yield from ctx.wait(ctx.copy_in(ids_ub, ws, sorted_at + first * 4, mine * 4,
                                        name="copy_in_sorted"))
        ids = ctx.ub_read(ids_ub, I32, mine, ops=0)
        ctx.loop(mine)  # GetValue per route, SetValue per expert change
        lo, hi = int(ids[0]), int(ids[-1])
        cnt = ctx.alloc("expert_token_idx_out", align_up(hi - lo + 1, 8) * 4)
        ctx.ub_write(cnt, 0, np.bincount(ids - lo, minlength=hi - lo + 1).astype(I32),
                     ops=mine)
        ctx.set_atomic_add(I32)
        yield from ctx.wait(ctx.copy_out(win, seg.count_at(ctx.rank_id, 0, 0) + lo * 4, cnt,
                                         (hi - lo + 1) * 4, name="copy_out_expert_tokens"))
        ctx.set_atomic_none()
    yield from ctx.sync_all()
    if mine:  # MoeV2SrcToDstOp: expandedRowIdx[expandDstToSrcRow[p]] = p
        assist = ctx.alloc("assist", ASSIST_NUM * 4)
        src_ub = ctx.alloc("dst_to_src_in", align_up(mine, 8) * 4)
        pos_ub = ctx.alloc("src_to_dst_out", align_up(mine, ASSIST_NUM) * 32)

        def positions() -> None:  # one int32 per 32 B block: the slice's sorted positions
            pos_ub.view(I32, align_up(mine, ASSIST_NUM) * 8)[0:mine * 8:8] = np.arange(
                first, first + mine, dtype=I32)

        yield from ctx.wait(ctx.copy_in(assist, ctx.tensor("assist"), 0, ASSIST_NUM * 4,
                                        name="assist_init"))
        yield from ctx.wait(ctx.copy_in(src_ub, ws, dst_to_src_at + first * 4, mine * 4,
                                        name="copy_in_dst_to_src"))
        adds = [("adds", ASSIST_NUM, I32)] * (1 + ceil_div(mine, 32))  # AssistInit, Compute
        yield from ctx.wait(ctx.vector_seq("src_to_dst_compute", adds, reads=[assist],
                                           writes=[pos_ub], fn=positions))
        src = ctx.ub_read(src_ub, I32, mine, ops=mine)
        idx = ctx.tensor("expanded_row_idx")
        yield from ctx.wait(*[ctx.copy_out(idx, int(s) * 4, pos_ub, 4, src_offset=32 * i,
                                           name="copy_out_src_to_dst")
                              for i, s in enumerate(src)])
    yield from ctx.sync_all()
    if mine:  # MoeV2GatherDynamicQuant: CopyInExpandedRowIdx, CopyOutXQuant1H
        row_idx_ub = ctx.alloc("expanded_row_idx_in", align_up(mine, 8) * 4)
        yield from ctx.wait(ctx.copy_in(row_idx_ub, ctx.tensor("expanded_row_idx"),
                                        first * 4, mine * 4, name="copy_in_expanded_row_idx"))
        yield from _quant_rows(ctx, t, core, row_idx_ub, first)


def _quant_rows(ctx: KernelContext, t: DfcTiling, core: int, row_idx_ub: object,
                base: int) -> Wait:
    """CopyOutXQuant1H: per x row of this core's routes, quantise once, store per route;
    `row_idx_ub` holds expandedRowIdx from route `base` on."""
    H, K = t.H, t.K
    first = core * t.gather_rows
    last = min(first + t.gather_rows, t.routes) - 1
    x_ub = ctx.alloc("x_in", H * 4)
    tmp = ctx.alloc("quant_tmp", H * 4)
    out = ctx.alloc("x_quant_out", H + BLOCK_BYTES)
    dst_of = ctx.ub_read(row_idx_ub, I32, last + 1 - base, ops=0)
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
            stores.append(ctx.copy_out(win, t.segment.offset_a + int(dst_of[route - base])
                                       * t.row_bytes, out, H + BLOCK_BYTES,
                                       name="copy_out_x_quant"))
    yield from ctx.wait(*stores)
