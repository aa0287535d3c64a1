"""Epilogue 1, dequant-SwiGLU-quant (utils/block_epilogue_pertoken_swiglu.hpp 122-240,
called from DispatchAndCombine, dispatch_ffn_combine_kernel.hpp 845-885), in two phases:
rows of experts 0..L-2 once the AIC's first C2V flag (9) is up, on the epilogueCoreNum =
aivNum / 2 AIVs of the upper half (subblockIdx >= subblockNum - epilogueCoreNum: the
sub-block-1 AIVs); then the last expert's rows on every AIV after the second flag. Each
phase ends with SyncAll and the V2C flag (10) to the AIC.

Per row (1 x N fp16 of GMM1's C, UB_STAGES = 2 buffers): MTE2 in, Cast to fp32, Muls by
the row's token scale (a scalar GM load), SwiGLU on the halves (Muls -1, Exp, Adds 1,
Div, Mul), Abs, ReduceMax, the scalar 127 / amax, Muls, Casts to int32, fp16, int8; MTE3
of N/2 int8; the core's per-token scales (amax / 127) go out together at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.dispatch_ffn_combine import reference as ref
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import DfcTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

F32, F16 = np.float32, np.float16


def row_counts(ctx: KernelContext, t: DfcTiling, m_of: Any) -> tuple[int, int]:
    """dequantSum1 / dequantSum2 (811-840): rows of experts 0..granularity-1, and the rest
    (maxOutputSize = BS * K * W never truncates)."""
    ms = [m_of(g) for g in range(t.L)]
    return sum(ms[:t.epilogue_granularity]), sum(ms[t.epilogue_granularity:])


class SwigluBuffers:
    def __init__(self, ctx: KernelContext, t: DfcTiling) -> None:
        n = t.N
        self.c = [ctx.alloc(f"ub_c{i}", n * 2) for i in range(2)]
        self.d = [ctx.alloc(f"ub_d{i}", n // 2) for i in range(2)]
        self.tmp = ctx.alloc("ub_c_fp32", n * 4 + n * 2 + n * 4)
        most = -(-t.max_output // (t.aiv // 2))  # phase 1's share on aivNum / 2 cores
        self.scales = ctx.alloc("ub_per_token_scale", most * 4 + 32)
        self.stores: list[Any] = [None, None]


def swiglu_rows(ctx: KernelContext, t: DfcTiling, bufs: SwigluBuffers, first: int, count: int,
                core: int, cores: int) -> Wait:
    """This core's share of rows first..first + count on `cores` epilogue cores."""
    per, rem = divmod(count, cores)
    mine = per + (1 if core < rem else 0)
    start = first + core * per + min(core, rem)
    if mine <= 0:
        return
    n, half = t.N, t.N // 2
    gm_c, ts1 = ctx.tensor("gm_c"), ctx.tensor("per_token_scale1")
    gm_d, ts2 = ctx.tensor("gm_permuted_token"), ctx.tensor("per_token_scale2")
    if mine * 4 > bufs.scales.nbytes:
        raise ctx.error(f"epilogue 1: {mine} rows' scales overrun the UB buffer")
    for i in range(mine):
        row, p = start + i, i % 2
        if bufs.stores[p] is not None:
            yield from ctx.wait(bufs.stores[p])
        yield from ctx.wait(ctx.copy_in(bufs.c[p], gm_c, row * n * 2, n * 2,
                                        name="copy_gm_to_ub_c"))
        ts = F32(ctx.gm_read_scalar(ts1, row * 4, F32))

        def effect(p: int = p, ts: F32 = ts, i: int = i) -> None:
            q, s = ref.swiglu_quant(bufs.c[p].view(F16, n)[None, :], np.array([ts], F32))
            bufs.d[p].view(np.int8, half)[:] = q[0]
            bufs.scales.view(F32, 1, i * 4)[:] = s

        op = ctx.vector_seq("swiglu_quant", [
            ("cast_f32", n, F16), ("muls_token", n, F32), ("muls_neg", half, F32),
            ("exp", half, F32), ("adds_one", half, F32), ("div", half, F32),
            ("mul_up", half, F32), ("abs", half, F32), ("reduce_max", half, F32),
            ("muls_quant", half, F32), ("cast_rint_i32", half, F32),
            ("cast_rint_f16", half, np.int32), ("cast_rint_i8", half, F16)],
            reads=[bufs.c[p]], writes=[bufs.d[p], bufs.scales, bufs.tmp],
            fn=None if t.timing_only else effect)
        yield from ctx.wait(op)
        ctx.scalar(2)  # the scale's SetValue, 127 / amax
        bufs.stores[p] = ctx.copy_out(gm_d, row * half, bufs.d[p], half,
                                      name="copy_ub_to_gm_d")
    yield from ctx.wait(*[s for s in bufs.stores if s is not None])
    yield from ctx.wait(ctx.copy_out(ts2, start * 4, bufs.scales, mine * 4,
                                     name="copy_ub_to_gm_dequant_scale"))
