"""The 950's send split of the multi-round combine (cam_moe_combine_normal_multi_round.h,
InitTokenBalancedRoundSendDataA5): where the A3 gives each core whole (local expert, source
rank) blocks of ep_recv_count, the 950 splits the received rows evenly over the cores
(SplitCoreCal) and gives each core the pieces of the blocks its rows fall in."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I32 = np.int32
SCALAR_PER_EXPERT = 6  # the block's start and end, the segment's clamps, the test


def token_balanced_blocks(ctx: KernelContext, t: DeepepTiling) -> Any:
    """ep_recv_count (E ints) GM -> UB; the core's rows [flatStart, flatEnd) of
    selfSendCnt = ep_recv_count[E - 1]; two scalar passes over the E blocks, the first
    counting the core's segments, the second writing each segment's first row
    (roundSendOffset) and length (roundNeedSendCnt). -> (offsets, counts, rows), or None
    for a core without rows."""
    E = t.E
    counts_buf = ctx.alloc("temp_recv_count", align_up(4 * E, 32))
    yield from ctx.wait(ctx.copy_in(counts_buf, ctx.tensor("ep_recv_count"), 0, 4 * E))
    ends = [int(v) for v in ctx.ub_read(counts_buf, I32, E, ops=0)]
    ctx.scalar(2)  # selfSendCnt, SplitCoreCal
    r0, r1 = split_to_core(ends[-1], ctx.num_cores, ctx.core_id)
    if r1 <= r0:
        return None
    offsets, counts = [], []
    for e in range(E):
        start = ends[e - 1] if e else 0
        lo, hi = max(r0, start), min(r1, ends[e])
        if lo < hi:
            offsets.append(lo)
            counts.append(hi - lo)
    ctx.loop(2 * E)
    ctx.scalar(2 * SCALAR_PER_EXPERT * E + 2 * len(offsets))
    ctx.alloc("round_need_send_cnt", align_up(4 * len(offsets), 32))
    ctx.alloc("round_send_offset", align_up(4 * len(offsets), 32))
    return offsets, counts, r1 - r0
