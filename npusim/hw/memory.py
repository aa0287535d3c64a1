"""Global memory of one rank: dense tensors (kernel inputs/outputs) and the sparse window.

Bytes are real. The 1 GiB symmetric window is an anonymous memory map: the operating
system backs only the 4 KiB pages that were written (a page never written reads as
zeros), so a window costs memory in proportion to the bytes moved, and a read or write is
one slice copy. Watchers let a waiting core be woken when bytes it polls change, so a
wait costs no event per poll interval.
"""

from __future__ import annotations

import bisect
import mmap
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npusim.engine.compiled import adopt
from npusim.errors import KernelError

PAGE = mmap.PAGESIZE
PAGE_SHIFT = 16  # watchers are filed by 64 KiB bucket of the address
SMALL_PAGES_FROM = 1 << 20  # GM buffers this large are mapped with 4 KiB pages
# mmap's MAP_NORESERVE (Python's mmap names it from 3.13 on; the value is Linux's): a map
# that reserves no swap or commit for pages never written
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux")
                        else 0)
# a mapped buffer marks which 64 KiB blocks were ever written with non-zero bytes: the
# bytes of a block never written are known to be zero. Coarser than a page can only cost
# the pages a zero write backs in a block written before, never a byte (a W 64 BS 128
# dispatch and combine back the same window and GM pages either way); a mark per 4 KiB
# page cost a W 768 dispatch 96 MiB of marks, its windows' layout being sparse
WRITTEN_BLOCK_SHIFT = 16
# a window's puts of a call: a bucket is split in two past twice this. A put lands in the
# middle of a bucket when the rows arrive out of address order, and its insert moves the
# rest of the bucket's five columns (28 B a put): 7-14 KiB on average at 512, cold in the
# cache at EP 32 (1-3% of a normal-mode combine's CPU at 1024 tokens), 1-2 KiB at 64
PUTS_PER_BUCKET = 64


def paged_zeros(nbytes: int, what: str, reserve: bool = True) -> np.ndarray:
    """nbytes of zeroed memory (GM, or a rank's UBs) for `what` (named in the error). From
    1 MiB on, an anonymous map that the OS backs page by page as it is first written, in
    4 KiB pages: numpy asks for transparent huge pages for large arrays, and a kernel writes
    a GM tensor or the window sparsely; where the kernel compacts memory to find a 2 MiB
    page on a fault (THP defrag "madvise", the usual default) that costs more than it saves
    (docs/performance.md).
    MemoryError when the address space cannot be reserved. `reserve` False (the sparse
    window, of which a run writes megabytes of gigabytes): the map commits nothing, so the
    windows of many ranks, more than the machine's memory in all, neither fail a later
    fork (the kernel counts a forked process's committed maps against memory) nor count
    against a strict overcommit limit; only written pages take memory."""
    if nbytes < SMALL_PAGES_FROM:
        return np.zeros(nbytes, dtype=np.uint8)
    try:
        # private: a read of a page never written maps the kernel's zero page (a shared
        # anonymous map is shmem, which backs such a page with memory of its own)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (0 if reserve else MAP_NORESERVE)
        mapped = mmap.mmap(-1, nbytes, flags=flags)
    except (OSError, OverflowError, ValueError) as exc:
        raise MemoryError(f"cannot map {nbytes} B for {what} ({exc})") from None
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapped.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mapped, dtype=np.uint8)


def release_pages(arr: np.ndarray) -> bool:
    """Give back the whole pages inside `arr`, a slice of a paged_zeros map: on Linux they
    read as zeros again and take no memory until written. False where nothing was given
    back (not such a slice, or not Linux)."""
    full = arr.base
    mapped = getattr(getattr(full, "base", None), "obj", None)
    if not sys.platform.startswith("linux") or not isinstance(mapped, mmap.mmap):
        return False
    start = arr.ctypes.data - full.ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + arr.size) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, end - first)
    return True


def page_marks(nbytes: int, what: str) -> np.ndarray:
    """One bool per 64 KiB block of an nbytes mapped buffer: was it ever written (mapped
    too, so a 1 GiB window's marks cost memory only where blocks were written)."""
    n = -(-nbytes >> WRITTEN_BLOCK_SHIFT)
    return paged_zeros(max(n, SMALL_PAGES_FROM), f"the page marks of {what}",
                       reserve=False)[:n].view(bool)


