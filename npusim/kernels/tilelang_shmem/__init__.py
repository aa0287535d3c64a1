"""The TileLang-Ascend SHMEM MoE dispatch / combine (seeds/003, tilelang-ascend
examples/dispatch_combine) as a family."""

from npusim.kernels.tilelang_shmem.family import FAMILY

__all__ = ["FAMILY"]
