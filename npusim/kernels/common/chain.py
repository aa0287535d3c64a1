"""The dispatch -> combine chain: what combine reads of dispatch, and its digest.

Between the two kernels the hardware runs the experts; combine reads dispatch's counts,
its assist info and the rows up to the count. The driver (npusim/sim.py) may simulate
combine in a second process on the reference dispatch's outputs and keeps that result
only if the simulated dispatch wrote the same bytes combine reads: the digest below.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from npusim.hw.memory import RowTable

Arrays = Mapping[str, np.ndarray]


def last_count(_rank: int, counts: np.ndarray) -> int:
    """Rows a rank received: the inclusive prefix's last entry (0 without entries)."""
    return int(counts[-1]) if counts.size else 0


def next_reads_digest(outputs: Sequence[Arrays], counts: str, rows: Sequence[str],
                      received: Callable[[int, np.ndarray], int] = last_count) -> bytes:
    """A hash of what combine reads of dispatch's outputs: per rank the counts (int32)
    and the first ``received(rank, counts)`` entries of each array named in ``rows``
    (combine reads no row beyond the count); dtypes and shapes included."""
    h = hashlib.sha256()
    for r, o in enumerate(outputs):
        recv = np.ascontiguousarray(o[counts], dtype=np.int32)
        n = received(r, recv)
        digest_rows(h, recv)
        for k in rows:
            digest_rows(h, o[k], n)
    return h.digest()



def digest_rows(h: Any, a: np.ndarray | RowTable, rows: int | None = None) -> None:
    """Into the hash `h`: the array's dtype and shape and its bytes, only its first `rows`
    rows where given (what the next kernel reads of it). A RowTable by its table and its
    picks of those rows, never made dense: a timing-only tensor of zero rows hashes in no
    time whatever its size (equal bytes held otherwise hash otherwise, which only costs a
    needless redo)."""
    if isinstance(a, RowTable):
        n = a.rows if rows is None else min(rows, a.rows)
        h.update(f"rows {a.rows} x {a.row_bytes} B, {n} read, {a.table.shape[0]} "
                 "distinct".encode())
        h.update(np.ascontiguousarray(a.table).reshape(-1))
        h.update(np.ascontiguousarray(a.pick[:n], dtype=np.int64))
        return
    c = np.ascontiguousarray(a if rows is None else a[:rows])
    h.update(f"{c.dtype.str} {a.shape} {c.shape[0] if c.ndim else 1} read".encode())
    if c.size:
        h.update(c.reshape(-1).view(np.uint8))
