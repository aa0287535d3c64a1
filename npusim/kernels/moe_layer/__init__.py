"""A whole MoE layer on the A3 as DeepEP-Ascend's tests time it (FAMILY)."""

from npusim.kernels.moe_layer.family import FAMILY

__all__ = ["FAMILY"]
