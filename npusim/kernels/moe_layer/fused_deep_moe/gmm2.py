"""B1 + B2: GMM2 with its dequant epilogue and the combine's sends
(GroupedMatmulSliceMPerTokenDequantMultiStageWorkspace, GMM2K:107-285; the epilogue
BlockEpilogue<PerTokenDequant> with DoCombineSend, EPI2:523-685).

The AIC walks group_list's groups (cumulative rows) by 128 x 256 blocks, the same
GemmIdentityBlockSwizzle<3, 0> walk as GMM1, runs each with moe_layer.gmm's CubeBlock and
FixPipes it into the ring (slot (stage * aicNum + block) * 128 rows of 256, 4 stages).
Hardware flags pace the ring (GMM2K:94-98): stage s's store flag is 2s, its compute
flag 2s + 1, mode 2 both ways; the AIC waits a stage's compute flag before reusing it and
at the end waits those still out.

Both AIVs walk the same blocks; per block, after the store flag, the block's 32 x 256
tiles alternate between them (sub-block i takes tiles i, i + 2, ...): int32 tile, the
tile's fp32 w2 scales and per-token scales in, Cast RINT, per-column Mul, per-row Mul,
Cast RINT to bf16; DoCombineSend: for each run of the tile's rows that came from one
source rank (ep_send_count's prefixes of the expert), one DataCopyPad of the run into
that rank's combine half (slot expert-holder * L + expert, row = the pair's index in its
(source, expert) slot), then the compute flag on MTE3.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from npusim.kernels.common.overlap import note_compute, note_remote
from npusim.kernels.moe_layer.fused_deep_moe.roles import COMBINE_STATE, LaunchTiling
from npusim.kernels.moe_layer.fused_deep_moe.tile import TileInputs
from npusim.kernels.moe_layer.fused_deep_moe.tiling import (
    GMM2_EPIM,
    GMM2_L1M,
    GMM2_L1N,
    WORKSPACE_STAGES,
)
from npusim.kernels.moe_layer.fused_deep_moe_base.swizzle import Block, core_blocks
from npusim.kernels.moe_layer.gmm import CubeBlock
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided

F32, I32, I64 = np.float32, np.int32, np.int64
FLAG_MODE = 2
RECV_SYNC_EVENT_ID = 10  # CAMC:24
BLOCK_BYTES = GMM2_L1M * GMM2_L1N * 4


def group_rows(ctx: KernelContext, lt: LaunchTiling) -> list[int]:
    """currentM of each group from group_list's cumulative counts (GMM2K:141-142)."""
    gl = ctx.tensor("group_list")
    cum = [int(ctx.gm_read_scalar(gl, g * 8, I64)) for g in range(lt.L)]
    return [c - (cum[g - 1] if g else 0) for g, c in enumerate(cum)]


def blocks(lt: LaunchTiling, rows: list[int], b: int) -> list[Block]:
    return list(core_blocks(rows, GMM2_L1M, GMM2_L1N, lt.t.H, lt.t.aic, b))


