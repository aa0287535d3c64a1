"""npu_dynamic_mx_quant on the 950's AIVs (ops-nn quant/dynamic_mx_quant, last axis, block
32, fp8 out; the tail-axis template, which dynamic_mx_quant_tiling_arch35.cpp picks for
a last-axis, block-32 call, IsTailAxisAndBlockSize32): y fp8 and one E8M0 scale per 32
elements of each row.

The tiling is the host's (dynamic_mx_quant_tail_axis_tiling_arch35.cpp,
:func:`~npusim.kernels.moe_layer.a5.tiling.mx_quant_tiling`): a rowTileNum x colTileNum grid
of cores, core c at (c // colTileNum, c mod colTileNum) (assumed: the kernel's index
arithmetic is not read here), each taking its rows in UB passes of maxUbBlockNum 32-element
blocks, double buffered. The numbers are npusim's 950 MX quantiser
(npusim.kernels.quant.mx_quantize_bf16: ComputeMaxExp, ComputeScale, ComputeFp8Data, as
mega_moe's requant and DeepEP's A5 dispatch run it): the scale rule of the op's
documentation (docs/aclnnDynamicMxQuant.md, scaleAlg 0: 2^(floor(log2 amax) - emax),
elements cast rint; its worked example is a test). Saturation of the values past the fp8
maximum is assumed (the documentation does not say).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.formats import BF16
from npusim.kernels.moe_layer.a5.tiling import MxQuantTiling
from npusim.kernels.quant import mx_quantize_bf16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import ceil_div

MX = 32


def quant_passes(t: MxQuantTiling, core: int) -> list[tuple[int, int, int, int]]:
    """This core's UB passes as (first row, rows, first column, columns)."""
    ri, ci = divmod(core, t.col_tiles)
    r0, c0 = ri * t.row_block, ci * t.col_block
    rows, cols = min(t.row_block, t.rows - r0), min(t.col_block, t.cols - c0)
    if rows <= 0 or cols <= 0:
        return []
    width = min(cols, t.ub_blocks * MX)
    per = max(1, t.ub_blocks // ceil_div(width, MX))
    return [(r, min(per, r0 + rows - r), c, min(width, c0 + cols - c))
            for r in range(r0, r0 + rows, per) for c in range(c0, c0 + cols, width)]


def mx_quant_program(t: MxQuantTiling, mode: str) -> Any:
    def program(ctx: KernelContext) -> Wait:
        x, y, s = ctx.tensor("x"), ctx.tensor("y"), ctx.tensor("scale")
        passes = quant_passes(t, ctx.core_id)
        most = max((r * c for _, r, _, c in passes), default=MX)
        xin = [ctx.alloc(f"x{p}", most * 2) for p in range(2)]
        out = [ctx.alloc(f"y{p}", most + most // MX) for p in range(2)]
        stores: list[list] = [[], []]
        with ctx.phase("process"):
            loads = {}
            for i, (r0, rows, c0, cols) in enumerate(passes):
                p = i % 2
                if i == 0:
                    loads[0] = _load(ctx, t, x, xin[0], passes[0])
                if i + 1 < len(passes):
                    loads[i + 1] = _load(ctx, t, x, xin[(i + 1) % 2], passes[i + 1])
                yield from ctx.wait(*loads.pop(i), *stores[p])
                n = rows * cols

                def compute(p: int = p, rows: int = rows, cols: int = cols, n: int = n) -> None:
                    codes, scales = mx_quantize_bf16(
                        xin[p].view(BF16, n).reshape(rows, cols), mode)
                    raw = out[p].view(np.uint8, n + n // MX)
                    raw[:n] = codes.reshape(-1)
                    raw[n:] = scales.reshape(-1)
                op = ctx.vector_seq("dynamic_mx_quant", [
                    ("compute_max_exp", n, BF16), ("compute_scale", n // MX, np.uint16),
                    ("compute_fp8_data", n, np.float32)], reads=[xin[p]], writes=[out[p]],
                    fn=compute)
                yield from ctx.wait(op)
                sc = t.cols // MX
                stores[p] = [
                    ctx.copy_out(y, r0 * t.cols + c0, out[p], n, name="copy_out_y",
                                 strided=Strided(rows, cols, 0, t.cols - cols)),
                    ctx.copy_out(s, r0 * sc + c0 // MX, out[p], n // MX, src_offset=n,
                                 name="copy_out_scale",
                                 strided=Strided(rows, cols // MX, 0, sc - cols // MX))]
            yield from ctx.wait(*stores[0], *stores[1])
    return program


def _load(ctx: KernelContext, t: MxQuantTiling, x: Any, buf: Any,
          p: tuple[int, int, int, int]) -> list:
    r0, rows, c0, cols = p
    return [ctx.copy_in(buf, x, (r0 * t.cols + c0) * 2, rows * cols * 2, name="copy_in_x",
                        strided=Strided(rows, cols * 2, (t.cols - cols) * 2, 0))]
