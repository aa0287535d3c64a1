"""GMM1 and its SiLU-half epilogue (G1 = dispatch_mx_gmm1_swiglu.h; phases gmm1 on the
AIC, swiglu on the AIVs).

AIC (G1 305-520): per local expert, spin until every receive core has added its
vToCFlag to the group line (WaitGroupTokenNumReady), raise the soft-sync counter once,
read the group's rows; then its blocks (tiling.block_walk): mega_moe's BlockMmad, the
Catlass BlockMmadTla of L1 256 x 256 x 256 / L0 K 128 (the same tile shapes,
fused_deep_moe_a5_tiling.h 63-67), C fixpiped to the fp32 swap [capacity, N1] without
conversion, then the counter raised again (callbackAfterFixpipe -> EncreaseSyncFlag).
Last PipeBarrier<PIPE_ALL> and SyncAll<false>.

AIV, both of every block (G1 1405-1490): per expert CheckSyncFlag then the same blocks
as its AIC, each after CheckSyncFlag of the next target, through
BlockEpilogue<EpilogueAtlasA5SiluHalf<1>> (block_epilogue_silu_half.h 95-170): 64 x 256
tiles, the sub-blocks alternating; per tile C to UB, Cast to bf16 (CAST_RINT), and for a
left block (column < N1/2) Cast back, Muls -1, Exp, Adds 1, Div; for a right block the
Cast back; the fp32 tile stored in place (the swap is the SwiGLU output, fused memory).
One UB stage: a tile's load waits for the last tile's vector work, its vector work for
the last store.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import note_compute, notes
from npusim.kernels.mega_moe.cube import BlockMmad
from npusim.kernels.mega_moe.mx import BF16
from npusim.kernels.moe_layer.fused_deep_moe_a5.softsync import (
    SoftSync,
    check_sync,
    read_int,
    spin_word,
)
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import (
    EPI_M,
    TILE_M,
    A5Tiling,
    block_walk,
)
from npusim.kernels.moe_layer.fused_deep_moe_a5.window import A5Window
from npusim.kernels.moe_layer.fused_deep_moe_base.swizzle import Block
from npusim.kernels.moe_layer.fused_deep_moe_base.window import GROUP_TOKEN_COUNT, V_TO_C_FLAG_1
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided

F32 = np.float32


def tagged_mmad(ctx: KernelContext, mmad: BlockMmad, tag: str, a: tuple[Any, Any, int, int],
                rows: int, b: tuple[Any, Any, int, int, int], cols: int, k: int) -> Wait:
    """One block's BlockMmad, its cube instructions noted under `tag` (BlockMmad notes
    them untagged)."""
    n = notes(ctx)
    first = len(n.compute)
    yield from mmad(ctx, a, rows, b, cols, k)
    n.compute[first:] = [(tag if t == "" else t, s, e) for t, s, e in n.compute[first:]]


def run_block(ctx: KernelContext, st: Any, tag: str, a: tuple[Any, Any, int, int],
              blk: Block, b: tuple[Any, Any, int, int, int], k: int, c: Any, n: int) -> Wait:
    """BlockMmad of one block, C fixpiped as fp32 into the swap [.., n], then the soft
    sync raised (callbackAfterFixpipe)."""
    if st.mmad is None:
        st.mmad = BlockMmad(ctx, TILE_M, st.t.mode)
    yield from tagged_mmad(ctx, st.mmad, tag, a, blk.rows, b, blk.cols, k)
    st.mmad.out = ctx.fixpipe(c, st.mmad.l0c, blk.rows, blk.cols, "float32",
                              dst_offset=(blk.row * n + blk.col) * 4, dst_row_bytes=n * 4,
                              name="fixpipe_to_swap")
    yield from st.sync.increase(ctx)


class AicState:
    """What an AIC carries through a GEMM: its L1 / L0 buffers and soft-sync counter."""

    def __init__(self, t: A5Tiling, gemm: int, core: int) -> None:
        self.t = t
        self.mmad: BlockMmad | None = None
        self.sync = SoftSync(gemm, core)


def gmm1_aic(ctx: KernelContext, t: A5Tiling, core: int) -> Wait:
    """GMM1 on one AIC; returns the groups' rows (GMM2 reuses them) and its BlockMmad."""
    st = AicState(t, 1, core)
    x1, x1s = ctx.tensor("x1"), ctx.tensor("x1_scale")
    w1, w1s = ctx.tensor("gmm1_weight"), ctx.tensor("gmm1_weight_scale")
    swap = ctx.tensor("swiglu_out")
    counts = []
    walk = block_walk(t.n1, t.block_dim, core)
    expected = t.block_dim * V_TO_C_FLAG_1
    for g in range(t.L):
        line = yield from spin_word(ctx, A5Window.group_line(g), expected, 16)
        yield from st.sync.increase(ctx)
        counts.append(int(line[GROUP_TOKEN_COUNT]))
        for blk in walk.next(counts[-1]):
            yield from run_block(ctx, st, "gmm1", (x1, x1s, blk.row, t.H), blk,
                                 (w1, w1s, g * t.H, blk.col, t.n1), t.H, swap, t.n1)
    yield from ctx.drain()
    return counts, st.mmad