def gmm2_aic(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    t = lt.t
    x, w, ring = ctx.tensor("x2"), ctx.tensor("gmm2_weight"), ctx.tensor("cv_swap")
    cube = CubeBlock(ctx, lt.gmm2, lambda op: note_compute(ctx, op, "gmm2"))
    used = 0
    todo = blocks(lt, group_rows(ctx, lt), b)
    for nth, (g, row0, rows, n0, cols, _) in enumerate(todo):
        stage = nth % WORKSPACE_STAGES
        yield from cube.run(ctx, x, w, (g, row0, rows, n0, cols))
        if used == WORKSPACE_STAGES:
            yield from ctx.cross_core_wait_flag(2 * stage + 1)
        else:
            used += 1
        cube.out = ctx.fixpipe(
            ring, cube.l0c, rows, cols, "int32",
            dst_offset=(stage * t.aic + b) * BLOCK_BYTES, dst_row_bytes=GMM2_L1N * 4,
            name="fixpipe_workspace")
        ctx.cross_core_set_flag(FLAG_MODE, 2 * stage, "fixpipe")
    stage = len(todo) % WORKSPACE_STAGES
    for left in range(used, 0, -1):
        yield from ctx.cross_core_wait_flag(2 * ((stage - left) % WORKSPACE_STAGES) + 1)


def gmm2_aiv(ctx: KernelContext, lt: LaunchTiling, b: int, sub: int) -> Wait:
    t = lt.t
    if sub == 0:
        ctx.cross_core_set_flag(0, RECV_SYNC_EVENT_ID, "mte3")
    n_sends = t.W * t.L
    sends_ub = ctx.alloc("ep_send_count", n_sends * 4)
    yield from ctx.wait(ctx.copy_in(sends_ub, ctx.tensor("ep_send_count"), 0, n_sends * 4,
                                    name="copy_ep_send_count"))
    sends = ctx.ub_read(sends_ub, I32, n_sends).astype(np.int64)
    scale_gm = ctx.tensor("gmm2_weight_scale")
    token_gm = ctx.tensor("per_token_scale2")
    tile = TileInputs(ctx, GMM2_EPIM, GMM2_L1N)
    out = ctx.alloc("ub_d", GMM2_EPIM * GMM2_L1N * 2)
    pending: list[Any] = []
    for nth, (g, row0, rows, n0, cols, _) in enumerate(blocks(lt, group_rows(ctx, lt), b)):
        stage = nth % WORKSPACE_STAGES
        yield from ctx.cross_core_wait_flag(2 * stage)
        for m0 in range(sub * GMM2_EPIM, rows, 2 * GMM2_EPIM):
            r = min(GMM2_EPIM, rows - m0)
            if pending:
                yield from ctx.wait(*pending)
            yield from tile.load(ctx, (stage * t.aic + b) * BLOCK_BYTES + m0 * GMM2_L1N * 4,
                                 scale_gm, (g * t.H + n0) * 4, token_gm, row0 + m0, r, cols)
            op = note_compute(ctx, _dequant(ctx, tile, out, r, cols), "gmm2")
            yield from ctx.wait(op)
            pending = list(combine_send(ctx, lt, sends, out, g, row0 + m0, r, n0, cols))
        ctx.cross_core_set_flag(FLAG_MODE, 2 * stage + 1, "mte3")
    if pending:
        yield from ctx.wait(*pending)


def combine_send(ctx: KernelContext, lt: LaunchTiling, sends: np.ndarray, out: Any, g: int,
                 first: int, r: int, n0: int, cols: int) -> Any:
    """DoCombineSend of rows [first, first + r) of expert g (global row order)."""
    t, win = lt.t, lt.window
    base = g * t.W
    it, end = first, first + r
    for src in range(t.W):
        prev = int(sends[base + src - 1]) if base + src else 0
        cur = int(sends[base + src])
        if it >= end:
            break
        if prev <= it < cur:
            n = min(cur, end) - it
            at = win.combine_row(src, COMBINE_STATE, ctx.rank_id, g, it - prev) + n0 * 2
            yield note_remote(ctx, ctx.put(src, at, out, n * cols * 2,
                                           src_offset=(it - first) * cols * 2,
                                           name="combine_send",
                                           strided=Strided(n, cols * 2, 0,
                                                           (t.H - cols) * 2)), "combine")
            it += n


def _dequant(ctx: KernelContext, tile: TileInputs, out: Any, r: int, cols: int) -> Any:
    n = r * cols
    acc, scale, token = tile.acc, tile.scale, tile.token

    def effect() -> None:
        v = acc.view(I32, n).reshape(r, cols).astype(F32)
        v = (v * scale.view(F32, cols)[None, :]).astype(F32)
        v = (v * token.view(F32, r)[:, None]).astype(F32)
        out.view(ml_dtypes.bfloat16, n)[:] = v.reshape(-1).astype(ml_dtypes.bfloat16)
    return ctx.vector_seq("per_token_dequant", [
        ("cast_f32", n, I32), ("mul_scale", n, F32), ("brcb", r * 8, F32),
        ("mul_token", n, F32), ("cast_bf16", n, F32)], reads=[acc, scale, token],
        writes=[out], fn=effect)