ZERO_TEST_BYTES = 1 << 16  # up to this size is_zero compares bytes objects
ZERO_TEST_SIZES = 256  # runs of zeros kept, one per size (at most 16 MiB in all)
_ZEROS: dict[int, bytes] = {}  # a run of zero bytes per size asked


def is_zero(data: np.ndarray) -> bool:
    """Every byte of `data` (a uint8 array, any layout) is zero.

    A GM write asks this of every row it lands (a timing-only run's payload is zeros):
    the bytes copied out and compared with a run of zeros take under a third of the
    instructions of np.count_nonzero on a 7 KiB row and a fifth of its time
    (docs/performance.md, "Work no timing-only observer reads"); larger buffers, and sizes
    beyond the runs kept, are counted in place."""
    n = data.size
    zeros = _ZEROS.get(n)
    if zeros is None:
        if n > ZERO_TEST_BYTES or len(_ZEROS) >= ZERO_TEST_SIZES:
            return not np.count_nonzero(data)
        zeros = _ZEROS[n] = bytes(n)
    return data.tobytes() == zeros


def lands_unchanged(dst: np.ndarray, moved: np.ndarray) -> bool:
    """Bytes moved into `dst` would change none of its bytes: all zeros onto all zeros.
    Such a landing is left out so that local memory never written stays unbacked (a read
    of it maps the kernel's shared zero page, a write backs a page of its own): a
    timing-only run's payloads are zeros, and they had backed about 45% of the UB pages of
    the A3 case with nothing but zeros. A row with a non-zero first byte costs one item
    read."""
    return moved.size > 0 and moved.item(0) == 0 and is_zero(moved) and is_zero(dst)


def land(dst: np.ndarray, moved: np.ndarray, at: int) -> None:
    """dst[:] = moved for a copy into local memory, `at` bytes past a page boundary of its
    map, leaving out each page's piece that is zeros onto zeros (lands_unchanged): a
    record whose payload is zeros and whose triplet is not then backs only the pages the
    triplet is in."""
    n = moved.size
    if not n or moved.item(0):  # (a functional row: at once)
        dst[:] = moved
        return
    if lands_unchanged(dst, moved):
        return
    pos, end = 0, PAGE - at % PAGE
    while pos < n:
        if end > n:
            end = n
        piece, onto = moved[pos:end], dst[pos:end]
        if not (is_zero(piece) and is_zero(onto)):
            onto[:] = piece
        pos, end = end, end + PAGE


