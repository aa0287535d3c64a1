"""The pyPTO SHMEM MoE dispatch / combine subgraphs of the cann-recipes-infer
article "NPU DeepSeek SHMEM通信优化实践" as a family."""

from npusim.kernels.pypto_shmem.family import FAMILY

__all__ = ["FAMILY"]
