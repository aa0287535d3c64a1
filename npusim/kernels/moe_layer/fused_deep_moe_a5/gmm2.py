"""MxGmm2CastCombine (G2 = fused_deep_moe/gemm/kernel/mx_gmm2_cast_combine.h, epilogue
block_epilogue_cast_combine.h = CC, combiner raw_distributed/cam_moe_distribute_combine.h
= CAM); phases gmm2 (AIC), combine (the AIVs' GMM2 epilogue with its sends), weight_sum.

AIC (G2 139-337): per local expert, m from the group list; its blocks as in GMM1 (K =
N1/2, N = H), C fixpiped as fp32 into the GMM2 swap, the GMM2 soft sync raised per block.

AIV (G2 340-514): AIV0 first sets RECV_SYNC (mode 0); both AIVs load ep_send_count (CC
96-110) and run the AIC's blocks after CheckSyncFlag, 64 x 256 tiles alternating between
the sub-blocks (CC 168-241): C to UB, Cast to bf16 (CAST_RINT), DoCombineSend (CC
134-166): the tile's rows, source rank by source rank, one strided MTE3 put each into the
source's combine half at slot (this rank * E_loc + expert), row (the token's index there).
Then AIV0 AllToAllSend (CAM 713-737): SEND_SYNC across every AIV (all sends issued),
SetStatus (32 B, 1.0f, to its share of the ranks), wait RECV_SYNC. AIV1 ReducePermute
(CAM 739-755): set SEND_SYNC, WaitDispatch (poll its ranks' combine status, then
RECV_SYNC across the AIVs), LocalWindowCopy (CAM 604-692): its tokens (or its share of a
token's H when tokens < AIC), per k the expert's row, Cast, Muls by the weight, Add; Cast
to bf16 (RINT), to the output; wait SEND_SYNC.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import note_compute, note_remote
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mega_moe.mx import BF16
from npusim.kernels.moe_layer.fused_deep_moe_a5.gmm1 import AicState, run_block
from npusim.kernels.moe_layer.fused_deep_moe_a5.softsync import check_sync
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import EPI_M, A5Tiling, block_walk
from npusim.kernels.moe_layer.fused_deep_moe_a5.window import STATE_OFFSET, A5Window
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align_up

I32, F32 = np.int32, np.float32
SEND_SYNC, RECV_SYNC = 6, 7  # SEND_SYNC_EVENT_ID / RECV_SYNC_EVENT_ID (CAM 25-26)
UB_ALIGN = 32


def gmm2_aic(ctx: KernelContext, t: A5Tiling, core: int, counts: list[int], mmad: Any
             ) -> Wait:
    """GMM2's blocks on GMM1's L1 / L0 buffers (`mmad`, one BlockMmad's worth of L1)."""
    st = AicState(t, 2, core)
    st.mmad = mmad
    x2, x2s = ctx.tensor("x2"), ctx.tensor("x2_scale")
    w2, w2s = ctx.tensor("gmm2_weight"), ctx.tensor("gmm2_weight_scale")
    swap = ctx.tensor("gmm2_swap")
    walk = block_walk(t.H, t.block_dim, core)
    for g, m in enumerate(counts):
        ctx.scalar(2)  # groupList.GetValue(g), (g - 1)
        for blk in walk.next(m):
            yield from run_block(ctx, st, "gmm2", (x2, x2s, blk.row, t.n2), blk,
                                 (w2, w2s, g * t.n2, blk.col, t.H), t.n2, swap, t.H)
    yield from ctx.drain()


def cast_combine_aiv(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int, sub: int,
                     counts: list[int]) -> Wait:
    """The AIVs' GMM2 epilogue: every finished tile straight to the source ranks."""
    if sub == 0:
        ctx.cross_core_set_flag(0, RECV_SYNC, "mte3")
    swap = ctx.tensor("gmm2_swap")
    sends = ctx.alloc("ep_send_count", align_up(4 * t.senders, UB_ALIGN))
    yield from ctx.wait(ctx.copy_in(sends, ctx.tensor("ep_send_count"), 0, 4 * t.senders,
                                    name="load_ep_send_count"))
    run = sends.view(I32, t.senders).astype(np.int64)
    ub_c = ctx.alloc("ub_c", EPI_M * 256 * 4)
    ub_d = ctx.alloc("ub_d", EPI_M * 256 * 2)
    walk = block_walk(t.H, t.block_dim, core)
    target = 1
    last_vec: Any = None
    last_send: list[Any] = []
    for g, m in enumerate(counts):
        for blk in walk.next(m):
            yield from check_sync(ctx, 2, core, target)
            target += 1
            for r0 in range(sub * EPI_M, blk.rows, 2 * EPI_M):
                rows = min(EPI_M, blk.rows - r0)
                n = rows * blk.cols
                at = ((blk.row + r0) * t.H + blk.col) * 4
                if last_vec is not None:
                    yield from ctx.wait(last_vec)
                yield from ctx.wait(ctx.copy_in(
                    ub_c, swap, at, n * 4, name="load_swap",
                    strided=Strided(rows, blk.cols * 4, (t.H - blk.cols) * 4, 0)))
                if last_send:  # MTE3_V: the last tile's puts have read UB
                    yield from ctx.wait(*last_send)

                def cast(n: int = n) -> None:
                    ub_d.view(BF16, n)[:] = ub_c.view(F32, n).astype(BF16)
                last_vec = note_compute(ctx, ctx.vector("cast_bf16", n, F32, reads=[ub_c],
                                                        writes=[ub_d], fn=cast), "vector")
                yield from ctx.wait(last_vec)
                last_send = _combine_send(ctx, t, w, ub_d, g, blk.row + r0, rows, blk.col,
                                          blk.cols, run)
    yield from ctx.drain()


def _combine_send(ctx: KernelContext, t: A5Tiling, w: A5Window, ub: Any, g: int,
                  first: int, rows: int, col: int, cols: int, run: np.ndarray) -> list[Any]:
    """DoCombineSend: rows [first, first + rows) of the grouped rows, cut at the source
    ranks' running counts of expert slot g."""
    ops = []
    row, end = first, first + rows
    for src in range(t.W):
        j = g * t.W + src
        lo = int(run[j - 1]) if j else 0
        hi = int(run[j])
        if row >= end:
            break
        if not lo <= row < hi:
            continue
        n = min(hi, end) - row
        at = w.combined_row(src, ctx.rank_id * t.L + g, row - lo) + col * 2
        op = ctx.put(src, at, ub, n * cols * 2, src_offset=(row - first) * cols * 2,
                     name="combine_send",
                     strided=Strided(n, cols * 2, 0, (t.H - cols) * 2))
        if src != ctx.rank_id:
            note_remote(ctx, op, "combine")
        ops.append(op)
        row += n
    return ops


def all_to_all_send(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int) -> Wait:
    """AIV0: SEND_SYNC across the AIVs, then its ranks' combine status, RECV_SYNC."""
    ctx.cross_core_set_flag(0, SEND_SYNC, "mte3")
    yield from ctx.cross_core_wait_flag(SEND_SYNC)
    lo, hi = split_to_core(t.W, t.block_dim, core)
    if lo < hi:
        flag = ctx.alloc("status_flag", 32)
        ctx.ub_write(flag, 0, np.array([0x3F800000] + [0] * 7, I32))
        for dst in range(lo, hi):
            op = ctx.put(dst, w.combine_status(ctx.rank_id), flag, 32, name="set_status")
            if dst != ctx.rank_id:
                note_remote(ctx, op, "combine")
    yield from ctx.cross_core_wait_flag(RECV_SYNC)
    yield from ctx.drain()


def reduce_permute(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int) -> Wait:
    """AIV1: WaitDispatch, then LocalWindowCopy (the weighted sum), wait SEND_SYNC."""
    ctx.cross_core_set_flag(0, SEND_SYNC, "mte3")
    lo, hi = split_to_core(t.W, t.block_dim, core)
    if lo < hi:
        n = hi - lo
        buf = ctx.alloc("status", align_up(32 * n, 256))
        yield from ctx.wait_until(ctx.window(), w.combine_status(lo), 32 * n,
                                  SumEquals(F32, float(n), stride=32), buf,
                                  strided=Strided(n, 32, STATE_OFFSET - 32, 0),
                                  name="wait_dispatch", check_ns=ctx.check_ns(n, 2))
    ctx.cross_core_set_flag(0, RECV_SYNC, "mte3")
    yield from ctx.cross_core_wait_flag(RECV_SYNC)
    yield from _local_window_copy(ctx, t, w, core)
    yield from ctx.cross_core_wait_flag(SEND_SYNC)


def _share(t: A5Tiling, core: int) -> tuple[int, int, int, int]:
    """(first token, tokens, first column, columns) of this core (CAM 610-636)."""
    cores = t.block_dim
    if t.BS < cores:
        per_token = cores // t.BS
        if core >= t.BS * per_token:
            return 0, 0, 0, 0
        length = (t.H // UB_ALIGN) // per_token * UB_ALIGN
        offset = length * (core % per_token)
        if core % per_token == per_token - 1:
            length = t.H - (per_token - 1) * length
        return core // per_token, 1, offset, length
    lo, hi = split_to_core(t.BS, cores, core)
    return lo, hi - lo, 0, t.H


def _local_window_copy(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int) -> Wait:
    first, count, col, length = _share(t, core)
    if not count:
        return
    nb = align_up(t.routes * 4, UB_ALIGN)
    idx, ids, scales = (ctx.alloc(name, nb) for name in ("expand_idx", "expert_ids",
                                                         "expert_scales"))
    for buf, name in ((idx, "expand_idx"), (ids, "expert_ids"), (scales, "expert_scales")):
        ctx.copy_in(buf, ctx.tensor(name), 0, t.routes * 4, name=f"load_{name}")
    yield from ctx.pipe_barrier("mte2")
    idx_v, ids_v = idx.view(I32, t.routes), ids.view(I32, t.routes)
    weight = scales.view(F32, t.routes)
    row = ctx.alloc("row", length * 2)
    f32 = ctx.alloc("row_f32", length * 4)
    acc = ctx.alloc("sum", length * 4)
    out = ctx.alloc("out", length * 2)
    y = ctx.tensor("output")
    store: Any = None
    for tok in range(first, first + count):
        if store is not None:  # MTE3_V
            yield from ctx.wait(store)
        ctx.vector("duplicate", length, F32, writes=[acc],
                   fn=lambda: acc.view(F32, length).fill(0))
        for k in range(t.K):
            pair = tok * t.K + k
            e = int(ids_v[pair])
            ctx.scalar(3)  # the expert id, the weight, the index
            if e < 0:
                continue
            at = w.combined_row(ctx.rank_id, e, int(idx_v[pair])) + col * 2
            yield from ctx.wait(ctx.copy_in(row, ctx.window(), at, length * 2,
                                            name="load_combined_row"))

            def mac(wk: np.float32 = weight[pair]) -> None:
                v = row.view(BF16, length).astype(F32)
                prod = (v * wk).astype(F32)
                a = acc.view(F32, length)
                a[:] = (a + prod).astype(F32)
            yield from ctx.wait(note_compute(ctx, ctx.vector_seq(
                "weighted_sum", [("cast_f32", length, BF16), ("muls", length, F32),
                                 ("add", length, F32)], reads=[row], writes=[f32, acc],
                fn=mac), "vector"))

        def cast() -> None:
            out.view(BF16, length)[:] = acc.view(F32, length).astype(BF16)
        yield from ctx.wait(note_compute(ctx, ctx.vector("cast_bf16", length, F32,
                                                         reads=[acc], writes=[out],
                                                         fn=cast), "vector"))
        store = ctx.copy_out(y, (tok * t.H + col) * 2, out, length * 2, name="store_output")
    yield from ctx.drain()
