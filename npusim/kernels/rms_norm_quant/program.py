"""The per-core program of every RmsNormQuant step, following src/0..6 of the sample.

* Steps 0-2 compute with MemBase calls (Compute() of 0_naive.asc): on the 950 the compiler
  fuses them into VFs where the control flow allows (hw/vf.py). Step 0 copies and casts
  gamma for every row, step 1 once; step 2 spreads the rows over the cores.
* Steps 3-6 compute with register-based VFs: ComputeRmsVf and ComputeNormQuantVf (3, 4, 5;
  4 doubles the queues, 5 puts ubFactor rows in UB per loop), and step 6 the binary sum,
  ComputeSquareReduceSum + ComputeRstdVf (Halley's iteration) + a normalisation by
  multiplication.

Queues (TQue with BUF_NUM slots): a row's x copy is issued once its slot is free (the
vector unit finished the row that used it), the vector unit waits for the copy (DeQue), a
y slot is reused once its CopyOut has landed. With one slot MTE2 and the vector unit
alternate; with two the next copy streams while the vector unit works.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from npusim.hw.ub import UBBuffer
from npusim.hw.vf import VF, VLoop, vi
from npusim.kernels.rms_norm_quant.tiling import VL_B32, RnqTiling
from npusim.runtime import membase as mb
from npusim.runtime.context import KernelContext, Strided
from npusim.runtime.membase import convert
from npusim.units import align32, ceil_div

F16, F32, I8 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.int8)


# -- the VFs of steps 3-6, as instructions -------------------------------------------------

def rms_vf(t: RnqTiling, rows: int) -> VF:
    """ComputeRmsVf: per row, accumulate x^2 in a register over the row, then ReduceSum,
    Muls, Adds, Sqrt on one lane and store the first element."""
    body = (vi("load_unpack", "xi"), vi("cast", "x", "xi"), vi("mul", "sq", "x", "x"),
            vi("add", "acc", "acc", "sq"))
    tail = (vi("reduce_sum", "s", "acc"), vi("muls", "s", "s"), vi("adds", "s", "s"),
            vi("sqrt", "s", "s"), vi("store_first", None, "s"))
    per_row = (VLoop((vi("dup", "acc"),)), VLoop(body, t.vf_loops), VLoop(tail))
    return VF("ComputeRmsVf", per_row * rows)


def norm_quant_vf(t: RnqTiling, rows: int, by_rstd: bool) -> VF:
    """ComputeNormQuantVf: per row, broadcast the row's rms (or rstd), then per register
    cast, divide (step 6: multiply), gamma, scale, offset and two conversions to int8."""
    body = (vi("load_unpack", "xi"), vi("cast", "x", "xi"), vi("load", "g"),
            vi("mul" if by_rstd else "div", "n", "x", "rms"), vi("mul", "n", "n", "g"),
            vi("muls", "n", "n"), vi("adds", "n", "n"), vi("cast", "h", "n"),
            vi("cast", "y", "h"), vi("store_pack", None, "y"))
    per_row = (VLoop((vi("load_brc", "rms"),)), VLoop(body, t.vf_loops))
    return VF("ComputeNormQuantVf", per_row * rows)


def square_reduce_vf(t: RnqTiling, rows: int) -> VF:
    """ComputeSquareReduceSum<BINARY_ADD>: the row folded at binaryAddPoint, both halves
    squared and added, one ReduceSum and one stored partial per register; then the
    partials of each row reduced again."""
    fold = (vi("load_unpack", "ai"), vi("cast", "a", "ai"), vi("load_unpack", "bi"),
            vi("cast", "b", "bi"), vi("mul", "a2", "a", "a"), vi("mul", "b2", "b", "b"),
            vi("add", "s", "a2", "b2"), vi("reduce_sum", "s", "s"),
            vi("store_first", None, "s"))
    tail = (vi("load_unpack", "ai"), vi("cast", "a", "ai"), vi("mul", "a2", "a", "a"),
            vi("reduce_sum", "s", "a2"), vi("store_first", None, "s"))
    loops = []
    for _ in range(rows):
        loops.append(VLoop(fold, t.fold_loops))
        if t.fold_tail_loops:
            loops.append(VLoop(tail, t.fold_tail_loops))
    second = VLoop((vi("load", "p"), vi("reduce_sum", "p", "p"), vi("store_first", None, "p")))
    return VF("ComputeSquareReduceSum", (*loops, *(second,) * rows))


def rstd_vf(rows: int) -> VF:
    """ComputeRstdVf: 1/sqrt(var) for up to 64 rows per register by Div + Sqrt, one
    Newton step and one Halley correction, with the two special cases selected."""
    body = (vi("dup", "half"), vi("dup", "inf"), vi("dup", "zero"), vi("dup", "t1"),
            vi("dup", "s"), vi("load", "var"), vi("muls", "var", "var"),
            vi("adds", "var", "var"), vi("div", "r", "one", "var"), vi("sqrt", "y", "r"),
            vi("muls", "t", "var"), vi("mul", "t", "t", "y"), vi("mula", "t1", "t1", "t", "y"),
            vi("mul", "rstd", "y", "t1"), vi("muls", "t3", "var"),
            vi("mula", "s", "s", "t3", "r"), vi("muls", "t4", "rstd"),
            vi("mula", "r", "r", "t4", "rstd"), vi("mula", "s", "s", "var", "r"),
            vi("mul", "s", "s", "rstd"), vi("mula", "rstd", "rstd", "s", "half"),
            vi("cmps", "m0", "var"), vi("select", "rstd", "zero", "rstd", "m0"),
            vi("cmps", "m1", "var"), vi("select", "rstd", "inf", "rstd", "m1"),
            vi("store", None, "rstd"))
    return VF("ComputeRstdVf", (VLoop((vi("dup", "one"),)), VLoop(body, ceil_div(rows, VL_B32))))


# -- their numeric effect on UB --------------------------------------------------------------

def _rows16(x_in: UBBuffer, t: RnqTiling, rows: int) -> np.ndarray:
    """The rows in the x slot as float32, [rows, vf_loops * 64] (masked lanes zero)."""
    ra = t.r_align
    x = x_in.view(F16, rows * ra).reshape(rows, ra)[:, :t.r].astype(F32)
    pad = t.vf_loops * VL_B32 - t.r
    return np.pad(x, ((0, 0), (0, pad))) if pad else x


def _sum_squares(x: np.ndarray) -> np.ndarray:
    """Per row: x^2 accumulated register by register (64 lanes), then the lanes summed."""
    sq = (x * x).reshape(x.shape[0], -1, VL_B32)
    acc = np.zeros((x.shape[0], VL_B32), F32)
    for i in range(sq.shape[1]):
        acc += sq[:, i]
    return acc.sum(axis=1, dtype=F32)


def _binary_sum_squares(x: np.ndarray, t: RnqTiling) -> np.ndarray:
    """Per row: the folded halves squared and added register by register, each register
    reduced to a partial, the partials summed."""
    p = t.binary_add_point
    n = t.fold_loops * VL_B32
    a, b = x[:, :n], np.zeros_like(x[:, :n])
    b[:, :t.r - p] = x[:, p:t.r]
    parts = (a * a + b * b).reshape(x.shape[0], -1, VL_B32).sum(axis=2, dtype=F32)
    if t.fold_tail_loops:
        c = x[:, n:p]
        parts = np.concatenate(
            [parts, (c * c).reshape(x.shape[0], -1, VL_B32).sum(axis=2, dtype=F32)], axis=1)
    return parts.sum(axis=1, dtype=F32)


def halley_rstd(total: np.ndarray, r_inv: np.float32, eps: np.float32) -> np.ndarray:
    """ComputeRstdVf's arithmetic in float32 (Mula a + b * c unfused)."""
    var = total * r_inv + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        r = F32.type(1.0) / var
        y = np.sqrt(r)
        t = (var * F32.type(-0.5)) * y
        t1 = F32.type(1.5) + t * y
        rstd = y * t1
        s = F32.type(1.0) + (var * F32.type(-1.0)) * r
        r = r + (rstd * F32.type(-1.0)) * rstd
        s = (s + var * r) * rstd
        rstd = rstd + s * F32.type(0.5)
    rstd = np.where(var == np.inf, F32.type(0.0), rstd)
    return np.where(var == 0, F32.type(np.inf), rstd).astype(F32)


