"""The CANN sample's kernel family (docs/kernels/cann_sample.md); the registry imports FAMILY."""

from npusim.kernels.cann_sample.family import FAMILY

__all__ = ["FAMILY"]
