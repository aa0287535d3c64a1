"""PostSwigluDynamicQuant (G1 = dispatch_mx_gmm1_swiglu.h 1290-1346; phase quant), after
the SyncAll that ends GMM1: every AIV takes rows aivIdx, aivIdx + aivNum, ...; per row
MTE2 loads the fp32 SwiGLU row [N1], Mul(left, right) in fp32 over N1/2, Cast to bf16
(CAST_RINT), QuantDynamicMx to N1/2 FP8 codes and CeilDiv(N1/64, 2) * 2 E8M0 scales,
MTE3 stores both to x2 / x2_scale. One UB buffer: a row's load waits for the last row's
vector work and store."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import note_compute
from npusim.kernels.mega_moe.mx import BF16
from npusim.kernels.moe_layer.fused_deep_moe_a5.dispatch import quant_dynamic_mx
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import A5Tiling
from npusim.kernels.quant import mx_quantize_bf16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

F32 = np.float32


def post_swiglu_quant(ctx: KernelContext, t: A5Tiling, vid: int, rows: int) -> Wait:
    if vid >= rows:
        return
    half, scales = t.n2, t.x2_scales
    src, x2, x2s = ctx.tensor("swiglu_out"), ctx.tensor("x2"), ctx.tensor("x2_scale")
    row_in = ctx.alloc("fp32_token", t.n1 * 4)
    row_bf16 = ctx.alloc("bf16_token", half * 2)
    out = ctx.alloc("fp8_token", align_up(half + scales, 32))
    store: Any = None
    for r in range(vid, rows, t.aiv_num):
        if store is not None:
            yield from ctx.wait(store)
        yield from ctx.wait(ctx.copy_in(row_in, src, r * t.n1 * 4, t.n1 * 4,
                                        name="load_swiglu_row"))

        def mul_cast() -> None:
            v = row_in.view(F32, t.n1)
            row_bf16.view(BF16, half)[:] = (v[:half] * v[half:]).astype(F32).astype(BF16)
        note_compute(ctx, ctx.vector_seq("mul_cast", [("mul", half, F32),
                                                      ("cast_bf16", half, F32)],
                                         reads=[row_in], writes=[row_bf16], fn=mul_cast),
                     "vector")

        def quantize() -> None:
            codes, sc = mx_quantize_bf16(row_bf16.view(BF16, half).reshape(1, half), t.mode,
                                         zero_subnormal_blocks=True)
            raw = out.view(np.uint8, half + scales)
            raw[:half] = codes[0]
            raw[half:half + sc.shape[1]] = sc[0]
        yield from ctx.wait(quant_dynamic_mx(ctx, row_bf16, out, half, scales, t.mode,
                                             quantize))
        ctx.copy_out(x2, r * half, out, half, name="store_x2")
        store = ctx.copy_out(x2s, r * scales, out, scales, src_offset=half,
                             name="store_x2_scale")
    yield from ctx.drain()