def quantise(norm: np.ndarray, gamma: np.ndarray, scale: np.float32, offset: np.float32,
             round_mode: str) -> np.ndarray:
    v = norm * gamma * scale + offset
    return convert(convert(v, F16, round_mode), I8, round_mode)


def vf_effect(t: RnqTiling, rows: int, x_in: UBBuffer, gamma32: UBBuffer, rms: UBBuffer,
              y_out: UBBuffer, scale: np.float32, offset: np.float32) -> Callable[[], None]:
    r_inv, eps = F32.type(1.0 / t.r), F32.type(t.eps)

    def apply() -> None:
        x = _rows16(x_in, t, rows)
        if t.step == 6:
            per_row = halley_rstd(_binary_sum_squares(x, t), r_inv, eps)
            norm = x * per_row[:, None]
        else:
            per_row = np.sqrt(_sum_squares(x) * r_inv + eps)
            norm = x / per_row[:, None]
        rms.view(F32, rows)[:] = per_row
        g = gamma32.view(F32, t.r)
        y = quantise(norm[:, :t.r], g, scale, offset, "trunc")
        y_out.view(I8, rows * t.r_align).reshape(rows, t.r_align)[:, :t.r] = y
    return apply


# -- the program ---------------------------------------------------------------------------

def membase_compute(t: RnqTiling, b: dict[str, UBBuffer], x_in: UBBuffer, y_out: UBBuffer,
                    scale: float, offset: float) -> list:
    """Compute() of src/0..2: the MemBase calls of one row, in order."""
    r = t.r
    x32, g32, rms, red = b["x32"], b["gamma32"], b["rms"], b["reduce"]
    calls = [mb.cast(g32, F32, b["gamma_in"], F16, r)] if t.step == 0 else []
    return calls + [
        mb.cast(x32, F32, x_in, F16, r),
        mb.binary("mul", rms, x32, x32, r),
        mb.reduce_sum(red, rms, r),
        mb.dup(rms, red, r),
        mb.scalar_op("muls", rms, rms, 1.0 / r, r),
        mb.scalar_op("adds", rms, rms, t.eps, r),
        mb.unary("sqrt", rms, rms, r),
        mb.binary("div", x32, x32, rms, r),
        mb.binary("mul", rms, x32, g32, r),
        mb.scalar_op("muls", rms, rms, scale, r),
        mb.scalar_op("adds", rms, rms, offset, r),
        mb.cast(rms, F16, rms, F32, r, "none"),
        mb.cast(y_out, I8, rms, F16, r, "rint"),
    ]


