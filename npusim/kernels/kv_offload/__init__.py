"""GatherSelectionKvCache (hicann/cann-recipes-infer) on a device- or host-resident KV cache."""

from npusim.kernels.kv_offload.family import FAMILY

__all__ = ["FAMILY"]
