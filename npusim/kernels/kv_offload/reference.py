"""What one decode step of GatherSelectionKvCache does to one query row, in numpy: the
vec kernel's rules (gather_selection_kv_cache_split_bs_reuse_vec.h, ProcessGatherTopK)
for H = 1 and a topk block of one token, which are the golden's
(ops/ascendc/examples/test_npu_gather_selection_kv_cache.py, gather_info_gen and
do_golden_gen) wherever the golden's test reaches.

For query q of a sequence of S queries, which sees `visible` tokens (the sequence's
length less the S - 1 - q queries after it):

* the valid ids are this step's topk ids in [0, visible - 1], in topk order
  (GatherValidTopk: a mask and GatherMask, so an id past the range or a -1 is dropped
  wherever it sits);
* an id the row's status holds is a hit and stays in its slot, if it is at most
  max(visible - 1 - q - 1, 0) (FindTopkHit's maxValidCacheId: the tokens before this
  step's queries);
* hits left in slots at or past the new valid count move down into free slots (a copy
  within the row's selection pool, CopyFromSelKv);
* every other id is a miss, copied from the full cache into the first free slot, in topk
  order (CopyFromFullKv);
* the status then lists the slots' ids, -1 past the count, and the count last.

The kernel compares a query only with its own status row: its FindTopkHit loop runs
over the row's heads (one) with the row's own query, so it never takes a row from
another query's or another sequence's pool (the golden's cross-query branch is never
reached by its test, whose topk is all new). PostHandleTopk (the tail block's swap)
returns at once for a topk block of one token, the only size the kernel runs above 32 ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Move:
    """One row the step writes: into `slot`, from the full cache (token `token`) or from
    selection slot `from_slot` of the same row (a hit moved down)."""

    slot: int
    token: int
    from_slot: int = -1


def valid_ids(topk_row: np.ndarray, visible: int) -> list[int]:
    """GatherValidTopk: the ids in [0, visible - 1], in topk order."""
    return [int(g) for g in topk_row if 0 <= g <= visible - 1]


def plan(topk_row: np.ndarray, status_row: np.ndarray, visible: int, q: int = 0
         ) -> tuple[list[Move], np.ndarray, int, int]:
    """(moves in order, the new status row, valid count, hits) of query row q."""
    topk = topk_row.size
    valid = valid_ids(topk_row, visible)
    cached = max(visible - 1 - q - 1, 0)
    slot_of: dict[int, int] = {}
    for j in range(topk):
        g = int(status_row[j])
        if g >= 0 and g not in slot_of:
            slot_of[g] = j
    holder = np.full(topk, -1, np.int64)  # slot -> the valid index that keeps it
    for i, g in enumerate(valid):
        if g <= cached and g in slot_of:
            holder[slot_of[g]] = i
    kept = np.flatnonzero(holder >= 0)
    top = int(kept.max()) if kept.size else -1
    moved: dict[int, int] = {}  # valid index -> the slot it moves from
    empty = top + 1 - len(valid)
    seen = 0
    for j in range(top, -1, -1):
        if seen >= empty:
            break
        if holder[j] >= 0:
            moved[int(holder[j])] = j
            holder[j] = -1
        seen += 1
    keeping = {int(i) for i in holder[holder >= 0]}
    hits = len(keeping) + len(moved)
    status = status_row.copy()
    moves: list[Move] = []
    cursor = 0
    for i, g in enumerate(valid):
        if i in keeping:
            continue
        free = np.flatnonzero(holder[cursor:] < 0)
        slot = cursor + int(free[0])
        cursor = slot + 1
        moves.append(Move(slot, g, moved.get(i, -1)))
        status[slot] = g
    status[len(valid):topk] = -1
    status[topk] = len(valid)
    return moves, status, len(valid), hits


def gather(sel: np.ndarray, full: np.ndarray, moves: list[Move],
           sel_row: Callable[[int], int], full_row: Callable[[int], int]) -> None:
    """Apply one row's moves to a selection array [rows, bytes] in order (sel_row(slot)
    and full_row(token) give the row indices)."""
    for m in moves:
        src = sel[sel_row(m.from_slot)].copy() if m.from_slot >= 0 else full[full_row(m.token)]
        sel[sel_row(m.slot)] = src
