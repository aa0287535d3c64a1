"""npu_swiglu on the 950's AIVs (ops-nn activation/swi_glu, dim -1, bf16): out = silu(a) x b
with a the first half of each row, b the second.

The tiling is the host's (swi_glu_tiling.cpp, :func:`~npusim.kernels.moe_layer.a5.tiling.
swiglu_tiling`); the kernel's source is not public (ops-nn publishes the host tiling, the
docs and the golden only), so its walk is assumed: tile i (row-major over baseRowLen x
baseColLen tiles of the output) on core i mod cores, each tile: MTE2 both halves' slices
in, Cast to fp32, silu as a / (1 + exp(-a)) (Muls, Exp, Adds, Div), Mul by b, Cast to bf16
(RINT), MTE3 out; queues double buffered as the tiling says (isDoubleBuffer), so the next
tile's loads run under this one's compute. The numbers are mega_moe's swiglu epilogue
(npusim/kernels/mega_moe/mx.py swiglu): fp32 then one rounding to bf16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.formats import BF16
from npusim.kernels.mega_moe import mx
from npusim.kernels.moe_layer.a5.tiling import SwigluTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import ceil_div

F32 = np.float32


def swiglu_tiles(t: SwigluTiling, core: int) -> list[tuple[int, int, int, int]]:
    """This core's tiles as (first row, rows, first column, columns) of the output."""
    n_cols = ceil_div(t.cols, t.base_cols)
    out = []
    for i in range(core, t.tiles, t.cores):
        ri, ci = divmod(i, n_cols)
        r0, c0 = ri * t.base_rows, ci * t.base_cols
        out.append((r0, min(t.base_rows, t.rows - r0), c0, min(t.base_cols, t.cols - c0)))
    return out


def swiglu_program(t: SwigluTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        x, y = ctx.tensor("x"), ctx.tensor("y")
        tiles = swiglu_tiles(t, ctx.core_id)
        depth = 2 if t.double_buffer else 1
        size = t.base_rows * t.base_cols
        a = [ctx.alloc(f"in_a{p}", size * 2) for p in range(depth)]
        b = [ctx.alloc(f"in_b{p}", size * 2) for p in range(depth)]
        o = [ctx.alloc(f"out{p}", size * 2) for p in range(depth)]
        ctx.alloc("tmp", size * 8)  # the two fp32 TBufs
        w = 2 * t.cols  # x's row, elements

        def load(i: int) -> list:
            r0, rows, c0, cols = tiles[i]
            p = i % depth
            gap = (w - cols) * 2
            return [ctx.copy_in(a[p], x, (r0 * w + c0) * 2, rows * cols * 2, name="copy_in_a",
                                strided=Strided(rows, cols * 2, gap, 0)),
                    ctx.copy_in(b[p], x, (r0 * w + t.cols + c0) * 2, rows * cols * 2,
                                name="copy_in_b", strided=Strided(rows, cols * 2, gap, 0))]
        stores: list = [None] * depth
        with ctx.phase("process"):
            loads = {0: load(0)} if tiles else {}
            for i, (r0, rows, c0, cols) in enumerate(tiles):
                p = i % depth
                if depth == 2 and i + 1 < len(tiles):
                    if stores[(i + 1) % 2] is not None:
                        yield from ctx.wait(stores[(i + 1) % 2])
                    loads[i + 1] = load(i + 1)
                yield from ctx.wait(*loads.pop(i))
                if stores[p] is not None:
                    yield from ctx.wait(stores[p])
                n = rows * cols

                def compute(p: int = p, n: int = n) -> None:
                    o[p].view(BF16, n)[:] = mx.swiglu(a[p].view(BF16, n), b[p].view(BF16, n))
                op = ctx.vector_seq("swiglu", [
                    ("cast_f32", n, BF16), ("cast_f32", n, BF16), ("muls", n, F32),
                    ("exp", n, F32), ("adds", n, F32), ("div", n, F32), ("mul", n, F32),
                    ("cast_bf16", n, F32)], reads=[a[p], b[p]], writes=[o[p]], fn=compute)
                yield from ctx.wait(op)
                stores[p] = ctx.copy_out(y, (r0 * t.cols + c0) * 2, o[p], n * 2,
                                         name="copy_out",
                                         strided=Strided(rows, cols * 2, 0, (t.cols - cols) * 2))
                if depth == 1:
                    yield from ctx.wait(stores[p])
                    if i + 1 < len(tiles):
                        loads[i + 1] = load(i + 1)
            yield from ctx.wait(*[s for s in stores if s is not None])
    return program
