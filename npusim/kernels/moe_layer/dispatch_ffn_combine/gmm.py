"""The AIC side of DispatchFFNCombine (dispatch_ffn_combine_kernel.hpp GMM1 361-464):
per local expert, the blocks of GemmIdentityBlockSwizzle<9, 1> over ceil(m / 128) x
ceil(N / 256) tiles, core c starting where the previous expert's blocks ended
(startCoreIdx); before its first block of expert g the AIC takes the AIVs' flag for every
expert up to g (the pulls of g are in; GMM1(g) runs while g + 1 is pulled). One block is
BlockMmad<MmadAtlasA2PreloadAsyncFixpipe> (utils/block_mmad_preload_async_fixpipe_quant.hpp):
L1 128 x 256 x 512, L0 128 x 256 x 128, two L1 stages (moe_layer/gmm.py's CubeBlock on
these tiles); at the last K tile the expert's per-channel scales (uint64, 256 of them) go
GM -> L1 and FixPipe writes C as fp16 through them (copy_l0c_to_gm_custom.hpp quantPre).
ShuffleK (each core starting at K tile blockIdx mod kTiles) is not modelled: the K order
does not change int32 sums, and every K tile costs the same.
"""

from __future__ import annotations

from typing import Any

from npusim.kernels.mega_moe.tiling import swizzle
from npusim.kernels.moe_layer.dispatch_ffn_combine.pulls import current_m
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import (
    FLAG_MAX_SET_COUNT,
    L1_M,
    L1_N,
    SWIZZLE_OFFSET,
    DfcTiling,
)
from npusim.kernels.moe_layer.gmm import CubeBlock
from npusim.kernels.moe_layer.tiling import GmmTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div

SYNC_MODE2 = 2
SYNC_C2V = 9  # SYNCFLAGC2V (dispatch_ffn_combine_kernel.hpp:54)
SYNC_V2C = 10  # SYNCFLAGV2C


class FixpipeQuant:
    """The L1 scale buffer and the FixPipe that reads it (FIX_MTE2 event 0)."""

    def __init__(self, ctx: KernelContext, t: GmmTiling) -> None:
        self.scale = ctx.alloc("l1_scale", t.base_n * 8, "l1")
        self.out: Any = None

    def store(self, ctx: KernelContext, cube: CubeBlock, t: GmmTiling, scale: Any,
              dst: Any, g: int, row0: int, rows: int, n0: int, cols: int) -> Wait:
        if self.out is not None:
            yield from ctx.wait(self.out)
        yield from ctx.wait(ctx.copy_in(self.scale, scale, (g * t.n + n0) * 8, cols * 8,
                                        name="copy_gm_to_l1_scale"))
        self.out = cube.out = ctx.fixpipe(
            dst, cube.l0c, rows, cols, "float16", dst_offset=(row0 * t.n + n0) * 2,
            dst_row_bytes=t.n * 2, channel_scale=self.scale, name="copy_l0c_to_gm_quant")


def walk(m: int, n: int, core: int, cores: int, start: int
         ) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """One expert's blocks for core `core`, in order, as (loop, row offset in the expert,
    rows, first column, columns), and the next expert's startCoreIdx: GemmIdentityBlock
    Swizzle<9, 1> over 128 x 256 tiles, core c taking loops from (c - start) mod cores."""
    m_loops, n_loops = ceil_div(m, L1_M), ceil_div(n, L1_N)
    loops = m_loops * n_loops
    first = (core + cores if core < start else core) - start
    out = []
    for loop in range(first, loops, cores):
        mi, ni = swizzle(loop, m_loops, n_loops, SWIZZLE_OFFSET)
        out.append((loop, mi * L1_M, min(L1_M, m - mi * L1_M), ni * L1_N,
                    min(L1_N, n - ni * L1_N)))
    return out, (start + loops) % cores


