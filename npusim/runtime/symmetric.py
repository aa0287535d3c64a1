"""Symmetric heap tensors: a GM tensor that lives inside the rank's symmetric window.

SHMEM's ``shmem_malloc`` hands every PE the same offset in its heap, so a kernel reaches a
peer's copy of a tensor by address arithmetic alone (``aclshmem_ptr``: the peer's heap
base plus the offset). npusim's window is a rank's heap; a heap tensor is a view of
``[offset, offset + nbytes)`` of it, read and written locally as any GM tensor, and
reached on another rank through ``ctx.shmem.ptr`` (that rank's window at the same offset),
where copy_in is a remote pull and put a remote write.
"""

from __future__ import annotations

import numpy as np

from npusim.hw.memory import Region, SparseRegion


class HeapTensor(Region):
    """A named span of a rank's window, used as a GM tensor (a shmem_malloc'd tensor)."""

    def __init__(self, name: str, window: SparseRegion, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > window.nbytes:
            raise ValueError(f"heap tensor {name!r} [{offset}, {offset + nbytes}) does not fit "
                             f"the symmetric window of {window.nbytes} B")
        super().__init__(name, window.rank, nbytes)
        self.window = window
        self.heap_offset = offset

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.window.read(self.heap_offset + offset, nbytes)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        self.window.read_into(self.heap_offset + offset, out)

    def peek(self, offset: int, nbytes: int) -> np.ndarray:
        return self.window.peek(self.heap_offset + offset, nbytes)

    def write(self, offset: int, data: np.ndarray) -> None:
        self.window.write(self.heap_offset + offset, data)
        self._notify(offset, data.size)

    def as_array(self, dtype: np.dtype | type, shape: tuple[int, ...] | None = None
                 ) -> np.ndarray:
        arr = self.window.buf[self.heap_offset:self.heap_offset + self.nbytes].view(dtype)
        return arr.reshape(shape) if shape is not None else arr


def heap_tensor(rank: object, name: str, offset: int, data: np.ndarray | int) -> HeapTensor:
    """Place tensor `name` at heap `offset` of the rank's window: its bytes (an array) or
    zeros (a size: the window's untouched pages already read as zero)."""
    window = rank.window  # type: ignore[attr-defined]
    if isinstance(data, (int, np.integer)):
        t = HeapTensor(name, window, offset, int(data))
    else:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        t = HeapTensor(name, window, offset, raw.size)
        window.write(offset, raw)
    rank.tensors[name] = t  # type: ignore[attr-defined]
    return t
