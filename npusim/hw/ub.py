"""The Unified Buffer of one AIV core: capacity, alignment and pipe-hazard tracking.

Vector and scalar operations apply their effect on UB bytes when they are issued, and
transfers move bytes when they complete. That is only equivalent to the hardware when
the program orders its pipes correctly, so every access is checked here: reading a
buffer whose incoming copy has not landed, or overwriting one that an in-flight
transfer still reads, is a race on the real core and a KernelError in npusim.
"""

from __future__ import annotations

import math

import numpy as np

from npusim.engine.compiled import adopt
from npusim.errors import KernelError
from npusim.hw.memory import is_zero, release_pages
from npusim.units import align_up, ceil_div

INF = math.inf


def strided_blocks(span: np.ndarray, count: int, length: int, pitch: int) -> np.ndarray:
    """The `count` blocks of `length` items every `pitch` items of a 1-D byte (or bit) span,
    as a [count, length] view (pitch 0 repeats the first block)."""
    if span.size < (count - 1) * pitch + length:
        raise ValueError(f"a span of {span.size} B has no {count} blocks of {length} B "
                         f"every {pitch} B")
    if span.flags.c_contiguous:  # a view on the span's own buffer (as_strided's cost, 1/8)
        item = span.itemsize
        return np.ndarray((count, length), span.dtype, buffer=span, strides=(pitch * item, item))
    step = span.strides[0]
    return np.lib.stride_tricks.as_strided(span, (count, length), (pitch * step, step))


_ALL_SET = [b""]  # a run of 0xFF mark bytes, grown on demand


_ITEMSIZE: dict[object, int] = {}
"""Bytes per element by the dtype (or scalar type) a view was asked for: np.dtype() of it
costs more than the rest of a small view."""


def _itemsize(dtype: np.dtype | type) -> int:
    item = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize
    return item


def _all_set(n: int) -> bytes:
    """n mark bytes with every bit set."""
    if len(_ALL_SET[0]) < n:
        _ALL_SET[0] = b"\xff" * max(n, 2 * len(_ALL_SET[0]))
    return _ALL_SET[0][:n]


class UBBuffer:
    """A named, aligned allocation in UB (like a TBuf/TQue buffer in Ascend C)."""

    __slots__ = ("ub", "name", "offset", "nbytes", "write_ready", "read_busy", "writer",
                 "all_written")

    def __init__(self, ub: UnifiedBuffer, name: str, offset: int, nbytes: int) -> None:
        self.ub = ub
        self.name = name
        self.offset = offset
        self.nbytes = nbytes
        self.write_ready = 0.0  # time the last write to it completes (INF: in flight)
        self.read_busy = 0.0  # time the last read of it completes (INF: in flight)
        self.writer = ""
        self.all_written = False  # every byte marked written in this call (marks are sticky)

    def view(self, dtype: np.dtype | type, count: int | None = None, byte_offset: int = 0
             ) -> np.ndarray:
        """A numpy view of (part of) the buffer's bytes."""
        item = _ITEMSIZE.get(dtype) or _itemsize(dtype)
        if count is None:
            count = (self.nbytes - byte_offset) // item
        end = byte_offset + count * item
        if byte_offset < 0 or end > self.nbytes:
            raise KernelError(
                f"view of {count} x {np.dtype(dtype).name} at +{byte_offset} overruns "
                f"{self.ub.label} buffer {self.name!r} ({self.nbytes} B)",
                address=self.offset + byte_offset, size=count * item,
            )
        start = self.offset + byte_offset
        return self.ub.data[start:start + count * item].view(dtype)

    def mark_written(self) -> None:
        """Every byte of the buffer was written in this call (marked once, then sticky)."""
        if not self.all_written:
            self.ub.mark(self.offset, self.nbytes)
            self.all_written = True

    def bytes_at(self, byte_offset: int, nbytes: int) -> np.ndarray:
        return self.ub.data[self.offset + byte_offset:self.offset + byte_offset + nbytes]

    def clear(self) -> None:
        """A Duplicate of 0 over every byte (the effect of a vector fill). Bytes that read
        zero already are not written: UB never written stays unbacked, as a copy of
        zeros onto zeros leaves it (memory.lands_unchanged)."""
        data = self.ub.data[self.offset:self.offset + self.nbytes]
        if data.size and (data.item(0) or not is_zero(data)):
            data.fill(0)


