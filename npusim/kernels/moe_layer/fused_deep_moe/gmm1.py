"""A3 + A4: GMM1 on the AIC with its dequant-SwiGLU epilogue on the comp AIV (sub-block 0),
GMM1K:555-641 (AIC) and 1270-1360 (CompCoreFunc).

Both walk the local experts in order: spin (DCCI + GetValue) on the group's status line
until word 0 is coreNumPerGroup * vToCFlag, read its row count (word 3), and take the
group's 256 x 128 blocks by GemmIdentityBlockSwizzle<3, 0> from the carried start core
(fused_deep_moe_base.swizzle.BlockWalk). The AIC runs a block with moe_layer.gmm's
CubeBlock (L1 K 512, L0 K 128) and FixPipes the int32 block into the CV swap ring, slot
(stage * aicNum + block) * 256 rows of 128, 4 stages. The two sides pace each other with
soft-sync byte counters in the status area (EncreaseSyncFlag / CheckSyncFlag, 306-352):
the AIC bumps counter aicNum + b after each FixPipe and, once all 4 stages are in use,
waits for counter b (the AIV's) to reach its next target before a FixPipe; the AIV waits
for the AIC's counter before each block and bumps its own after.

The epilogue (block_epilogue_per_token_dequant_swiglu.h:185-270, all of a block's 64 x 128
tiles on the one comp AIV): int32 tile in, the tile's 128 weight scales and 64 token
scales in, Cast RINT, per-column Mul, per-row Mul; on the 64 gate columns Muls -1, Exp,
Adds 1, Div; Mul with the 64 up columns; fp32 out to swiglu_out [M, I] at column
n_tile * 64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import note_compute
from npusim.kernels.moe_layer.fused_deep_moe.roles import (
    LaunchTiling,
    v_to_c_target,
)
from npusim.kernels.moe_layer.fused_deep_moe.tile import TileInputs
from npusim.kernels.moe_layer.fused_deep_moe.tiling import (
    GMM1_EPIM,
    GMM1_L1M,
    GMM1_L1N,
    WORKSPACE_STAGES,
)
from npusim.kernels.moe_layer.fused_deep_moe_base.swizzle import BlockWalk
from npusim.kernels.moe_layer.fused_deep_moe_base.window import GROUP_TOKEN_COUNT
from npusim.kernels.moe_layer.gmm import CubeBlock
from npusim.runtime.conditions import AllEqual, AtLeast, Wait
from npusim.runtime.context import KernelContext, Strided

F32, I32 = np.float32, np.int32


def wait_group(ctx: KernelContext, lt: LaunchTiling, g: int) -> Any:
    """The group line's spin; returns currentM."""
    at = lt.window.group_line(g)
    raw = yield from ctx.spin_until(ctx.window(), at, AllEqual(I32, v_to_c_target(lt.t)), 4,
                                    name="wait_group_tokens")
    del raw
    got = yield from ctx.spin_until(ctx.window(), at + GROUP_TOKEN_COUNT * 4,
                                    AtLeast(I32, 0), 4, name="read_group_count")
    return int(np.asarray(got).view(I32)[0])


class SoftSync:
    """One core's soft-sync counter (its byte in the status area) and its reads of the
    partner's: EncreaseSyncFlag / CheckSyncFlag."""

    def __init__(self, lt: LaunchTiling, mine: int, theirs: int) -> None:
        self.mine_at = lt.window.soft_sync(mine)
        self.theirs_at = lt.window.soft_sync(theirs)
        self.value = 0

    def encrease(self, ctx: KernelContext) -> Wait:
        yield from ctx.drain()
        self.value += 1
        ctx.store_remote(ctx.rank_id, self.mine_at, np.array([self.value & 0xFF], np.uint8),
                         name="encrease_sync_flag")

    def check(self, ctx: KernelContext, target: int) -> Wait:
        yield from ctx.drain()
        yield from ctx.spin_until(ctx.window(), self.theirs_at, AtLeast(np.uint8, target), 1,
                                  name="check_sync_flag")


