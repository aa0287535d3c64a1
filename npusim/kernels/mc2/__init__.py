"""ops-transformer MoeDistributeDispatchV3 / CombineV3 (fullmesh_v1) as a kernel family
(docs/kernels/mc2.md); the registry imports FAMILY."""

from npusim.kernels.mc2.family import FAMILY

__all__ = ["FAMILY"]
