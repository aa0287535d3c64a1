"""What a wait-until waits for: a predicate over polled bytes that can explain itself.

A deadlock report must say what each core waits for and what it currently sees, so a
condition is an object with a description, not a bare lambda.
"""

from __future__ import annotations

import numpy as np


class Condition:
    def __call__(self, data: np.ndarray) -> bool:  # data: the polled bytes (uint8)
        raise NotImplementedError

    def describe(self, data: np.ndarray) -> str:
        raise NotImplementedError


class AllEqual(Condition):
    """Every element (of dtype) at offset + i*stride equals value; stride 0 = contiguous."""

    def __init__(self, dtype: np.dtype | type, value: float, stride: int = 0, offset: int = 0
                 ) -> None:
        self.dtype = np.dtype(dtype)
        self.value = value
        self.stride = stride
        self.offset = offset

    def _values(self, data: np.ndarray) -> np.ndarray:
        if self.stride:
            item = self.dtype.itemsize
            rows = data[: (data.size // self.stride) * self.stride].reshape(-1, self.stride)
            return rows[:, self.offset:self.offset + item].copy().view(self.dtype).ravel()
        usable = data.size // self.dtype.itemsize * self.dtype.itemsize
        return data[:usable].view(self.dtype)

    def __call__(self, data: np.ndarray) -> bool:
        return bool(np.all(self._values(data) == self.value))

    def describe(self, data: np.ndarray) -> str:
        vals = self._values(data)
        bad = int(np.count_nonzero(vals != self.value))
        return (f"expects every {self.dtype.name} flag == {self.value}; "
                f"{bad} of {vals.size} differ (first values {vals[:4].tolist()})")


class SumEquals(Condition):
    """The sum of the elements (of dtype) equals value, like the kernels' flag sums."""

    def __init__(self, dtype: np.dtype | type, value: float) -> None:
        self.dtype = np.dtype(dtype)
        self.value = value

    def _sum(self, data: np.ndarray) -> float:
        usable = data.size // self.dtype.itemsize * self.dtype.itemsize
        return float(data[:usable].view(self.dtype).sum(dtype=np.float64))

    def __call__(self, data: np.ndarray) -> bool:
        return self._sum(data) == self.value

    def describe(self, data: np.ndarray) -> str:
        return f"expects sum of {self.dtype.name} == {self.value}, current sum {self._sum(data)}"