def rnq_program(t: RnqTiling) -> Callable[[KernelContext], Generator[Any, Any, None]]:
    def program(ctx: KernelContext) -> Generator[Any, Any, None]:
        core = ctx.core_id
        if core >= t.cores:
            return
        with ctx.phase("init"):
            scale = F32.type(ctx.gm_read_scalar(ctx.tensor("scale"), 0, F16))
            offset = F32.type(ctx.gm_read_scalar(ctx.tensor("offset"), 0, I8))
            x_in, y_out, b = _alloc(ctx, t)
        if t.step >= 1:  # CopyInGamma once: copy, DeQue, Cast to float32
            with ctx.phase("gamma"):
                yield from ctx.wait(_copy_gamma(ctx, t, b))
                ctx.membase("cast_gamma", [mb.cast(b["gamma32"], F32, b["gamma_in"], F16, t.r)])
        with ctx.phase("rows"):
            yield from _rows(ctx, t, core, x_in, y_out, b, (scale, offset))
    return program


def _alloc(ctx: KernelContext, t: RnqTiling
           ) -> tuple[list[UBBuffer], list[UBBuffer], dict[str, UBBuffer]]:
    """Init's UB buffers: BUF_NUM x and y slots of ubFactor rows, gamma's, and the step's
    work buffers (tiling.ub_bytes_needed counts these allocations)."""
    ra, uf = t.r_align, t.ub_factor
    x_in = [ctx.alloc(f"x_in{i}", ra * 2 * uf) for i in range(t.buf_num)]
    y_out = [ctx.alloc(f"y_out{i}", ra * uf) for i in range(t.buf_num)]
    b = {"gamma_in": ctx.alloc("gamma_in", ra * 2), "gamma32": ctx.alloc("gamma32", ra * 4)}
    if t.step <= 2:
        b["x32"] = ctx.alloc("x32", ra * 4)
        b["rms"] = ctx.alloc("rms", ra * 4)
        b["reduce"] = ctx.alloc("reduce", 32)
    else:
        per_row = VL_B32 * 4 if t.step == 6 else 4
        b["rms"] = ctx.alloc("rms", max(32, align32(uf * per_row)))
    return x_in, y_out, b


