"""The pyPTO SHMEM MoE dispatch / combine subgraphs (seeds/003) as a family."""

from npusim.kernels.pypto_shmem.family import FAMILY

__all__ = ["FAMILY"]
