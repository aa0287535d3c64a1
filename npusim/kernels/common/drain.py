"""LocalWindowCopy's flag drain: round robin over a core's status indices until every row
has arrived (``WaitAndFormatOutput`` of the CANN sample and of fullmesh_v2).

The data travels in flagged blocks (SPLIT_BLOCK_SIZE: 480 B of data, then a 32 B float
1.0). Each index with rows left is probed in turn, reading the flags of up to
``max_tokens`` rows (CheckDataArriveWithFlag); the first index whose probe sees every flag
is copied out, and once an index is drained its flags are cleared for the next call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.common.status import SPLIT_BLOCK_DATA_SIZE, SPLIT_BLOCK_SIZE
from npusim.runtime.conditions import AllEqual, Wait
from npusim.runtime.context import KernelContext, Poll, Strided
from npusim.units import ceil_div


def valid_expert_info(cum: np.ndarray, i0: int, i1: int) -> list[list[int]]:
    """SetValidExpertInfo: [index, first output row, finished, left] for each status index
    in [i0, i1) with rows, from the inclusive prefix table."""
    valid = []
    for idx in range(i0, i1):
        start = int(cum[idx - 1]) if idx else 0
        left = int(cum[idx]) - start
        if left:
            valid.append([idx, start, 0, left])
    return valid


def flag_check_ns(ctx: KernelContext, nflags: int) -> float:
    """GatherMask + CompareScalar over the polled flags and a scalar leading-ones scan.

    GatherMask picks element 0 of each 32 B flag block with one repeat per flag (mask 1,
    repeat nflags); CompareScalar covers Align64(nflags) fp32, nflags/64 repeats."""
    return ctx.check_ns(nflags + ceil_div(nflags, 64), instrs=2, scalar=2 + nflags / 64)


def drain_round_robin(ctx: KernelContext, valid: list[list[int]], max_tokens: int,
                      block_of: Callable[[int], int], slot_bytes: int, blocks: int, tbuf: Any,
                      copy_rows: Callable[[int, int, int], Wait],
                      after: Callable[[int, int, bool], Wait]) -> Wait:
    """Drain the rows of ``valid`` (from :func:`valid_expert_info`).

    ``block_of(index)`` is the window block of a status index, whose rows are
    ``slot_bytes`` apart and ``blocks`` flagged blocks long; the probes land in ``tbuf``.
    ``copy_rows(window offset, first output row, rows)`` moves arrived rows out;
    ``after(block, rows finished, drained)`` runs after each copy (the kernels differ in
    where they barrier and how they clear a drained index's flags)."""
    win = ctx.window()
    v = 0
    while valid:
        polls = []
        for idx, _, finish, left in valid:
            n = min(left, max_tokens)
            base = block_of(idx) + finish * slot_bytes
            flags = Strided(blocks * n, 4, src_gap=SPLIT_BLOCK_SIZE - 4, dst_gap=28)
            polls.append(Poll(win, base + SPLIT_BLOCK_DATA_SIZE, AllEqual(np.float32, 1.0),
                              tbuf, strided=flags, check_ns=flag_check_ns(ctx, blocks * n)))
        v = yield from ctx.poll_round_robin(polls, v % len(valid), name="wait_tokens")
        entry = valid[v]
        idx, row0, finish, left = entry
        n = min(left, max_tokens)
        block = block_of(idx)
        yield from copy_rows(block + finish * slot_bytes, row0 + finish, n)
        entry[2], entry[3] = finish + n, left - n
        yield from after(block, entry[2], entry[3] == 0)
        if entry[3] == 0:
            valid.pop(v)
