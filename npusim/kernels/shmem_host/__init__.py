"""hicann/shmem's host-memory examples (sdma_d2h_demo, rma_d2h_demo) as a family."""

from npusim.kernels.shmem_host.family import FAMILY

__all__ = ["FAMILY"]
