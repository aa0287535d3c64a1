"""DeepEP-Ascend's normal and low-latency modes as the kernel family ``deepep``
(docs/kernels/deepep.md)."""

from npusim.kernels.deepep.family import FAMILY

__all__ = ["FAMILY"]
