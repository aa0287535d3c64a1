"""QuantProcess, the per-token dynamic quantisation of the normal dispatch's InputToShare
(cam_moe_dispatch_normal.h; the 950's cam_moe_dispatch_normal_a5.h for INT8 and per-token
FP8): Cast to fp32, Abs, ReduceMaxInplace, the scale qmax / max on the scalar unit, Muls,
then the casts to the output type; the fp32 scale 1 / d at the tiling's scale offset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.context import KernelContext

F32 = np.float32
INT8_CASTS = (("cast_i32", F32), ("cast_f16", F32), ("cast_i8", np.float16))
"""fp32 -> int32 (RINT), int32 -> half, half -> int8."""


def quant_process(ctx: KernelContext, t: DeepepTiling, xin: Any, out: Any,
                  casts: tuple[tuple[str, Any], ...],
                  quantize: Callable[[np.ndarray], tuple[np.ndarray, Any]]) -> None:
    """The vector steps and their effect: `quantize(row)` -> (codes, scale) of one token."""
    H = t.H
    dt = t.shape.np_dtype

    def effect() -> None:
        q, s = quantize(xin.bytes_at(0, H * dt.itemsize).view(dt))
        out.bytes_at(0, t.payload_bytes)[:] = np.ascontiguousarray(q).reshape(-1).view(np.uint8)
        out.bytes_at(t.scale_offset, 4)[:] = np.asarray(s, F32).reshape(1).view(np.uint8)

    ctx.vector_seq("reduce_max", [("cast_f32", H, F32), ("abs", H, F32), ("max", H, F32),
                                  ("whole_reduce_max", 64, F32)], reads=[xin])
    ctx.scalar(4)  # SyncFunc<V_S>, the scale, SyncFunc<S_V>
    ctx.vector_seq("quant", [("muls", H, F32), *((n, H, d) for n, d in casts)], reads=[xin],
                   writes=[out], fn=None if t.timing_only else effect)
    ctx.scalar(1)  # SetValue of the scale