def _copy_gamma(ctx: KernelContext, t: RnqTiling, b: dict[str, UBBuffer]) -> Any:
    return ctx.copy_in(b["gamma_in"], ctx.tensor("gamma"), 0, t.r * 2, name="copy_in_gamma")


def _compute(ctx: KernelContext, t: RnqTiling, n: int, xs: UBBuffer, ys: UBBuffer,
             b: dict[str, UBBuffer], quant: tuple[np.float32, np.float32]) -> Any:
    """Compute() of n rows: the MemBase calls of steps 0-2, or the VFs of steps 3-6."""
    scale, offset = quant
    if t.step <= 2:
        return ctx.membase("compute", membase_compute(t, b, xs, ys, scale, offset))
    vfs = [square_reduce_vf(t, n), rstd_vf(n)] if t.step == 6 else [rms_vf(t, n)]
    vfs.append(norm_quant_vf(t, n, by_rstd=t.step == 6))
    return ctx.vf("compute", vfs, reads=[xs, b["gamma32"]], writes=[ys, b["rms"]],
                  fn=vf_effect(t, n, xs, b["gamma32"], b["rms"], ys, scale, offset))


def _rows(ctx: KernelContext, t: RnqTiling, core: int, x_in: list[UBBuffer],
          y_out: list[UBBuffer], b: dict[str, UBBuffer],
          quant: tuple[np.float32, np.float32]) -> Generator[Any, Any, None]:
    """The core's rows in chunks of ubFactor through the BUF_NUM queue slots: a chunk's x
    copy is issued once its slot is free (with one slot after the previous CopyOut, with
    two ahead of the compute), its y slot reused once that slot's CopyOut landed."""
    x_gm, y_gm = ctx.tensor("x"), ctx.tensor("y")
    r, ra, uf, rows_here = t.r, t.r_align, t.ub_factor, t.rows(core)
    base = core * t.block_factor
    chunks = [(row, min(uf, rows_here - row)) for row in range(0, rows_here, uf)]
    loads: dict[int, list[Any]] = {}
    stores: dict[int, Any] = {}

    def copy_x(i: int) -> None:
        row, n = chunks[i]
        ops = [_copy_gamma(ctx, t, b)] if t.step == 0 else []
        gaps = Strided(n, r * 2, 0, (ra - r) * 2) if n > 1 and ra != r else None
        ops.append(ctx.copy_in(x_in[i % t.buf_num], x_gm, (base + row) * r * 2,
                               n * r * 2, name="copy_in_x", strided=gaps))
        loads[i] = ops

    copy_x(0)
    for i, (row, n) in enumerate(chunks):
        ctx.loop()
        if t.buf_num > 1 and i + 1 < len(chunks):
            copy_x(i + 1)
        yield from ctx.wait(*loads.pop(i))  # DeQue x (and gamma)
        if i - t.buf_num in stores:  # AllocTensor y: the slot's CopyOut landed
            yield from ctx.wait(stores.pop(i - t.buf_num))
        xs, ys = x_in[i % t.buf_num], y_out[i % t.buf_num]
        yield from ctx.wait(_compute(ctx, t, n, xs, ys, b, quant))  # DeQue y
        gaps = Strided(n, r, (ra - r), 0) if n > 1 and ra != r else None
        stores[i] = ctx.copy_out(y_gm, (base + row) * r, ys, n * r, name="copy_out_y",
                                 strided=gaps)
        if t.buf_num == 1 and i + 1 < len(chunks):
            copy_x(i + 1)
