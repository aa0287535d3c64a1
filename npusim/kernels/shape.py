"""OnShape: a family tiling that holds a MoE shape (npusim.workload.shape.MoeShape) and
names its sizes the way the sources' formulas and the launcher do."""

from __future__ import annotations

from operator import attrgetter
from typing import Any


def _size(name: str) -> Any:
    """A size read off the tiling's shape: a property whose getter is C code (kernels read
    these in their inner loops)."""
    return property(attrgetter(f"shape.{name}"))


class OnShape:
    """A family tiling that holds a `shape` with W ranks (a MoeShape, or a family's own
    such as mc2's): its sizes under the names the kernels' formulas use (BS, H, K, L, S,
    E, W), so a tiling writes `t.BS` as the source writes it, and the world size also as
    the launcher names it (world)."""

    shape: Any

    W = world = _size("W")
    BS = _size("BS")
    H = _size("H")
    K = _size("K")
    L = _size("L")
    S = _size("S")
    E = _size("E")

    # ---- the ranks of a shape with shared experts (ops-transformer V2)
    def is_shared_rank(self, rank: int) -> bool:
        return self.shape.is_shared_rank(rank)

    def expert_rank(self, expert: int) -> int:
        return self.shape.expert_rank(expert)

    def shared_dst(self, rank: int, j: int) -> int:
        return self.shape.shared_dst(rank, j)

    def status_count(self, rank: int) -> int:
        """rscvStatusNum_: W entries on a shared rank, W * L on a MoE rank."""
        return self.shape.status_count(rank)

    def local_experts(self, rank: int) -> int:
        """expert_token_nums entries: 1 on a shared rank, L on a MoE rank."""
        return self.shape.local_experts(rank)
