"""HIXL's one-sided FabricMem transfers (D2rH put, rH2D get) of KV blocks as a family."""

from npusim.kernels.hixl.family import FAMILY

__all__ = ["FAMILY"]