class UnifiedBuffer:
    """Bytes of one core's UB with a bump allocator (buffers live for one kernel call)."""

    def __init__(self, capacity: int, alignment: int, data: np.ndarray | None = None,
                 written: np.ndarray | None = None, label: str = "UB") -> None:
        """`data` (capacity bytes) and `written` (capacity / 8 bytes), zeroed, may be slices
        of a rank-wide map (Rank), so that untouched UB costs no memory. `label` names the
        buffer in errors (an AIC's L1, L0A, L0B, L0C are local buffers of the same kind)."""
        self.label = label
        self.capacity = capacity
        self.alignment = alignment
        self.data = np.zeros(capacity, dtype=np.uint8) if data is None else data
        # one bit per byte written in this call (bit i of mask byte j = UB byte 8j + i):
        # an eighth of the memory of a bool per byte, which at W 64 is half a GiB
        self.written = (np.zeros(self.marks_bytes(capacity), dtype=np.uint8) if written is None
                        else written)
        self.top = 0
        self.high = 0  # highest top since the last new call: bytes above it were never marked
        self.buffers: list[UBBuffer] = []

    @staticmethod
    def marks_bytes(capacity: int) -> int:
        return ceil_div(capacity, 8)

    def alloc(self, name: str, nbytes: int) -> UBBuffer:
        a = self.alignment
        size = align_up(nbytes, a)
        if self.top + size > self.capacity:
            raise KernelError(
                f"{self.label} overflow: buffer {name!r} of {size} B at {self.label} offset "
                f"{self.top} needs {self.top + size} B, {self.label} has {self.capacity} B",
                address=self.top, size=size,
            )
        buf = UBBuffer(self, name, self.top, size)
        self.top += size
        if self.top > self.high:
            self.high = self.top
        self.buffers.append(buf)
        return buf

    def reset(self, new_call: bool = False) -> None:
        """Free every buffer (tpipe Reset); on a new kernel call also forget which bytes
        were written, so reading what an earlier call left behind is caught. A transfer
        still open on a buffer is a race: the next buffers reuse its bytes (the sample
        barriers on PIPE_ALL before its Reset)."""
        for b in self.buffers:
            if b.read_busy == INF or b.write_ready == INF:
                raise KernelError(f"{self.label} reset while a transfer still uses buffer "
                                  f"{b.name!r}: "
                                  "missing barrier", address=b.offset, size=b.nbytes)
        self.top = 0
        self.buffers.clear()
        if new_call:  # only the part ever allocated (the rest keeps untouched, unpaged memory)
            self.written[:ceil_div(self.high, 8)] = 0
            self.high = 0

    def release(self) -> None:
        """The core's program is over and nothing reads its bytes again (a later call's
        read of bytes it did not write is an error whatever they hold): their pages go
        back to the OS and read as zeros. A FixPipe from the block's AIC that lands after
        it writes as before."""
        release_pages(self.data)
        release_pages(self.written)

    def close(self) -> None:
        """Forget the buffers once the op is over: each points back here, a cycle that only
        a full collection would free."""
        self.buffers.clear()

    def mark(self, start: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        end = start + nbytes
        first, last = start >> 3, (end - 1) >> 3
        head = (0xFF << (start & 7)) & 0xFF
        tail = 0xFF >> (7 - ((end - 1) & 7))
        w = self.written  # (item and a Python int: a numpy scalar's |= costs more)
        if first == last:
            w[first] = w.item(first) | (head & tail)
            return
        w[first] = w.item(first) | head
        w[last] = w.item(last) | tail
        if last > first + 1:
            w[first + 1:last] = 0xFF

    def mark_blocks(self, start: int, count: int, length: int, pitch: int) -> None:
        """Mark `count` blocks of `length` bytes every `pitch` bytes (a strided landing)."""
        if count <= 0 or length <= 0:
            return
        if pitch <= length:  # touching or overlapping blocks: one run
            self.mark(start, (count - 1) * pitch + length)
            return
        lo, hi = start >> 3, ((start + (count - 1) * pitch + length - 1) >> 3) + 1
        bits = np.unpackbits(self.written[lo:hi], bitorder="little")
        off = start - 8 * lo
        strided_blocks(bits[off:], count, length, pitch)[...] = 1
        self.written[lo:hi] = np.packbits(bits, bitorder="little")

    def unwritten(self, start: int, nbytes: int) -> int:
        """The first UB address in the range never written in this call, or -1.

        The usual answer (all written) is read off the mark bytes as a bytes object: a
        comparison with a run of 0xFF costs a tenth of numpy's compare-and-reduce."""
        if nbytes <= 0:
            return -1
        end = start + nbytes
        lo, hi = start >> 3, ((end - 1) >> 3) + 1
        w = self.written[lo:hi]
        off = start - 8 * lo
        marks = w.tobytes()
        head = (0xFF << off) & 0xFF  # the bits of the first and last mark byte in range
        tail = 0xFF >> (7 - ((end - 1) & 7))
        if hi - lo == 1:
            if marks[0] & head & tail == head & tail:
                return -1
        elif (marks[0] & head == head and marks[-1] & tail == tail
              and marks[1:-1] == _all_set(hi - lo - 2)):
            return -1
        bits = np.unpackbits(w, bitorder="little")[off:off + nbytes]
        return start + int(np.argmin(bits))

    def check_aligned(self, buf: UBBuffer, byte_offset: int) -> None:
        addr = buf.offset + byte_offset
        if addr % self.alignment:
            raise KernelError(
                f"{self.label} address of buffer {buf.name!r}+{byte_offset} is not "
                f"{self.alignment} B aligned",
                address=addr,
            )


if __name__ == "npusim.hw.ub":  # this module, not its compiled build: use the build
    adopt(globals(), "npusim.hw._ub", ("UBBuffer", "UnifiedBuffer"))
