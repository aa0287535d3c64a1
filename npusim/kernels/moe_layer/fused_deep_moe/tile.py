"""An epilogue tile's inputs, shared by GMM1's and GMM2's per-token-dequant epilogues
(catlass BlockEpilogue: copyGmToUbC, copyGmToUbScale, copyGmToUbPerTokenScale): the int32
rows from the ring slot, the tile's per-column scales and the rows' per-token scales."""

from __future__ import annotations

from typing import Any

from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext


class TileInputs:
    def __init__(self, ctx: KernelContext, rows: int, cols: int) -> None:
        self.acc = ctx.alloc("ub_c", rows * cols * 4)
        self.scale = ctx.alloc("ub_scale", cols * 4)
        self.token = ctx.alloc("ub_per_token_scale", rows * 4)

    def load(self, ctx: KernelContext, ring_at: int, scale_gm: Any, scale_at: int,
             token_gm: Any, row: int, r: int, cols: int) -> Wait:
        """The three copies in, then the wait for them (the epilogue's MTE2_V flags)."""
        ops = [ctx.copy_in(self.acc, ctx.tensor("cv_swap"), ring_at, r * cols * 4,
                           name="copy_gm_to_ub_c"),
               ctx.copy_in(self.scale, scale_gm, scale_at, cols * 4,
                           name="copy_gm_to_ub_scale"),
               ctx.copy_in(self.token, token_gm, row * 4, r * 4,
                           name="copy_gm_to_ub_per_token_scale")]
        yield from ctx.wait(*ops)
