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
