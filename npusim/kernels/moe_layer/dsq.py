"""DequantSwigluQuant on the AIVs (ops-nn quant/dequant_swiglu_quant/op_kernel
dequant_swiglu_quant.h, DequantSwigluQuantBase with group_index, int32 x, dynamic quant,
activate_left, no bias, no smooth scale), step by step:

- Process: per group (group_index: int64 counts), ProcessSingleGroup re-splits the group's
  rows over maxCoreNum cores (ceil(rows / cores) each; cores past the rows idle);
- with the cut-group key (tiling CountTilingKey; dequant_swiglu_quant.cpp 199-205 runs
  DequantSwigluQuantGroup, dequant_swiglu_quant_cut_group.h 40-63) Process instead deals
  whole groups round robin: core b takes groups b, b + maxCoreNum, ..., each with all its
  rows from the running group offset (empty groups skipped, their turn still taken);
- ProcessSingleGroupPerCore: CopyInWeightScale (the group's [2I] fp32), then per
  UbFactorDimx rows: CopyInXAct (x rows int32 and their activation scales), Compute, CopyOut
  (y int8 rows and the scales). Every queue is single-buffered (DB_BUFFER = 1), so the
  three steps run one after the other;
- Compute: ComputeDequant (Cast, CopyReshape of the weight scale, Mul, CopyReshape of the
  activation scale, Mul), ComputeSwiGLU (two Copys of the halves, Muls -1, Exp, Adds 1,
  Div, Mul), DynamicQuant (Abs, ComputeReduceMax, WholeReduceMax, Muls 1/127, Brcb, Copy,
  Div) and CastFloatToInt8 (fp32 -> int32 RINT -> half ROUND -> int8 TRUNC).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.tiling import DsqTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

F32, F16, I32 = np.float32, np.float16, np.int32
INV_127 = F32(1.0 / 127.0)  # DYNAMIC_QUANT_FACTOR
MASK_NUM_T32 = 64  # fp32 elements per repeat (ComputeReduceMax's partial maxima)


def compute_instrs(p: int, t: DsqTiling) -> list[tuple[str, int, Any]]:
    """Compute(proDimsx) as vector instructions over p rows."""
    n2, n1 = p * t.in_dim, p * t.out_dim
    return [("cast_f32", n2, I32), ("copy_reshape_weight_scale", n2, F32), ("mul", n2, F32),
            ("copy_reshape_activation_scale", n2, F32), ("mul", n2, F32),
            ("copy_act", n1, F32), ("copy_gate", n1, F32), ("muls", n1, F32),
            ("exp", n1, F32), ("adds", n1, F32), ("div", n1, F32), ("mul", n1, F32),
            ("abs", n1, F32), ("reduce_max", n1, F32),
            ("whole_reduce_max", p * MASK_NUM_T32, F32), ("muls", p, F32),
            ("brcb", p * 8, F32), ("copy_scale", n1, F32), ("div", n1, F32),
            ("cast_i32", n1, F32), ("cast_f16", n1, I32), ("cast_i8", n1, F16)]


def _apply(xa: Any, sa: Any, ws: Any, out: Any, p: int, t: DsqTiling) -> None:
    """The numbers of Compute: xa holds p rows of int32 x, sa their fp32 activation
    scales; out gets p rows of int8 y then the p fp32 scales."""
    x = xa.view(I32, p * t.in_dim).reshape(p, t.in_dim).astype(F32)
    a_s = sa.view(F32, p)
    x = (ws.view(F32, t.in_dim)[None, :] * x).astype(F32)
    x = (a_s[:, None] * x).astype(F32)
    act, gate = x[:, :t.out_dim], x[:, t.out_dim:]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        e = (np.exp((act * F32(-1.0)).astype(F32)).astype(F32) + F32(1.0)).astype(F32)
        v = (gate * (act / e).astype(F32)).astype(F32)
        scale = (np.abs(v).max(axis=1) * INV_127).astype(F32)
        q = (v / scale[:, None]).astype(F32)
        q = np.rint(np.nan_to_num(q, nan=0.0, posinf=127.0, neginf=-128.0))
    n1 = p * t.out_dim
    out.view(np.int8, n1)[:] = np.clip(q, -128, 127).astype(np.int8).reshape(-1)
    out.view(F32, p, n1)[:] = scale


def dsq_program(t: DsqTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        b = ctx.core_id
        gi = ctx.tensor("group_index")
        counts = [int(ctx.gm_read_scalar(gi, 8 * g, np.int64)) for g in range(t.groups)]
        x, w_s, a_s = ctx.tensor("x"), ctx.tensor("weight_scale"), ctx.tensor(
            "activation_scale")
        y, y_s = ctx.tensor("y"), ctx.tensor("scale")
        u = t.ub_rows
        xa = ctx.alloc("x", u * t.in_dim * 4)
        sa = ctx.alloc("activation_scale", u * 32)  # [rows, 8] fp32 of the x_act queue
        ws = ctx.alloc("weight_scale", t.in_dim * 4)
        out = ctx.alloc("out", u * t.out_dim + u * 4 + 32)
        ctx.alloc("tmp", u * t.in_dim * 4)
        with ctx.phase("process"):
            gms, bufs = (x, w_s, a_s, y, y_s), (xa, sa, ws, out)
            if t.cut_group:
                yield from _cut_group(ctx, t, counts, gms, bufs)
                return
            before = 0
            for g, m in enumerate(counts):
                if m <= 0 or before >= t.rows:
                    continue
                factor = -(-m // t.cores)
                real = -(-m // factor)
                if b < real:
                    mine = factor if b < real - 1 else m - factor * (real - 1)
                    yield from _per_core(ctx, t, g, before + factor * b, mine, gms, bufs)
                before += m
    return program


def _cut_group(ctx: KernelContext, t: DsqTiling, counts: list[int], gms: tuple,
               bufs: tuple) -> Wait:
    """DequantSwigluQuantGroup::Process: this core's groups, each whole on it."""
    before = 0
    for g, m in enumerate(counts):
        if g % t.cores == ctx.core_id and m > 0:
            yield from _per_core(ctx, t, g, before, m, gms, bufs)
        before += m


def _per_core(ctx: KernelContext, t: DsqTiling, g: int, row0: int, rows: int,
              gms: tuple, bufs: tuple) -> Wait:
    x, w_s, a_s, y, y_s = gms
    xa, sa, ws, out = bufs
    yield from ctx.wait(ctx.copy_in(ws, w_s, g * t.in_dim * 4, t.in_dim * 4,
                                    name="copy_in_weight_scale"))
    stores: list = []
    for r0 in range(0, rows, t.ub_rows):
        p = min(t.ub_rows, rows - r0)
        at = row0 + r0
        yield from ctx.wait(
            ctx.copy_in(xa, x, at * t.in_dim * 4, p * t.in_dim * 4, name="copy_in_x"),
            ctx.copy_in(sa, a_s, at * 4, p * 4, name="copy_in_activation_scale"))
        if stores:
            yield from ctx.wait(*stores)
        op = ctx.vector_seq("compute", compute_instrs(p, t), reads=[xa, sa, ws],
                            writes=[out], fn=lambda p=p: _apply(xa, sa, ws, out, p, t))
        yield from ctx.wait(op)
        n1 = p * t.out_dim
        stores = [ctx.copy_out(y_s, at * 4, out, p * 4, src_offset=n1, name="copy_out_scale"),
                  ctx.copy_out(y, at * t.out_dim, out, n1, name="copy_out_y")]
    if stores:
        yield from ctx.wait(*stores)