def gmm1_aic(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    t, gt = lt.t, lt.gmm1
    x, w, ring = ctx.tensor("x1"), ctx.tensor("gmm1_weight"), ctx.tensor("cv_swap")
    cube = CubeBlock(ctx, gt, lambda op: note_compute(ctx, op, "gmm1"))
    sync = SoftSync(lt, t.aic + b, b)
    stage = used = 0
    target = 1
    walk = BlockWalk(t.n1, GMM1_L1M, GMM1_L1N, t.aic, b)
    for g in range(t.L):
        m = yield from wait_group(ctx, lt, g)
        for blk in walk.next(m):
            _, row0, rows, n0, cols, _ = blk
            yield from cube.run(ctx, x, w, (g, row0, rows, n0, cols))
            if used == WORKSPACE_STAGES:
                yield from sync.check(ctx, target)
                target += 1
            else:
                used += 1
            cube.out = ctx.fixpipe(
                ring, cube.l0c, rows, cols, "int32",
                dst_offset=(stage * t.aic + b) * GMM1_L1M * GMM1_L1N * 4,
                dst_row_bytes=GMM1_L1N * 4, name="fixpipe_cv_swap")
            yield from sync.encrease(ctx)
            stage = (stage + 1) % WORKSPACE_STAGES
    if cube.out is not None:
        yield from ctx.wait(cube.out)


def gmm1_epilogue(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    """CompCoreFunc: the comp AIV's blocks, each after the AIC's counter says it is in."""
    t = lt.t
    half = GMM1_L1N // 2
    n_out = t.n2
    out_gm = ctx.tensor("swiglu_out")
    scale_gm, token_gm = ctx.tensor("gmm1_weight_scale"), ctx.tensor("x1_scale")
    tile = TileInputs(ctx, GMM1_EPIM, GMM1_L1N)
    out = ctx.alloc("ub_d", GMM1_EPIM * half * 4)
    sync = SoftSync(lt, b, t.aic + b)
    stage = 0
    target = 1
    store = None
    walk = BlockWalk(t.n1, GMM1_L1M, GMM1_L1N, t.aic, b)
    for g in range(t.L):
        m = yield from wait_group(ctx, lt, g)
        for blk in walk.next(m):
            _, row0, rows, n0, cols, _ = blk
            yield from sync.check(ctx, target)
            target += 1
            slot = (stage * t.aic + b) * GMM1_L1M * GMM1_L1N * 4
            for m0 in range(0, rows, GMM1_EPIM):
                r = min(GMM1_EPIM, rows - m0)
                if store is not None:
                    yield from ctx.wait(store)
                yield from tile.load(ctx, slot + m0 * GMM1_L1N * 4, scale_gm,
                                     (g * t.n1 + n0) * 4, token_gm, row0 + m0, r, cols)
                op = note_compute(ctx, _swiglu(ctx, tile, out, r, cols), "gmm1")
                yield from ctx.wait(op)
                store = ctx.copy_out(out_gm, ((row0 + m0) * n_out + n0 // 2) * 4, out,
                                     r * half * 4, name="copy_ub_to_gm_d",
                                     strided=Strided(r, half * 4, 0, (n_out - half) * 4))
            if store is not None:
                yield from ctx.wait(store)
            yield from sync.encrease(ctx)
            stage = (stage + 1) % WORKSPACE_STAGES


def _swiglu(ctx: KernelContext, tile: TileInputs, out: Any, r: int, cols: int) -> Any:
    n, half = r * cols, cols // 2
    acc, scale, token = tile.acc, tile.scale, tile.token

    def effect() -> None:
        x = acc.view(I32, n).reshape(r, cols).astype(F32)
        x = (x * scale.view(F32, cols)[None, :]).astype(F32)
        x = (x * token.view(F32, r)[:, None]).astype(F32)
        gate, up = x[:, :half], x[:, half:]
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            d = np.exp((gate * F32(-1.0)).astype(F32)).astype(F32)
            d = (d + F32(1.0)).astype(F32)
            act = (gate / d).astype(F32)
            out.view(F32, r * half)[:] = (up * act).astype(F32).reshape(-1)
    h = r * half
    return ctx.vector_seq("dequant_swiglu", [
        ("cast_f32", n, I32), ("mul_scale", n, F32), ("brcb", r * 8, F32),
        ("mul_token", n, F32), ("muls", h, F32), ("exp", h, F32), ("adds", h, F32),
        ("div", h, F32), ("mul", h, F32)], reads=[acc, scale, token], writes=[out],
        fn=effect)
