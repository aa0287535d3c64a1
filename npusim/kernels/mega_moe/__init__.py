"""CANN SHMEM's MegaMoE as a registry family (FAMILY)."""

from npusim.kernels.mega_moe.family import FAMILY

__all__ = ["FAMILY"]
