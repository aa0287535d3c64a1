"""x_active_mask as dispatch (TokenActiveMaskCal, ExpertActiveMaskCal) and combine
(TokenMaskCalCnt, ExpertMaskCalCnt) read it: the same loads and the same first vector
instructions; what each then computes from the rows is its own."""

from __future__ import annotations

import numpy as np

from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32


def active_token_count(ctx: KernelContext, buf, bs: int) -> Wait:
    """A 1-D mask of BS bools: one copy, Cast + Sum, SyncFunc<V_S>. Returns the active
    tokens, which are the first ones."""
    mask = ctx.tensor("x_active_mask")
    yield from ctx.wait(ctx.copy_in(buf, mask, 0, bs, name="copy_mask"))
    ctx.vector_seq(
        "token_mask", [("cast", bs, np.float16), ("sum", bs, np.float16)], reads=[buf]
    )
    yield from ctx.pipe_barrier("vector")
    return int(np.count_nonzero(mask.as_array(np.uint8)))


def copy_mask_rows(ctx: KernelContext, buf, bs: int, K: int, name: str) -> Wait:
    """A 2-D mask [BS, K] into UB rows of Align32(K) bools (a strided copy)."""
    yield from ctx.wait(
        ctx.copy_in(buf, ctx.tensor("x_active_mask"), 0, 0, name=name,
                    strided=Strided(bs, K, dst_gap=align32(K) - K))
    )


def row_sum_instrs(bs: int, K: int) -> list[tuple[str, int, type]]:
    """The rows' first instructions: Cast to half, Sum over each row's K."""
    return [("cast", bs * align32(K), np.float16), ("sum_k", bs * align32(K), np.float16)]
