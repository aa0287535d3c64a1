"""Inter-die links and the path a put takes between two ranks.

Ascend 950 class (dies_per_package = 1): every die reaches every other through a switch
(full mesh); a put crosses the source die's egress and the destination die's ingress.
Atlas A3 (dies_per_package = 2): two dies of one package are joined by a die-to-die
(SIO) link, one per direction; dies of different packages use their HCCS/UB egress and
ingress. A put to the own rank never leaves the die.
"""

from __future__ import annotations

from npusim.engine.flow import Resource
from npusim.hw.config import FabricConfig


class Fabric:
    def __init__(self, cfg: FabricConfig, world: int) -> None:
        self.cfg = cfg
        self.world = world
        self.egress = [Resource(f"rank{r}.egress", "egress", r, cfg.egress_gbps)
                       for r in range(world)]
        self.ingress = [Resource(f"rank{r}.ingress", "ingress", r, cfg.ingress_gbps)
                        for r in range(world)]
        self.d2d: dict[tuple[int, int], Resource] = {}
        per = cfg.dies_per_package
        if per > 1:
            for r in range(world):
                pkg = r // per
                for peer in range(pkg * per, min(world, pkg * per + per)):
                    if peer != r:
                        self.d2d[(r, peer)] = Resource(f"rank{r}->rank{peer}.d2d", "d2d", r,
                                                       cfg.d2d_gbps)
        self._paths: dict[tuple[int, int], tuple[tuple[Resource, ...], float]] = {}

    def route(self, src: int, dst: int) -> tuple[tuple[Resource, ...], float]:
        """The link resources and added latency (ns) between two different ranks."""
        key = (src, dst)
        hit = self._paths.get(key)
        if hit is None:
            link = self.d2d.get(key)
            if link is not None:
                hit = ((link,), self.cfg.d2d_latency_ns)
            else:
                hit = ((self.egress[src], self.ingress[dst]), self.cfg.link_latency_ns)
            self._paths[key] = hit
        return hit

    def resources(self) -> list[Resource]:
        return [*self.egress, *self.ingress, *self.d2d.values()]
