"""Pages with a few non-zero bytes kept off a mapped GM buffer (npusim.hw.sparse_pages):
the region reads exactly what a plain byte array would hold, whatever the writes."""

from __future__ import annotations

import numpy as np

from npusim.hw.memory import DenseRegion, SparseRegion
from npusim.hw.sparse_pages import LIMIT

SIZE = 1 << 20  # mapped from 1 MiB on


def _record(nbytes: int, flags: list[int]) -> np.ndarray:
    rec = np.zeros(nbytes, np.uint8)
    rec[flags] = 1
    return rec


def test_a_record_of_flags_backs_no_page_and_reads_back():
    win = SparseRegion("window", 0, SIZE)
    rec = _record(8192, list(range(480, 8192, 512)))  # 16 flags in 8 KiB
    win.write(4096, rec)
    assert not win._written.any()  # both pages held off the map
    np.testing.assert_array_equal(win.read(4096, 8192), rec)
    np.testing.assert_array_equal(win.peek(4000, 300), np.r_[np.zeros(96, np.uint8), rec[:204]])
    out = np.empty(512, np.uint8)
    win.read_into(4096 + 256, out)
    np.testing.assert_array_equal(out, rec[256:768])
    win.write(4096 + 480, np.zeros(4, np.uint8))  # the flag clear: still off the map
    rec[480:484] = 0
    np.testing.assert_array_equal(win.read(4096, 8192), rec)
    assert not win._written.any()


def test_a_fuller_write_moves_the_page_into_the_map():
    win = SparseRegion("window", 0, SIZE)
    win.write(0, _record(64, [3]))
    full = np.full(8 * (LIMIT + 1), 7, np.uint8)  # one word more than a page may hold
    win.write(1000, full)
    assert win._written[0] and not win._sparse
    expect = np.zeros(2000, np.uint8)
    expect[3], expect[1000:1000 + full.size] = 1, 7
    np.testing.assert_array_equal(win.read(0, 2000), expect)


def test_random_writes_read_like_a_plain_array():
    rng = np.random.default_rng(7)
    gm = DenseRegion("y", 0, SIZE)
    ref = np.zeros(SIZE, np.uint8)
    for _ in range(400):
        n = int(rng.choice([1, 4, 32, 512, 4096, 8192, 9000]))
        at = int(rng.integers(0, SIZE - n)) & ~int(rng.choice([0, 7]))  # aligned or not
        data = np.zeros(n, np.uint8)
        k = int(rng.choice([0, 1, 8, LIMIT, 8 * LIMIT, n]))
        data[rng.integers(0, n, min(k, n))] = rng.integers(1, 256, min(k, n))
        gm.write(at, data)
        ref[at:at + n] = data
        a, m = sorted(int(v) for v in rng.integers(0, SIZE, 2))
        np.testing.assert_array_equal(gm.read(a, m - a + 1), ref[a:m + 1])
        a &= ~7
        np.testing.assert_array_equal(gm.peek(a, 8192), ref[a:a + 8192])
    np.testing.assert_array_equal(gm.as_array(np.uint8), ref)
    assert not gm._sparse  # as_array moved every page into the map
