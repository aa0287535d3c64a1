"""What one decode step of GatherSelectionKvCache does, in numpy: the golden's same-sequence
reuse (ops/ascendc/examples/test_npu_gather_selection_kv_cache.py, do_golden_gen and
gather_info_gen) for S = 1, H = 1 and a topk block of one token.

For one sequence: the valid ids are this step's topk up to the first -1, without ids past
the sequence; an id the status already holds (in a slot below its valid count) is a hit
and stays where it is; hits left in slots at or past the new valid count are moved into
free slots (a copy within the selection cache); every other id is a miss, copied from the
full cache into the first free slot, in topk order. The status then lists the slot
contents, -1 past the valid count, and the count last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Move:
    """One row the step writes: into `slot`, from the full cache (token `token`) or from
    selection slot `from_slot` (a hit moved down)."""

    slot: int
    token: int
    from_slot: int = -1


def plan(topk_row: np.ndarray, status_row: np.ndarray, kv_len: int
         ) -> tuple[list[Move], np.ndarray, int, int]:
    """(moves in order, the new status row, valid count, hits) of one sequence."""
    topk = topk_row.size
    valid: list[int] = []
    for g in topk_row:
        if g < 0:
            break
        if g <= kv_len - 1:
            valid.append(int(g))
    old_len = int(status_row[topk])
    slot_of: dict[int, int] = {}
    for j in range(max(0, min(old_len, topk))):
        g = int(status_row[j])
        if g >= 0 and g not in slot_of:
            slot_of[g] = j
    holder = np.full(topk, -1, np.int64)  # slot -> the topk index that keeps it
    for i, g in enumerate(valid):
        if g in slot_of:
            holder[slot_of[g]] = i
    kept = np.flatnonzero(holder >= 0)
    top = int(kept.max()) if kept.size else -1
    moved: dict[int, int] = {}
    empty = top + 1 - len(valid)
    seen = 0
    for j in range(top, -1, -1):
        if seen >= empty:
            break
        if holder[j] >= 0:
            moved[int(holder[j])] = j
            holder[j] = -1
        seen += 1
    status = status_row.copy()
    moves: list[Move] = []
    cursor = 0
    hits = int((holder >= 0).sum()) + len(moved)
    for i, g in enumerate(valid):
        if g in slot_of and i not in moved:
            continue
        free = np.flatnonzero(holder[cursor:] < 0)
        slot = cursor + int(free[0])
        cursor = slot + 1
        moves.append(Move(slot, g, moved.get(i, -1)))
        status[slot] = g
    status[len(valid):topk] = -1
    status[topk] = len(valid)
    return moves, status, len(valid), hits


def gather(sel: np.ndarray, full: np.ndarray, moves: list[Move], sel_row, full_row) -> None:
    """Apply one sequence's moves to a selection array [rows, bytes] in order (sel_row(slot)
    and full_row(token) give the row indices)."""
    for m in moves:
        src = sel[sel_row(m.from_slot)].copy() if m.from_slot >= 0 else full[full_row(m.token)]
        sel[sel_row(m.slot)] = src
