"""A die's L2: the write-back cache in front of its HBM, as far as it decides whether a
GM write costs HBM bandwidth during the kernel.

Every GM access of the kernel allocates L2 lines (a read miss fills one, a write
allocates one dirty). While the lines allocated since the kernel started fit in the
L2, a write stays there and is written back after the kernel: it crosses no HBM. Once
they exceed it, each new line evicts an older one, and the writes from then on cross
the HBM (the write-back of the line they displace, at the rate they arrive). Reads are
taken as misses: a kernel's inputs were written before it started and are not assumed
resident (docs/model.md, "L2"). A capacity of 0 is an L2 the model leaves out: every
write crosses the HBM."""

from __future__ import annotations


class L2:
    """The room a kernel's accesses have allocated in one die's L2."""

    __slots__ = ("capacity", "allocated", "absorbed")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.allocated = 0  # bytes of lines allocated since the kernel started
        self.absorbed = 0  # bytes of writes that stayed in the L2 (for the report)

    def read(self, nbytes: int) -> None:
        """A GM read of `nbytes`: its lines are filled (a miss) and take room."""
        self.allocated += nbytes

    def write(self, nbytes: int) -> bool:
        """A GM write of `nbytes`: True if it stays in the L2 (no HBM traffic now)."""
        self.allocated += nbytes
        if self.allocated <= self.capacity:
            self.absorbed += nbytes
            return True
        return False