def swiglu_aiv(ctx: KernelContext, t: A5Tiling, core: int, sub: int) -> Any:
    """The epilogue on one AIV; returns the groups' rows (read from the group lines)."""
    swap = ctx.tensor("swiglu_out")
    ub_c = ctx.alloc("ub_c", EPI_M * 256 * 4)
    ub_i = ctx.alloc("ub_i", EPI_M * 256 * 2)
    ub_d = ctx.alloc("ub_d", EPI_M * 256 * 4)
    target = 1
    walk = block_walk(t.n1, t.block_dim, core)
    counts: list[int] = []
    last_vec: Any = None
    last_store: Any = None
    for g in range(t.L):
        yield from check_sync(ctx, 1, core, target)
        target += 1
        m = yield from read_int(ctx, A5Window.group_line(g) + 4 * GROUP_TOKEN_COUNT)
        counts.append(m)
        for blk in walk.next(m):
            yield from check_sync(ctx, 1, core, target)
            target += 1
            left = blk.col < t.n1 // 2
            for r0 in range(sub * EPI_M, blk.rows, 2 * EPI_M):
                rows = min(EPI_M, blk.rows - r0)
                n = rows * blk.cols
                at = ((blk.row + r0) * t.n1 + blk.col) * 4
                span = Strided(rows, blk.cols * 4, (t.n1 - blk.cols) * 4, 0)
                if last_vec is not None:
                    yield from ctx.wait(last_vec)
                yield from ctx.wait(ctx.copy_in(ub_c, swap, at, span.nbytes, strided=span,
                                                name="load_swap"))
                if last_store is not None:
                    yield from ctx.wait(last_store)
                last_vec = _silu_half_tile(ctx, ub_c, ub_i, ub_d, n, left)
                yield from ctx.wait(last_vec)
                last_store = ctx.copy_out(swap, at, ub_d, n * 4, name="store_swiglu",
                                          strided=Strided(rows, blk.cols * 4, 0,
                                                          (t.n1 - blk.cols) * 4))
    yield from ctx.drain()
    return counts


def _silu_half_tile(ctx: KernelContext, ub_c: Any, ub_i: Any, ub_d: Any, n: int,
                    left: bool) -> Any:
    def effect() -> None:
        c = ub_c.view(F32, n)
        v = c.astype(BF16).astype(F32)
        if left:
            with np.errstate(over="ignore"):
                d = np.exp((v * F32(-1)).astype(F32)).astype(F32)
                d = (d + F32(1)).astype(F32)
                v = (v / d).astype(F32)
        ub_d.view(F32, n)[:] = v
    steps = [("cast_bf16", n, F32), ("cast_f32", n, BF16)]
    if left:
        steps += [("muls", n, F32), ("exp", n, F32), ("adds", n, F32), ("div", n, F32)]
    return note_compute(ctx, ctx.vector_seq("silu_half", steps, reads=[ub_c],
                                            writes=[ub_i, ub_d], fn=effect), "vector")
