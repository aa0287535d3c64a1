"""Heap: tensors allocated one after the other in a rank's symmetric window.

The SHMEM ports take their window tensors from one symmetric heap (aclshmem_malloc,
aclshmem_create_tensor, or the HCCL window npusim stands in for it), in a fixed order: a
tensor starts where the one before it ends, rounded up to the heap's alignment. Each
family names its tensors and sizes; where they land and the zones the window sanitiser
holds every access to (`regions`) follow from that order alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from npusim.units import align_up


class Heap:
    """Offsets of named tensors stacked from 0; each one's region runs to the next one's
    start (its alignment padding included), the last one's to `end`."""

    def __init__(self, tensors: Sequence[tuple[str, int]], align: int = 1) -> None:
        self.start: dict[str, int] = {}
        at = 0
        for name, size in tensors:
            self.start[name] = at = align_up(at, align)
            at += size
        self.end = at

    def regions(self) -> dict[str, tuple[int, int]]:
        starts = list(self.start.values())
        return {name: (a, b) for name, a, b in zip(self.start, starts, [*starts[1:], self.end],
                                                    strict=True)}
