"""The 950's dispatch quantisers (cam_moe_dispatch_normal_a5.h QuantProcess and
QuantDynamicMx), what InputToShare runs on each token row of a quantised dispatch:

- int8 (quant_mode 2): QuantProcess with d = 127 / max|x| (no epsilon, unlike the A3's);
- pertoken_fp8_e4m3 (5): QuantProcess with d = 448 / max|x|, one fp32 -> FP8 cast (RINT,
  saturated: InputToShare sets FLOAT_OVERFLOW_MODE_CTRL to 0);
- mx_fp8_e4m3 / mx_fp8_e5m2 (3), mx_fp4_e2m1 (4): QuantDynamicMx, the register-based
  quant::ComputeMaxExp (per 32 elements the largest bf16 exponent field), ComputeScale (the
  E8M0 byte and the multiplier) and ComputeFp8Data / ComputeFp4Data (x * multiplier in
  bf16, cast RINT, saturated); the codes at 0, the Align2(Ceil(H, 32)) scale bytes at
  Align256 of the payload's elements.

The register-based functions are costed as vector ops over H elements (ComputeMaxExp: an
And, a pairwise Max, a block max per 256; ComputeScale: four ops over the scale words;
ComputeFp8Data: the multiply, the interleave and the casts; ComputeFp4Data: the multiply
and the packing cast), with no UB round trip between them."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.formats import tables
from npusim.kernels.deepep.quant_process import INT8_CASTS, quant_process
from npusim.kernels.deepep.tiling import FP8_OUT, DeepepTiling
from npusim.kernels.quant.recipes import (
    fp8_token_quantize,
    int8_token_quantize,
    mx_quantize_bf16,
    mxfp4_quantize_bf16,
    mxfp8_scale_count,
)
from npusim.runtime.context import KernelContext

U16 = np.uint16


def quantise_a5(ctx: KernelContext, t: DeepepTiling, xin: Any, out: Any) -> None:
    """The token in `xin` quantised into the record `out` by the mode's quantiser."""
    if t.mx:
        quant_dynamic_mx(ctx, t, xin, out)
    elif t.quant == "int8":
        quant_process(ctx, t, xin, out, INT8_CASTS,
                      lambda row: _first(int8_token_quantize(row)))
    else:
        fp8 = FP8_OUT[t.quant]
        quant_process(ctx, t, xin, out, (("cast_fp8", np.float32),),
                      lambda row: _first(fp8_token_quantize(row, fp8)))


def _first(got: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, Any]:
    """A one-row recipe's (codes, scale) of its row."""
    return got[0][0], got[1][0]


def quant_dynamic_mx(ctx: KernelContext, t: DeepepTiling, xin: Any, out: Any) -> None:
    H = t.H
    bf16 = tables().bf16
    n_scales = mxfp8_scale_count(H)  # mxScaleNum = Align2(Ceil(H, 32))

    def effect() -> None:
        row = xin.bytes_at(0, 2 * H).view(bf16).reshape(1, H)
        if t.fp4:
            codes, scales = mxfp4_quantize_bf16(row)
        else:
            codes, scales = mx_quantize_bf16(row, FP8_OUT[t.quant], zero_subnormal_blocks=True)
        out.bytes_at(0, t.payload_bytes)[:] = codes.reshape(-1)
        padded = np.zeros(n_scales, np.uint8)
        padded[:scales.size] = scales.reshape(-1)
        out.bytes_at(t.scale_offset, n_scales)[:] = padded

    data = ([("muls", H, bf16), ("cast_fp4", H, bf16)] if t.fp4 else
            [("muls", H, bf16), ("interleave", H, bf16), ("cast_f32", H, np.float32),
             ("cast_fp8", H, np.float32)])
    ctx.vector_seq("quant_mx", [("and", H, bf16), ("max", H // 2, bf16),
                                ("reduce_max_block", H // 2, bf16),
                                *(("scale", n_scales, U16) for _ in range(4)), *data],
                   reads=[xin], writes=[out], fn=None if t.timing_only else effect)