def gmm1(ctx: KernelContext, t: DfcTiling, note: Any) -> Wait:
    """GMM1 on AIC `ctx.block_idx`; `note(op)` records each mmad. Ends with the C2V flags
    (9): one after expert epilogueGranularity - 1, one after the last (Finalize)."""
    g1 = t.gmm1
    cube, fix = CubeBlock(ctx, g1), FixpipeQuant(ctx, g1)
    cube.note = note
    gm_a, w1, s1, gm_c = (ctx.tensor(n) for n in ("gm_a", "w1", "scale1", "gm_c"))
    yield from ctx.cross_core_wait_flag(0)  # the AIVs' cumsums
    idx, synced, start, before, c2v = 1, 0, 0, 0, 0
    for g in range(t.L):
        m = current_m(ctx, t, g)
        blocks, nxt = walk(m, g1.n, ctx.block_idx, t.aic, start)
        for _, r0, rows, n0, cols in blocks:
            while synced <= g:
                yield from ctx.cross_core_wait_flag(idx // FLAG_MAX_SET_COUNT)
                idx, synced = idx + 1, synced + 1
            yield from cube.run(ctx, gm_a, w1, (g, before + r0, rows, n0, cols))
            yield from fix.store(ctx, cube, g1, s1, gm_c, g, before + r0, rows, n0, cols)
        if g + 1 == t.epilogue_granularity and g < t.L - 1:
            c2v = yield from _finalize(ctx, fix, 0, c2v, SYNC_C2V)
        before += m
        start = nxt
    while synced < t.L:
        yield from ctx.cross_core_wait_flag(idx // FLAG_MAX_SET_COUNT)
        idx, synced = idx + 1, synced + 1
    yield from _finalize(ctx, fix, c2v, c2v, SYNC_C2V)


def _finalize(ctx: KernelContext, fix: FixpipeQuant, target: int, done: int, flag: int
              ) -> Any:
    """BlockMmad::Finalize(target, flag): CrossCoreSetFlag<2, PIPE_FIX>(i / 15 + flag)
    for every group index not yet signalled up to target; returns the next index."""
    if fix.out is not None:
        yield from ctx.wait(fix.out)
    while done <= target:
        ctx.cross_core_set_flag(SYNC_MODE2, done // FLAG_MAX_SET_COUNT + flag, "fixpipe")
        done += 1
    return done


def gmm2(ctx: KernelContext, t: DfcTiling, note: Any) -> Wait:
    """GMM2 (dispatch_ffn_combine_kernel.hpp 466-560): after the first V2C flag (10, the
    SwiGLU of experts 0..L-2), per expert the same walk over the int8 SwiGLU rows; before
    expert L-2 the AIC takes the second V2C flag (the last expert's SwiGLU), so GMM2 of the
    first L-2 experts overlaps it. After its last block of expert g the AIC raises flag
    g / 15 for its AIVs' combine of that expert (Finalize(syncLoopIdx, 0))."""
    g2 = t.gmm2
    cube, fix = CubeBlock(ctx, g2), FixpipeQuant(ctx, g2)
    cube.note = note
    gm_p, w2, s2, gm_c2 = (ctx.tensor(n) for n in ("gm_permuted_token", "w2", "scale2",
                                                    "gm_c2"))
    yield from ctx.cross_core_wait_flag(SYNC_V2C)
    start, before, done = 0, 0, 0
    for g in range(t.L):
        m = current_m(ctx, t, g)
        blocks, nxt = walk(m, g2.n, ctx.block_idx, t.aic, start)
        if t.L > 1 and g + 1 == t.L - 1:
            yield from ctx.cross_core_wait_flag(SYNC_V2C)
        for i, (_, r0, rows, n0, cols) in enumerate(blocks):
            yield from cube.run(ctx, gm_p, w2, (g, before + r0, rows, n0, cols))
            yield from fix.store(ctx, cube, g2, s2, gm_c2, g, before + r0, rows, n0, cols)
            if i == len(blocks) - 1:
                done = yield from _finalize(ctx, fix, g, done, 0)
        before += m
        start = nxt
    if fix.out is not None:
        yield from ctx.wait(fix.out)
