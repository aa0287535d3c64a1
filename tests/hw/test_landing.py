"""Bytes landing in local memory: always the bytes moved, and zeros onto zeros leave the
pages of a map never written without memory of their own."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from npusim.hw.memory import land, lands_unchanged, paged_zeros
from npusim.hw.ub import UnifiedBuffer
from tests.hw.pagemap import entries

PAGE = mmap.PAGESIZE


def _own_pages(arr: np.ndarray) -> int | None:
    """Pages of arr backed by memory of their own (not the kernel's shared zero page that
    a read of never-written memory maps); None where that is not readable."""
    found = entries(arr)
    return None if found is None else sum(e >> 63 & 1 and e >> 56 & 1 for e in found)


def _record(nbytes: int, tail: int) -> np.ndarray:
    """A record of zeros but for its last `tail` bytes (a timing-only row and its
    triplet)."""
    rec = np.zeros(nbytes, np.uint8)
    rec[nbytes - tail:] = np.arange(1, tail + 1, dtype=np.uint8)
    return rec


@pytest.mark.parametrize("at", [0, 32, PAGE - 32, 3 * PAGE + 96])
@pytest.mark.parametrize("kind", ["zeros", "record", "random", "first byte zero"])
def test_land_writes_exactly_the_bytes_moved(at, kind):
    """Whatever was under them, the destination ends as the bytes moved, and nothing past
    them changes."""
    rng = np.random.default_rng(at)
    n = 3 * PAGE + 512
    moved = {"zeros": np.zeros(n, np.uint8), "record": _record(n, 12),
             "random": rng.integers(0, 256, n, dtype=np.uint8),
             "first byte zero": np.concatenate([[0], rng.integers(1, 256, n - 1)]).astype(
                 np.uint8)}[kind]
    for before in (np.zeros(at + n + 64, np.uint8),
                   rng.integers(0, 256, at + n + 64, dtype=np.uint8)):
        dst = before.copy()
        land(dst[at:at + n], moved, at)
        want = before.copy()
        want[at:at + n] = moved
        assert np.array_equal(dst, want)


def test_zeros_onto_zeros_back_no_page_and_a_record_backs_only_its_tail():
    buf = paged_zeros(1 << 20, "a test map")
    land(buf[:4 * PAGE], np.zeros(4 * PAGE, np.uint8), 0)
    rec = _record(3 * PAGE, 12)
    land(buf[8 * PAGE:11 * PAGE], rec, 0)
    assert np.array_equal(buf[8 * PAGE:11 * PAGE], rec) and not buf[:8 * PAGE].any()
    own = _own_pages(buf)
    if own is not None:
        assert own == 1  # the page with the record's last 12 bytes


def test_lands_unchanged_only_for_zeros_onto_zeros():
    z, one = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    one[40] = 1
    assert lands_unchanged(z, z.copy())
    assert not lands_unchanged(one, z)  # zeros onto non-zero bytes change them
    assert not lands_unchanged(z, one)
    assert not lands_unchanged(z[:0], z[:0])  # (nothing moved: an ordinary landing)


def test_a_ub_clear_zeroes_the_buffer_and_backs_no_page_of_zeros():
    data = paged_zeros(1 << 20, "test UBs")
    ub = UnifiedBuffer(64 * 1024, 32, data=data[:64 * 1024],
                       written=np.zeros(8 * 1024, np.uint8))
    fresh, used = ub.alloc("fresh", 4 * PAGE), ub.alloc("used", 100)
    used.view(np.uint8)[:] = 7
    fresh.clear()
    used.clear()
    assert not ub.data.any()
    own = _own_pages(data[:4 * PAGE])
    if own is not None:
        assert own == 0
