"""The TileLang-Ascend SHMEM MoE dispatch / combine of the cann-recipes-infer article "NPU
DeepSeek SHMEM通信优化实践" (tile-ai/tilelang-ascend examples/dispatch_combine) as a family."""

from npusim.kernels.tilelang_shmem.family import FAMILY

__all__ = ["FAMILY"]
