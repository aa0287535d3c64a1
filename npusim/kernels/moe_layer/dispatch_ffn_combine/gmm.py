"""The AIC side of DispatchFFNCombine (dispatch_ffn_combine_kernel.hpp GMM1 366-461):
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
    SWIZZLE_OFFSET,
    DfcTiling,
)
from npusim.kernels.moe_layer.gmm import CubeBlock
from npusim.kernels.moe_layer.tiling import GmmTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div


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


def gmm1(ctx: KernelContext, t: DfcTiling, note: Any) -> Wait:
    """GMM1 on AIC `ctx.block_idx`; `note(op)` records each mmad."""
    g1 = t.gmm1
    core, cores = ctx.block_idx, t.aic
    cube, fix = CubeBlock(ctx, g1), FixpipeQuant(ctx, g1)
    cube.note = note
    gm_a, w1, s1, gm_c = (ctx.tensor(n) for n in ("gm_a", "w1", "scale1", "gm_c"))
    yield from ctx.cross_core_wait_flag(0)  # the AIVs' cumsums
    idx, synced, start, before = 1, 0, 0, 0
    n_loops = ceil_div(g1.n, g1.base_n)
    for g in range(t.L):
        m = current_m(ctx, t, g)
        m_loops = ceil_div(m, g1.base_m)
        loops = m_loops * n_loops
        first = (core + cores if core < start else core) - start
        for loop in range(first, loops, cores):
            while synced <= g:
                yield from ctx.cross_core_wait_flag(idx // FLAG_MAX_SET_COUNT)
                idx, synced = idx + 1, synced + 1
            mi, ni = swizzle(loop, m_loops, n_loops, SWIZZLE_OFFSET)
            rows = min(g1.base_m, m - mi * g1.base_m)
            cols = min(g1.base_n, g1.n - ni * g1.base_n)
            row0, n0 = before + mi * g1.base_m, ni * g1.base_n
            yield from cube.run(ctx, gm_a, w1, (g, row0, rows, n0, cols))
            yield from fix.store(ctx, cube, g1, s1, gm_c, g, row0, rows, n0, cols)
        before += m
        start = (start + loops) % cores
    while synced < t.L:
        yield from ctx.cross_core_wait_flag(idx // FLAG_MAX_SET_COUNT)
        idx, synced = idx + 1, synced + 1
    if fix.out is not None:
        yield from ctx.wait(fix.out)
