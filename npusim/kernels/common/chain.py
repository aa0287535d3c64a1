"""The dispatch -> combine chain: what combine reads of dispatch, and its digest.

Between the two kernels the hardware runs the experts; combine reads dispatch's counts,
its assist info and the rows up to the count. The driver (npusim/sim.py) may simulate
combine in a second process on the reference dispatch's outputs and keeps that result
only if the simulated dispatch wrote the same bytes combine reads: the digest below.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np

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
        for a in (recv, *(o[k][:n] for k in rows)):
            a = np.ascontiguousarray(a)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            if a.size:
                h.update(a.reshape(-1).view(np.uint8))
    return h.digest()

