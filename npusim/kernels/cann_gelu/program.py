"""The per-core program of both GeLU kernels, step by step as gelu_without_vf.asc and
gelu_with_vf.asc: CopyIn (DataCopyPad on MTE2), Compute, CopyOut (MTE3), over tiles of
`tile_bytes`, with two-slot in/out queues (PIPELINE_DEPTH = 2)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.hw.ub import UBBuffer
from npusim.hw.vf import VF, VLoop, vi
from npusim.runtime import membase as mb
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div

NEG_SQRT_EIGHT_OVER_PI = np.float32(-1.595769121 * 0.044715)
TANH_APPROX_FACTOR = np.float32(1 / 0.044715)
DEPTH = 2  # PIPELINE_DEPTH of the sample's queues


@dataclass(frozen=True)
class GeluTiling:
    n: int  # elements (numElements = blockLength: one core)
    tile_bytes: int  # tileSize
    vf: bool  # gelu_with_vf (one VF per tile) or gelu_without_vf (MemBase calls)

    @property
    def tile_elems(self) -> int:
        return self.tile_bytes // 4

    def tiles(self) -> list[tuple[int, int]]:
        """(offset, elements) of every tile, the tail tile last."""
        e = self.tile_elems
        out = [(i * e, e) for i in range(self.n // e)]
        if self.n % e:
            out.append((self.n - self.n % e, self.n % e))
        return out


def membase_calls(x: UBBuffer, y: UBBuffer, cube: UBBuffer, t: UBBuffer, n: int) -> list:
    """gelu_compute of gelu_without_vf.asc, barriers included."""
    B = mb.BARRIER
    return [B, mb.binary("mul", cube, x, x, n), B, mb.binary("mul", cube, cube, x, n),
            mb.scalar_op("muls", t, x, TANH_APPROX_FACTOR, n), B,
            mb.binary("add", cube, cube, t, n), B,
            mb.scalar_op("muls", cube, cube, NEG_SQRT_EIGHT_OVER_PI, n), B,
            mb.unary("exp", cube, cube, n), B, mb.scalar_op("adds", cube, cube, 1.0, n), B,
            mb.binary("div", y, x, cube, n), B]


def gelu_vf(n: int, lanes: int) -> VF:
    """gelu_vf of gelu_with_vf.asc: one hardware loop over the registers of the tile."""
    body = (vi("load", "x"), vi("mul", "c", "x", "x"), vi("mul", "c", "c", "x"),
            vi("muls", "t", "x"), vi("add", "c", "c", "t"), vi("muls", "c", "c"),
            vi("exp", "c", "c"), vi("adds", "c", "c"), vi("div", "y", "x", "c"),
            vi("store", None, "y"))
    return VF("gelu_vf", (VLoop(body, ceil_div(n, lanes)),))


def gelu_vf_effect(x: UBBuffer, y: UBBuffer, n: int) -> Callable[[], None]:
    def apply() -> None:
        v = x.view(np.float32, n)
        c = v * v * v + v * TANH_APPROX_FACTOR
        c = np.exp(c * NEG_SQRT_EIGHT_OVER_PI) + np.float32(1.0)
        y.view(np.float32, n)[:] = v / c
    return apply


def gelu_program(t: GeluTiling) -> Callable[[KernelContext], Generator[Any, Any, None]]:
    def program(ctx: KernelContext) -> Generator[Any, Any, None]:
        if ctx.core_id != 0:  # numBlocks = 1
            return
        x_gm, y_gm = ctx.tensor("x"), ctx.tensor("y")
        tb = t.tile_bytes
        x_in = [ctx.alloc(f"x_in{i}", tb) for i in range(DEPTH)]
        y_out = [ctx.alloc(f"y_out{i}", tb) for i in range(DEPTH)]
        cube, tmp = ctx.alloc("x_cube", tb), ctx.alloc("t", tb)
        lanes = ctx.cfg.vector.bytes_per_cycle // 4
        tiles = t.tiles()
        loads: dict[int, Any] = {}
        stores: dict[int, Any] = {}

        def copy_in(i: int) -> None:
            off, n = tiles[i]
            loads[i] = ctx.copy_in(x_in[i % DEPTH], x_gm, off * 4, n * 4, name="copy_in_x")

        with ctx.phase("gelu"):
            copy_in(0)
            for i, (off, n) in enumerate(tiles):
                ctx.loop()
                if i + 1 < len(tiles):  # the next tile's slot was freed by tile i - 1
                    copy_in(i + 1)
                yield from ctx.wait(loads.pop(i))  # DeQue of the x queue
                if i - DEPTH in stores:  # AllocTensor of the y slot: its CopyOut is done
                    yield from ctx.wait(stores.pop(i - DEPTH))
                x, y = x_in[i % DEPTH], y_out[i % DEPTH]
                if t.vf:
                    v = ctx.vf("gelu_vf", gelu_vf(n, lanes), reads=[x], writes=[y],
                               fn=gelu_vf_effect(x, y, n))
                else:
                    v = ctx.membase("gelu_compute", membase_calls(x, y, cube, tmp, n))
                yield from ctx.wait(v)  # DeQue of the y queue
                stores[i] = ctx.copy_out(y_gm, off * 4, y, n * 4, name="copy_out_y")
    return program
