"""MemBase (basic Ascend C API) calls on UB buffers: what each computes, as numpy.

A kernel lists its calls as the sample source does, with `BARRIER` where the source has
PipeBarrier<PIPE_V>, and hands the list to `ctx.membase`. Each call carries its numeric
effect (applied to the UB bytes in program order) and its timing descriptor
(`npusim.hw.vf.Call`); how it is timed is the hardware's business (hw/vf.py).

Arithmetic is IEEE float32 (numpy), as the vector unit's fp32 lanes. Conversions follow
the API's round modes: to float16 round-to-nearest-even ("rint"/"none") or toward zero
("trunc"); to int8 rint or trunc, saturating to [-128, 127] (assumed: the sample's own
check against gen_data.py's clip passes only if the conversion saturates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.hw.ub import UBBuffer
from npusim.hw.vf import BARRIER, Call, Operand

__all__ = ["BARRIER", "Api", "binary", "cast", "convert", "dup", "reduce_sum", "scalar_op",
           "unary"]

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "max": np.maximum, "min": np.minimum}
_SCALAR = {"adds": np.add, "muls": np.multiply, "maxs": np.maximum, "mins": np.minimum}
_UNARY = {"exp": np.exp, "sqrt": np.sqrt, "abs": np.abs, "ln": np.log}


@dataclass(frozen=True)
class Src:
    buf: UBBuffer
    dtype: np.dtype
    first_only: bool = False


@dataclass(frozen=True)
class Api:
    """One MemBase call: kind, destination (buffer, dtype), sources, element count."""

    kind: str
    dst: UBBuffer
    dst_dtype: np.dtype
    srcs: tuple[Src, ...]
    count: int
    scalar: float = 0.0
    round: str = "none"

    def call(self) -> Call:
        """The timing descriptor: operands by buffer and element size."""
        return Call(self.kind, Operand(self.dst.name, self.dst_dtype.itemsize),
                    tuple(Operand(s.buf.name, s.dtype.itemsize, s.first_only)
                          for s in self.srcs), self.count)

    def apply(self) -> None:
        n = self.count
        ins = [s.buf.view(s.dtype, 1 if s.first_only else n) for s in self.srcs]
        out = self.dst.view(self.dst_dtype, 1 if self.kind in ("reduce_sum",) else n)
        f32 = np.float32
        if self.kind == "cast":
            out[:] = convert(ins[0], self.dst_dtype, self.round)
        elif self.kind in _BINARY:
            out[:] = _BINARY[self.kind](ins[0].astype(f32), ins[1].astype(f32))
        elif self.kind in _SCALAR:
            out[:] = _SCALAR[self.kind](ins[0].astype(f32), f32(self.scalar))
        elif self.kind in _UNARY:
            out[:] = _UNARY[self.kind](ins[0].astype(f32))
        elif self.kind == "reduce_sum":
            out[0] = np.sum(ins[0], dtype=f32)
        elif self.kind == "dup":
            out[:] = ins[0][0]
        else:
            raise ValueError(f"MemBase call {self.kind!r} has no numeric semantics")


def convert(x: np.ndarray, dtype: np.dtype, round_mode: str) -> np.ndarray:
    """Cast with the API's round mode (see the module docstring)."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        y = x.astype(np.float16)
        if round_mode == "trunc":  # one step toward zero where rounding went away from it
            away = np.abs(y.astype(np.float32)) > np.abs(x.astype(np.float32))
            y[away] = np.nextafter(y[away], np.float16(0))
        return y
    if dtype.kind == "f":
        return x.astype(dtype)
    info = np.iinfo(dtype)
    v = x.astype(np.float32)
    v = np.trunc(v) if round_mode == "trunc" else np.rint(v)
    return np.clip(v, info.min, info.max).astype(dtype)


def _dt(dtype: Any) -> np.dtype:
    return np.dtype(dtype)


def cast(dst: UBBuffer, dst_dtype: Any, src: UBBuffer, src_dtype: Any, count: int,
         round_mode: str = "none") -> Api:
    return Api("cast", dst, _dt(dst_dtype), (Src(src, _dt(src_dtype)),), count,
               round=round_mode)


def binary(kind: str, dst: UBBuffer, a: UBBuffer, b: UBBuffer, count: int,
           dtype: Any = np.float32) -> Api:
    if kind not in _BINARY:
        raise ValueError(f"unknown binary MemBase call {kind!r}")
    d = _dt(dtype)
    return Api(kind, dst, d, (Src(a, d), Src(b, d)), count)


def scalar_op(kind: str, dst: UBBuffer, src: UBBuffer, value: float, count: int,
              dtype: Any = np.float32) -> Api:
    if kind not in _SCALAR:
        raise ValueError(f"unknown tensor-scalar MemBase call {kind!r}")
    d = _dt(dtype)
    return Api(kind, dst, d, (Src(src, d),), count, scalar=value)


def unary(kind: str, dst: UBBuffer, src: UBBuffer, count: int, dtype: Any = np.float32) -> Api:
    if kind not in _UNARY:
        raise ValueError(f"unknown unary MemBase call {kind!r}")
    d = _dt(dtype)
    return Api(kind, dst, d, (Src(src, d),), count)


def reduce_sum(dst: UBBuffer, src: UBBuffer, count: int, dtype: Any = np.float32) -> Api:
    d = _dt(dtype)
    return Api("reduce_sum", dst, d, (Src(src, d),), count)


def dup(dst: UBBuffer, src: UBBuffer, count: int, dtype: Any = np.float32) -> Api:
    """Duplicate the first element of `src` (a reduced value in UB) into `count` elements."""
    d = _dt(dtype)
    return Api("dup", dst, d, (Src(src, d, first_only=True),), count)
