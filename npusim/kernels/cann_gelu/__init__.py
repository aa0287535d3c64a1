"""The GeLU sample of hicann/cann-samples (Samples/1_Features/hardware_features/vector_function):
one core, fp32 tiles of 32 KiB, computed with MemBase calls between PipeBarriers
(gelu_without_vf.asc) or with one vector function (gelu_with_vf.asc)."""

from npusim.kernels.cann_gelu.family import FAMILY

__all__ = ["FAMILY"]
