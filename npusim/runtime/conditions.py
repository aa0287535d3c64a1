"""What a wait-until waits for: a predicate over polled bytes that can explain itself.

A deadlock report must say what each core waits for and what it currently sees, so a
condition is an object with a description, not a bare lambda.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

Wait = Generator[Any, Any, Any]
"""What a kernel program and every helper that may block yields from: simpy events."""


class Condition:
    def __call__(self, data: np.ndarray) -> bool:  # data: the polled bytes (uint8)
        raise NotImplementedError

    def describe(self, data: np.ndarray) -> str:
        raise NotImplementedError


class _Elements(Condition):
    """Elements of `dtype` read contiguously, or one at `offset` in every `stride` bytes."""

    def __init__(self, dtype: np.dtype | type, stride: int = 0, offset: int = 0) -> None:
        self.dtype = np.dtype(dtype)
        self.stride = stride
        self.offset = offset

    def values(self, data: np.ndarray) -> np.ndarray:
        item = self.dtype.itemsize
        if self.stride:
            rows = data[: (data.size // self.stride) * self.stride].reshape(-1, self.stride)
            return np.ascontiguousarray(rows[:, self.offset:self.offset + item]).view(
                self.dtype).ravel()
        usable = data.size // item * item
        return data[:usable].view(self.dtype)


class _Compared(_Elements):
    """Elements compared with one value."""

    def __init__(self, dtype: np.dtype | type, value: float, stride: int = 0, offset: int = 0
                 ) -> None:
        super().__init__(dtype, stride, offset)
        self.value = value


class AllEqual(_Compared):
    """Every element equals value (per-block 'arrived' flags)."""

    def __call__(self, data: np.ndarray) -> bool:
        return bool((self.values(data) == self.value).all())

    def describe(self, data: np.ndarray) -> str:
        vals = self.values(data)
        bad = int(np.count_nonzero(vals != self.value))
        return (f"expects every {self.dtype.name} flag == {self.value}; "
                f"{bad} of {vals.size} differ (first values {vals[:4].tolist()})")


class SumEquals(_Elements):
    """The elements add up to value, like the kernels' ReduceSum over status flags."""

    def __init__(self, dtype: np.dtype | type, value: float, stride: int = 0, offset: int = 0,
                 tolerance: float = 0.0) -> None:
        super().__init__(dtype, stride, offset)
        self.value = value
        self.tolerance = tolerance

    def total(self, data: np.ndarray) -> float:
        return float(self.values(data).sum(dtype=np.float64))

    def __call__(self, data: np.ndarray) -> bool:
        return abs(self.total(data) - self.value) <= self.tolerance

    def describe(self, data: np.ndarray) -> str:
        return (f"expects sum of {self.dtype.name} == {self.value}, "
                f"current sum {self.total(data)}")


class AtLeast(_Compared):
    """Every element is at least value (a generation counter that has caught up)."""

    def __call__(self, data: np.ndarray) -> bool:
        return bool((self.values(data) >= self.value).all())

    def describe(self, data: np.ndarray) -> str:
        vals = self.values(data)
        return (f"expects every {self.dtype.name} >= {self.value}; "
                f"current {vals[:4].tolist()}")