class Region:
    """A byte-addressed piece of one rank's GM (a tensor or the window)."""

    def __init__(self, name: str, rank: int, nbytes: int) -> None:
        self.name = name
        self.rank = rank
        self.nbytes = nbytes
        self.watchers: dict[int, list[Watcher]] = {}

    def check(self, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise KernelError(
                f"{what} of {nbytes} B at offset {offset} is outside {self.name!r} "
                f"({self.nbytes} B)",
                rank=self.rank, address=offset, size=nbytes,
            )

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        raise NotImplementedError

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """read(offset, out.size) straight into `out` (a UB slice): no temporary copy."""
        out[:] = self.read(offset, out.size)

    def peek(self, offset: int, nbytes: int) -> np.ndarray:
        """The bytes for immediate use (a view where the storage allows): valid only until
        the next write, so callers copy what they keep."""
        return self.read(offset, nbytes)

    def land(self, offset: int, out: np.ndarray, at: int) -> None:
        """read_into for a copy into local memory (`out`, `at` bytes past a page boundary),
        leaving out pages where it would change no byte (memory.land)."""
        land(out, self.peek(offset, out.size), at)

    def write(self, offset: int, data: np.ndarray) -> None:
        raise NotImplementedError

    def as_array(self, dtype: np.dtype | type, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The bytes as an array (a tensor read back after a run)."""
        raise NotImplementedError

    # -- watchers -------------------------------------------------------------------
    def watch(self, w: Watcher) -> None:
        for page in range(w.offset >> PAGE_SHIFT, ((w.offset + w.nbytes - 1) >> PAGE_SHIFT) + 1):
            self.watchers.setdefault(page, []).append(w)

    def unwatch(self, w: Watcher) -> None:
        for page in range(w.offset >> PAGE_SHIFT, ((w.offset + w.nbytes - 1) >> PAGE_SHIFT) + 1):
            lst = self.watchers.get(page)
            if lst is not None:
                lst.remove(w)
                if not lst:
                    del self.watchers[page]

    def _notify(self, offset: int, nbytes: int) -> None:
        if not self.watchers:
            return
        end = offset + nbytes
        hit: list[Watcher] = []
        for page in range(offset >> PAGE_SHIFT, ((end - 1) >> PAGE_SHIFT) + 1):
            for w in self.watchers.get(page, ()):
                if w.offset < end and offset < w.offset + w.nbytes and w not in hit:
                    hit.append(w)
        for w in hit:
            w.on_change()


class Watcher:
    """A waiting core's interest in [offset, offset + nbytes) of a region."""

    __slots__ = ("offset", "nbytes", "on_change", "region")

    def __init__(self, offset: int, nbytes: int, on_change: Callable[[], None]) -> None:
        self.offset = offset
        self.nbytes = nbytes
        self.on_change = on_change
        self.region: Region | None = None


class DenseRegion(Region):
    """A GM tensor backed by one numpy byte array."""

    def __init__(self, name: str, rank: int, data: np.ndarray | int) -> None:
        # which 64 KiB blocks of a mapped buffer were ever written (None: not mapped)
        self._written: np.ndarray | None = None
        if isinstance(data, (int, np.integer)):
            buf = paged_zeros(int(data), f"GM tensor {name!r} of rank {rank}")
            if buf.size >= SMALL_PAGES_FROM:
                self._written = page_marks(buf.size, f"GM tensor {name!r} of rank {rank}")
        else:
            # owned from here on: the driver hands over fresh arrays, so no copy
            buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        super().__init__(name, rank, buf.size)
        self.buf = buf

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.buf[offset:offset + nbytes].copy()

    def read_into(self, offset: int, out: np.ndarray) -> None:
        out[:] = self.buf[offset:offset + out.size]

    def peek(self, offset: int, nbytes: int) -> np.ndarray:
        return self.buf[offset:offset + nbytes]

    def write(self, offset: int, data: np.ndarray) -> None:
        written = self._written
        if written is not None:
            first = offset >> WRITTEN_BLOCK_SHIFT
            last = (offset + data.size - 1) >> WRITTEN_BLOCK_SHIFT
            if not is_zero(data):
                if first == last:  # (one block: an item, not a slice)
                    written[first] = True
                else:
                    written[first:last + 1] = True
            elif not (written.item(first) if first == last else written[first:last + 1].any()):
                # zeros onto blocks never written (so zero): nothing changes, and the pages
                # stay unbacked (a timing-only run's payload is zeros)
                self._notify(offset, data.size)
                return
        self.buf[offset:offset + data.size] = data
        self._notify(offset, data.size)

    def as_array(self, dtype: np.dtype | type, shape: tuple[int, ...] | None = None) -> np.ndarray:
        arr = self.buf.view(dtype)
        return arr.reshape(shape) if shape is not None else arr


@dataclass(frozen=True)
class RowTable:
    """Rows of a GM tensor given by reference: row i is table[pick[i]], rows past the
    picks are zero. Many ranks then share one copy of equal rows (the identity experts'
    outputs: a token reaches several ranks as the same bytes)."""

    table: np.ndarray  # [distinct rows, row bytes] uint8
    pick: np.ndarray  # [rows given] indices into table
    rows: int  # rows of the tensor

    @classmethod
    def zeros(cls, rows: int, row_bytes: int) -> RowTable:
        """A tensor of zero rows that takes no memory (a timing-only run's input)."""
        return cls(np.zeros((0, row_bytes), np.uint8), np.zeros(0, np.intp), rows)

    @property
    def row_bytes(self) -> int:
        return int(self.table.shape[1])

    def dense(self, what: str) -> np.ndarray:
        buf = paged_zeros(self.rows * self.row_bytes, what)
        n = self.pick.size
        np.take(self.table, self.pick, axis=0, mode="clip",
                out=buf[:n * self.row_bytes].reshape(n, self.row_bytes))
        return buf


class RowTableRegion(Region):
    """A GM tensor read from a RowTable; its first write turns it into a private dense
    copy (so it behaves exactly like a DenseRegion holding the same bytes)."""

    def __init__(self, name: str, rank: int, rows: RowTable) -> None:
        super().__init__(name, rank, rows.rows * rows.row_bytes)
        self.rows = rows
        self.buf: np.ndarray | None = None

    def _what(self) -> str:
        return f"GM tensor {self.name!r} of rank {self.rank}"

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, dtype=np.uint8)
        self.read_into(offset, out)
        return out

    def read_into(self, offset: int, out: np.ndarray) -> None:
        if self.buf is not None:
            out[:] = self.buf[offset:offset + out.size]
            return
        table, pick, rb = self.rows.table, self.rows.pick, self.rows.row_bytes
        pos = 0
        while pos < out.size:  # row by row
            row, within = divmod(offset + pos, rb)
            n = min(rb - within, out.size - pos)
            if row < pick.size:
                out[pos:pos + n] = table[pick[row], within:within + n]
            else:
                out[pos:pos + n] = 0
            pos += n

    def land(self, offset: int, out: np.ndarray, at: int) -> None:
        """Row by row as read_into (the rows are a table's picks, with no view to test)."""
        self.read_into(offset, out)

    def write(self, offset: int, data: np.ndarray) -> None:
        if self.buf is None:
            self.buf = self.rows.dense(self._what())
        self.buf[offset:offset + data.size] = data
        self._notify(offset, data.size)

    def as_array(self, dtype: np.dtype | type, shape: tuple[int, ...] | None = None) -> np.ndarray:
        buf = self.buf if self.buf is not None else self.rows.dense(self._what())
        arr = buf.view(dtype)
        return arr.reshape(shape) if shape is not None else arr


class SparseRegion(DenseRegion):
    """The symmetric window: a large address range of which only written pages use memory.

    For the sanitiser it also knows the kernel's layout (named zones: data areas, status
    entries, flags) and which bytes were put in the current call, to catch an access that
    straddles two zones or two puts that land on the same bytes."""

    def __init__(self, name: str, rank: int, nbytes: int) -> None:
        # zero-filled, paged in on first touch, in small pages (a write far into the
        # window does not fault in a 2 MiB huge page). A window this machine cannot map
        # is out of memory (MemoryError): its size is within what window.bytes allows.
        buf = paged_zeros(nbytes, f"rank {rank}'s window", reserve=False)
        super().__init__(name, rank, buf)
        self._written = page_marks(nbytes, f"rank {rank}'s window")
        self.zones: list[tuple[int, int, str]] = []  # sorted [start, end) with names
        self._zone_starts: list[int] = []
        # this call's puts in address order (disjoint, never empty): [start, end) and the
        # writer (rank, core, and the step as an index into _steps), in arrays rather than
        # tuples (a W 768 dispatch makes a million puts, each from a writer of its own,
        # alive until the call ends), cut into buckets of at most 2 * PUTS_PER_BUCKET so a
        # put lands in O(log n) plus a short move (one sorted array moved half of a rank's
        # puts on each: 32 K at EP 128 with 4096 tokens)
        self._put_firsts: list[int] = []  # each bucket's first start
        self._put_buckets: list[tuple[array, array, array, array, array]] = []
        self._steps: list[str] = []
        self._step_index: dict[str, int] = {}

    def set_zones(self, zones: dict[str, tuple[int, int]]) -> None:
        self.zones = sorted((a, b, n) for n, (a, b) in zones.items() if b > a)
        self._zone_starts = [z[0] for z in self.zones]

    def new_call(self) -> None:
        self._put_firsts.clear()
        self._put_buckets.clear()
        self._steps.clear()
        self._step_index.clear()

    def zone_problem(self, offset: int, nbytes: int) -> str | None:
        """None if [offset, offset + nbytes) lies inside one zone (or no zones are set)."""
        if not self.zones or nbytes <= 0:
            return None
        i = bisect.bisect_right(self._zone_starts, offset) - 1
        if i >= 0:
            a, b, name = self.zones[i]
            if offset + nbytes <= b:
                return None
            if offset < b:
                return f"crosses the end of window zone {name!r} [0x{a:x}, 0x{b:x})"
        return "lies outside every zone of the kernel's window layout"

    def puts(self) -> list[tuple[int, int, int, int, str]]:
        """This call's puts in address order: (start, end, rank, core, step)."""
        return [(s, e, r, c, self._steps[k]) for cols in self._put_buckets
                for s, e, r, c, k in zip(*cols, strict=True)]

    def release(self, offset: int, nbytes: int) -> None:
        """Forget the puts that landed in [offset, offset + nbytes): the owner consumed and
        re-armed those flags, so a later round of the same call may put them again."""
        end = offset + nbytes
        firsts, buckets = self._put_firsts, self._put_buckets
        b = bisect.bisect_right(firsts, offset) - 1
        if b < 0:
            b = 0
        while b < len(buckets) and firsts[b] < end:
            cols = buckets[b]
            # disjoint and in order, so the ends are in order too: the puts overlapping
            # [offset, end) are those ending after offset and starting before end
            lo = bisect.bisect_right(cols[1], offset)
            hi = bisect.bisect_left(cols[0], end)
            if hi > lo:
                for a in cols:
                    del a[lo:hi]
                if not cols[0]:
                    del buckets[b]
                    del firsts[b]
                    continue
                firsts[b] = cols[0][0]
            b += 1

    def claim(self, offset: int, nbytes: int, who: tuple[int, int, str]) -> str | None:
        """Record a put's destination bytes and its writer (rank, core, step); the earlier
        writer if they overlap one. A put of no bytes writes none, so claims none."""
        if nbytes <= 0:
            return None
        end = offset + nbytes
        firsts, buckets = self._put_firsts, self._put_buckets
        if not buckets:
            firsts.append(offset)
            buckets.append((array("q"), array("q"), array("i"), array("i"), array("i")))
        b = bisect.bisect_right(firsts, offset) - 1
        if b < 0:
            b = 0
        cols = buckets[b]
        i = bisect.bisect_right(cols[0], offset)
        # the puts on either side, the only ones that can overlap (the puts are disjoint);
        # the one before is in this bucket (i is 0 only in bucket 0)
        other = self._overlap(cols, i - 1, offset, end) if i > 0 else None
        if other is None:
            if i < len(cols[0]):
                other = self._overlap(cols, i, offset, end)
            elif b + 1 < len(buckets):
                other = self._overlap(buckets[b + 1], 0, offset, end)
        if other is not None:
            return other
        rank, core, step = who
        k = self._step_index.get(step)
        if k is None:
            k = self._step_index[step] = len(self._steps)
            self._steps.append(step)
        starts, ends, ranks, cores, steps = cols
        starts.insert(i, offset)
        ends.insert(i, end)
        ranks.insert(i, rank)
        cores.insert(i, core)
        steps.insert(i, k)
        if i == 0:
            firsts[b] = offset
        if len(starts) > 2 * PUTS_PER_BUCKET:
            self._split(b)
        return None

    def _split(self, b: int) -> None:
        """Bucket b cut in two halves."""
        cols = self._put_buckets[b]
        half = len(cols[0]) // 2
        upper = tuple([a[half:] for a in cols])
        for a in cols:
            del a[half:]
        self._put_buckets.insert(b + 1, upper)
        self._put_firsts.insert(b + 1, upper[0][0])

    def _overlap(self, cols: tuple, j: int, offset: int, end: int) -> str | None:
        """The writer of put j of a bucket if it overlaps [offset, end)."""
        a, b = cols[0][j], cols[1][j]
        if a < end and offset < b:
            return f"rank {cols[2][j]} core {cols[3][j]} {self._steps[cols[4][j]]} " \
                   f"[0x{a:x}, 0x{b:x})"
        return None

if __name__ == "npusim.hw.memory":  # this module, not its compiled build: use the build
    adopt(globals(), "npusim.hw._memory",
          ("Region", "Watcher", "DenseRegion", "RowTableRegion", "SparseRegion"))
