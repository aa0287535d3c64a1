"""The forked child's value comes back whole: large arrays without their zero blocks,
rebuilt byte for byte in memory the parent backs only where data lands."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from npusim.fork import ZERO_BLOCK, Forked
from npusim.hw.memory import paged_zeros

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def test_arrays_come_back_equal_whatever_their_zeros() -> None:
    rng = np.random.default_rng(3)
    dense = rng.standard_normal((300, 1000)).astype(ml_dtypes.bfloat16)  # 600 KB
    big = rng.integers(-9, 9, (5, 3 * ZERO_BLOCK + 17), dtype=np.int32)  # no zero block
    sparse = np.zeros(40 * ZERO_BLOCK + 5, np.uint8)
    sparse[[3, 7 * ZERO_BLOCK, 40 * ZERO_BLOCK + 4]] = [1, 2, 3]  # two blocks and the tail
    strided = np.zeros((2048, 1024), np.float32)[:, ::2]  # not contiguous: pickled as is

    def work() -> dict:
        return {"dense": dense, "big": big, "sparse": sparse, "strided": strided,
                "rows": [np.arange(5)], "text": "kept"}

    got = Forked(work).result()
    assert got is not None and got["text"] == "kept"
    for name in ("dense", "big", "sparse", "strided"):
        want = locals()[name]
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        assert got[name].tobytes() == want.tobytes()
    assert got["rows"][0].tolist() == [0, 1, 2, 3, 4]


def test_a_gigabyte_of_zero_rows_takes_no_memory_in_the_parent() -> None:
    """65536 rows of 7168 bf16 (0.9 GiB) with one row written: the parent's resident
    memory grows by far less than the array (by twice its size when sent whole)."""
    n = 65536 * 7168 * 2

    def work() -> np.ndarray:
        a = paged_zeros(n, "test").view(np.uint16).reshape(-1, 7168)
        a[12] = 5
        return a

    before = _rss_kib()
    got = Forked(work).result()
    grown = _rss_kib() - before
    assert got is not None and got.shape == (n // 2 // 7168, 7168)
    assert int(got[12, 0]) == 5 and int(got[13, 0]) == 0 and int(got[-1, -1]) == 0
    assert grown < 64 * 1024  # KiB: under 64 MiB of the 0.9 GiB


def test_the_result_pipe_holds_a_mebibyte_where_linux_allows_it() -> None:
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("no pipe sizes here")
    from npusim.fork import _widen

    mib = 1 << 20  # Linux's default pipe-max-size

    with open("/proc/sys/fs/pipe-max-size") as f:
        allowed = int(f.read())
    r, w = os.pipe()
    try:
        before = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        _widen(w)
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == (
            mib if allowed >= mib else before)
    finally:
        os.close(r)
        os.close(w)
