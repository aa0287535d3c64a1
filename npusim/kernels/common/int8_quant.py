"""The INT8 quantisations of ops-transformer's MoeDistributeDispatch / Combine as their
vector instructions, once for every kernel that runs them: lists of (instruction,
elements, dtype) for ``KernelContext.vector_seq``.

- per token (``QuantDynamicPerToken`` of dispatch): the row's max, a scalar 127 / max,
  then the scaled casts down; ``QuantStatic`` is the casts alone;
- per block of 8 (``Int8QuantProcess`` of combine): block maxima, their scales in the
  token dtype, broadcast and divide, then the casts down.

Cast has no fp32 -> int8 path: the kernels go through half (and, rounding per token,
through int32 first). The numbers themselves are :mod:`npusim.kernels.quant`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.runtime.context import KernelContext

F32, F16 = np.float32, np.float16
Instr = tuple[str, int, Any]


def to_f32_instrs(h: int, smooth: bool = False) -> list[Instr]:
    """The row to fp32, times the smooth scales if the op has them."""
    return [("cast_f32", h, F32)] + ([("mul_scales", h, F32)] if smooth else [])


def to_int8_instrs(h: int) -> list[Instr]:
    """The last two casts of every INT8 quantisation: to half, then to int8."""
    return [("cast_f16", h, F32), ("cast_i8", h, F16)]


def token_max_instrs(h: int, smooth: bool = False) -> list[Instr]:
    """The first half of QuantDynamicPerToken: Cast to fp32, [Mul by the smooth scales],
    Abs, ReduceMax over the row."""
    return [*to_f32_instrs(h, smooth), ("abs", h, F32), ("reduce_max", h, F32)]


def token_cast_instrs(h: int, scaled: bool = True) -> list[Instr]:
    """The second half: [Muls by 127 / max], then fp32 -> int32 -> half -> int8."""
    head = [("muls", h, F32)] if scaled else []
    return [*head, ("cast_i32", h, F32), *to_int8_instrs(h)]


def block_quant_instrs(h: int, n_scales: int) -> list[Instr]:
    """Int8QuantProcess over a row of `h` elements with `n_scales` block scales: Cast, Abs,
    BlockReduceMax per 8 fp32, Muls 1/127, the scales cast to the token dtype, Brcb, Div,
    then fp32 -> half -> int8."""
    per_block = [("muls_recip", n_scales, F32), ("cast_scale", n_scales, F32)]
    maxima = [("abs", h, F32), ("block_reduce_max", h, F32)]
    divide = [("brcb", h, F32), ("div", h, F32)]
    return [*to_f32_instrs(h), *maxima, *per_block, *divide, *to_int8_instrs(h)]


def int8_quant_process(
    ctx: KernelContext, src: Any, out: Any, h: int, n_scales: int, fn: Any
) -> None:
    """Combine's INT8 block quantisation of one row from `src` into `out` (the INT8 row,
    then its scales); `fn` applies the numbers (None: timing only)."""
    ctx.vector_seq("int8_quant", block_quant_instrs(h, n_scales), reads=[src], writes=[out],
                   fn=fn)
