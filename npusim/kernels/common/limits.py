"""The shape limits of ops-transformer's MoeDistributeDispatchV3 / CombineV3 (their docs in
cannmirror/ops-transformer `mc2/moe_distribute_dispatch_v3`, and the CANN sample built on
them): BS 1..512, H 1024..8192, K 1..16, EP 2..768, at most 1024 MoE experts, 0..4 shared
experts; H a multiple of 32 (one MX block, whole 32 B UB blocks per INT8 row). The families
that run those operators' algorithm declare them (Family.shape_limits); the others declare
their own or take the default."""

from __future__ import annotations

from dataclasses import replace

from npusim.workload.shape import DEFAULT_WHY, ShapeLimits

DISPATCH_V3_LIMITS = ShapeLimits(bs=(1, 512), h=(1024, 8192), h_multiple=32, k=(1, 16),
                                 ep_world_size=(2, 768), experts=1024, shared_experts=(0, 4),
                                 source="ops-transformer MoeDistributeDispatchV3 / CombineV3")

# The shape limits of a family that declares none: the ranges npusim's MoE families were
# written and checked in (the DispatchV3 ones), said to be npusim's in the messages.
DEFAULT_LIMITS = replace(DISPATCH_V3_LIMITS, source="npusim's default: the family declares "
                         "no shape limits", why=DEFAULT_WHY)


def kernel_limits(source: str, **ranges: object) -> ShapeLimits:
    """npusim's default ranges with those a kernel's own source sets (`ranges`, in
    ShapeLimits' names), each said to be the kernel's limit and where it is written."""
    return replace(DEFAULT_LIMITS, **ranges, why="kernel limit", sourced=tuple(ranges),
                   source=source)
