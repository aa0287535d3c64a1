"""Pages that hold only a few non-zero words, kept off the mapped buffer.

A timing-only dispatch record is 8 KiB of zeros but for its flags and triplet: stored in
the map it backs two 4 KiB pages, and at W 768 the records resident at once are 3.75 GiB
(docs/performance.md). A page never backed that a write leaves with at most `LIMIT`
non-zero 8-byte words keeps them here instead (their word addresses and values), and
reads lay them over the map's zeros. A write that would leave a page fuller backs it
(the page moves into the map). Contents, and so timing, are the same either way."""

from __future__ import annotations

import numpy as np

PAGE_SHIFT = 12  # the map's pages: 4 KiB
WORDS_PER_PAGE_SHIFT = PAGE_SHIFT - 3
LIMIT = 32  # non-zero 8-byte words a page may hold here (256 B)
_BYTES_OF_WORD = np.arange(8)


class SparsePages:
    """The few-word pages of one mapped buffer: page -> (word addresses, word values), and
    one mark per page of the buffer (`marks`, a mapped bool array) for range tests."""

    __slots__ = ("pages", "marks", "nbytes")

    def __init__(self, marks: np.ndarray, nbytes: int) -> None:
        self.pages: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.marks = marks
        self.nbytes = nbytes  # the buffer's size

    def __bool__(self) -> bool:
        return bool(self.pages)

    def touched(self, first: int, last: int) -> list[int]:
        """The pages in [first, last] held here."""
        if not self.pages:
            return []
        if first == last:
            return [first] if self.marks[first] else []
        m = self.marks[first:last + 1]
        if not m.any():
            return []
        return (np.flatnonzero(m) + first).tolist()

    def merge(self, offset: int, data: np.ndarray, first: int, last: int) -> bool:
        """Write `data` at `offset` (pages first..last, none of them in the map) here if
        every page it leaves stays within LIMIT non-zero words; False (nothing changed) if
        not. A write that is not word-aligned is widened to its words first."""
        if offset & 7 or data.size & 7:
            lo, hi = offset & ~7, (offset + data.size + 7) & ~7
            if hi > self.nbytes:
                return False
            wide = np.zeros(hi - lo, np.uint8)  # the map's pages here are zeros
            self.overlay(lo, wide)
            wide[offset - lo:offset - lo + data.size] = data
            offset, data = lo, wide
        words = data.view(np.uint64)
        nz = np.flatnonzero(words)
        base = offset >> 3
        at, vals = nz + base, words[nz]
        held = self.touched(first, last)
        if held:  # what the pages held outside the written range stays
            end = base + words.size
            pos, val = [at], [vals]
            for p in held:
                a, v = self.pages[p]
                keep = (a < base) | (a >= end)
                pos.append(a[keep])
                val.append(v[keep])
            at = np.concatenate(pos)
            order = np.argsort(at, kind="stable")
            at, vals = at[order], np.concatenate(val)[order]
        if first == last:
            if at.size > LIMIT:
                return False
            edges = [0, at.size]
        else:  # at is sorted: cut it at the page boundaries
            cuts = np.searchsorted(
                at, np.arange(first + 1, last + 1) << WORDS_PER_PAGE_SHIFT).tolist()
            edges = [0, *cuts, at.size]
            if any(b - a > LIMIT for a, b in zip(edges, edges[1:], strict=False)):
                return False
        pages, marks = self.pages, self.marks
        for i, p in enumerate(range(first, last + 1)):
            a, b = edges[i], edges[i + 1]
            if b > a:
                pages[p] = (at[a:b], vals[a:b])
                marks[p] = True
            elif pages.pop(p, None) is not None:
                marks[p] = False
        return True

    def overlay(self, offset: int, out: np.ndarray) -> None:
        """Lay the words held here for [offset, offset + out.size) over `out`."""
        end = offset + out.size
        pages = self.touched(offset >> PAGE_SHIFT, (end - 1) >> PAGE_SHIFT)
        if not pages:
            return
        if not (offset & 7 or out.size & 7):
            ow, base, wend = out.view(np.uint64), offset >> 3, end >> 3
            for p in pages:
                a, v = self.pages[p]
                if a[0] >= base and a[-1] < wend:
                    ow[a - base] = v
                else:
                    sel = (a >= base) & (a < wend)
                    ow[a[sel] - base] = v[sel]
            return
        for p in pages:  # an unaligned read: byte by byte
            a, v = self.pages[p]
            at = (a[:, None] * 8 + _BYTES_OF_WORD).ravel()
            b = v.view(np.uint8)
            sel = (at >= offset) & (at < end)
            out[at[sel] - offset] = b[sel]

    def move_into(self, buf: np.ndarray, first: int, last: int) -> list[int]:
        """Move the pages in [first, last] into the map `buf`; the pages moved."""
        moved = self.touched(first, last)
        if moved:
            words = buf[:buf.size & ~7].view(np.uint64)
            for p in moved:
                a, v = self.pages.pop(p)
                words[a] = v
                self.marks[p] = False
        return moved
