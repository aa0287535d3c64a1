"""hicann/shmem's classic MoE examples (dispatch_classic, combine_classic) as a family."""

from npusim.kernels.shmem_classic.family import FAMILY

__all__ = ["FAMILY"]
