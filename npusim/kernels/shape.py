"""OnShape: a family tiling that holds a MoE shape (npusim.workload.shape.MoeShape) and
names its sizes the way the sources' formulas and the launcher do."""

from __future__ import annotations

from typing import Any


class OnShape:
    """A family tiling that holds a `shape` with W ranks (a MoeShape, or a family's own
    such as mc2's): its sizes under the names the kernels' formulas use (BS, H, K, L, S,
    E, W), so a tiling writes `t.BS` as the source writes it, and the world size also as
    the launcher names it (world)."""

    shape: Any

    @property
    def W(self) -> int:
        return self.shape.W

    @property
    def world(self) -> int:
        return self.shape.W

    @property
    def BS(self) -> int:
        return self.shape.BS

    @property
    def H(self) -> int:
        return self.shape.H

    @property
    def K(self) -> int:
        return self.shape.K

    @property
    def L(self) -> int:
        return self.shape.L

    @property
    def S(self) -> int:
        return self.shape.S

    @property
    def E(self) -> int:
        return self.shape.E

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
