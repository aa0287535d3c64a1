"""hicann/shmem's doubleplane MoE examples (classic plus an SDMA plane) as a family."""

from npusim.kernels.shmem_doubleplane.family import FAMILY

__all__ = ["FAMILY"]
