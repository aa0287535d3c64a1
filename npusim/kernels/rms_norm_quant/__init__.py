"""RmsNormQuant of hicann/cann-samples (Samples/2_Performance/rms_norm_quant_story): x[a, r]
float16 -> y[a, r] int8, in the seven steps of its src/0..6, one family option `step`."""

from npusim.kernels.rms_norm_quant.family import FAMILY

__all__ = ["FAMILY"]
