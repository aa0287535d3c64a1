"""OnShape: a family tiling that holds a MoE shape (npusim.workload.shape.MoeShape) and
names its world size the way both the sources' formulas and the launcher do."""

from __future__ import annotations

from typing import Any


class OnShape:
    """A family tiling that holds a `shape` with W ranks (a MoeShape, or a family's own
    such as mc2's): the world size under both names the kernels use (W in the sources'
    formulas, world for the launcher)."""

    shape: Any

    @property
    def W(self) -> int:
        return self.shape.W

    @property
    def world(self) -> int:
        return self.shape.W
