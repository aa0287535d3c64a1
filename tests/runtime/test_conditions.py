"""The poll conditions on hand-made bytes: what each one accepts, contiguous and strided."""

from __future__ import annotations

import numpy as np

from npusim.runtime.conditions import AllEqual, AtLeast, SumEquals


def _bytes(values: list[float], dtype: type) -> np.ndarray:
    return np.array(values, dtype).view(np.uint8)


def test_all_equal_contiguous() -> None:
    cond = AllEqual(np.float32, 1.0)
    assert cond(_bytes([1.0, 1.0, 1.0], np.float32))
    assert not cond(_bytes([1.0, 0.0, 1.0], np.float32))
    assert not cond(_bytes([1.0, np.nan], np.float32))  # NaN equals nothing
    assert cond(np.zeros(0, np.uint8))  # no flags to wait for: already true


def test_all_equal_strided_reads_one_word_per_block() -> None:
    # four 32 B entries; the flag is the fp32 at byte 4 of each, the rest is noise
    rows = np.full((4, 8), 7.0, np.float32)
    rows[:, 1] = 1.0
    cond = AllEqual(np.float32, 1.0, stride=32, offset=4)
    assert cond(rows.view(np.uint8).ravel())
    rows[2, 1] = 0.5
    assert not cond(rows.view(np.uint8).ravel())


def test_at_least_and_sum_equals() -> None:
    assert AtLeast(np.int32, 3)(_bytes([3, 4, 9], np.int32))
    assert not AtLeast(np.int32, 3)(_bytes([3, 2], np.int32))
    # 1 + 1 + 1 = 3 (ReduceSum of three status flags)
    assert SumEquals(np.float32, 3.0)(_bytes([1.0, 1.0, 1.0], np.float32))
    assert not SumEquals(np.float32, 3.0)(_bytes([1.0, 1.0, 0.0], np.float32))
