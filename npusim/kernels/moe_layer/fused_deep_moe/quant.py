"""A5, every AIV after SyncAll<false> (GMM1K:1540-1573): UpdateAndCleanInfo (1484-1518) and
the requant of the SwiGLU rows, BlockQuant (164-281).

- UpdateAndCleanInfo: the last AIV zeroes the L group lines; the last receive core writes
  group_list (int64, the cumulative rows per local expert: ep_send_count's last entry of
  each expert's W);
- totalTokenCount = ep_send_count[L * W - 1]; the rows in tiles of 2 * quantRow
  (CalQuantRow: min(8, 16384 / I)), tile i on block i mod aicNum, each sub-block its
  quantRow rows: fp32 rows in, Abs, the max of each row (the two halves' Max, then a
  halving tree, WholeReduceMax), Muls 127; the scale amax * (1 / 127) out; each row
  Muls by the scalar 1 / amax; casts RINT to int32, RINT to half, RINT to int8; x2 out.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.overlap import note_compute
from npusim.kernels.moe_layer.fused_deep_moe.roles import LaunchTiling
from npusim.kernels.moe_layer.fused_deep_moe_base.window import GROUP_INFO_SIZE
from npusim.kernels.moe_layer.reference import INV_127, to_int8
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

F32, I32, I64 = np.float32, np.int32, np.int64
QUANT_FACTOR = F32(127.0)
GROUP_INFO_BYTES = GROUP_INFO_SIZE * 4  # a group line: GROUP_INFO_SIZE int32


def update_and_clean_info(ctx: KernelContext, lt: LaunchTiling, b: int, sub: int) -> Wait:
    t = lt.t
    if b == t.aic - 1 and sub == 1:
        zero = ctx.alloc("zero_group_lines", t.L * GROUP_INFO_BYTES)
        op = ctx.vector("duplicate", t.L * GROUP_INFO_BYTES // 4, I32, writes=[zero],
                        fn=lambda: zero.view(I32, t.L * GROUP_INFO_BYTES // 4).fill(0))
        yield from ctx.wait(op)
        yield from ctx.wait(ctx.copy_out(ctx.window(), lt.window.group_line(0), zero,
                                         t.L * GROUP_INFO_BYTES, name="clean_group_lines"))
    if b == t.aic - 1 and sub == 0:
        sends, groups = ctx.tensor("ep_send_count"), ctx.tensor("group_list")
        for g in range(t.L):
            v = ctx.gm_read_scalar(sends, (g * t.W + t.W - 1) * 4, I32)
            ctx.gm_write_scalar(groups, g * 8, int(v), I64)
        yield from ctx.drain()


def block_quant(ctx: KernelContext, lt: LaunchTiling, b: int, sub: int) -> Wait:
    t = lt.t
    total = int(ctx.gm_read_scalar(ctx.tensor("ep_send_count"), (t.L * t.W - 1) * 4, I32))
    q, n = t.quant_rows, t.n2
    src, x2, s2 = ctx.tensor("swiglu_out"), ctx.tensor("x2"), ctx.tensor("per_token_scale2")
    ub_in = ctx.alloc("ub_input", q * n * 4)
    ub_out = ctx.alloc("ub_output", q * n)
    ub_scale = ctx.alloc("ub_dequant_scale", max(q * 4, 32))
    stores: list = []
    for tile in range(b, -(-total // (2 * q)), t.aic):
        row0 = tile * 2 * q + sub * q
        r = min(q, total - row0)
        if r <= 0:
            continue
        if stores:
            yield from ctx.wait(*stores)
        yield from ctx.wait(ctx.copy_in(ub_in, src, row0 * n * 4, r * n * 4,
                                        name="copy_gm_to_ub_input"))
        op = note_compute(ctx, _quant(ctx, ub_in, ub_out, ub_scale, r, n), "vector")
        yield from ctx.wait(op)
        stores = [ctx.copy_out(s2, row0 * 4, ub_scale, r * 4, name="copy_ub_to_gm_scale"),
                  ctx.copy_out(x2, row0 * n, ub_out, r * n, name="copy_ub_to_gm_output")]
    if stores:
        yield from ctx.wait(*stores)


def _quant(ctx: KernelContext, ub_in, ub_out, ub_scale, r: int, n: int):
    count = r * n

    def effect() -> None:
        v = ub_in.view(F32, count).reshape(r, n)
        amax = np.abs(v).max(axis=1).astype(F32)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            y = (v * QUANT_FACTOR).astype(F32)
            inv = (F32(1.0) / amax).astype(F32)
            y = (y * inv[:, None]).astype(F32)
        ub_scale.view(F32, r)[:] = (amax * INV_127).astype(F32)
        ub_out.view(np.int8, count)[:] = to_int8(y).reshape(-1)
    return ctx.vector_seq("block_quant", [
        ("abs", count, F32), ("max_halves", count // 2, F32), ("reduce_max", r * 64, F32),
        ("muls_127", count, F32), ("muls_inv_127", r, F32), ("muls_inv_amax", count, F32),
        ("cast_s32", count, F32), ("cast_f16", count, I32), ("cast_s8", count, np.float16)],
        reads=[ub_in], writes=[ub_out, ub_scale], fn=effect)
