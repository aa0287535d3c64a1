"""Inter-die links and the path a put takes between two ranks.

A topology is a list of levels, inner to outer (package, server, supernode): level i
groups the dies in blocks of `dies` consecutive ranks. A put between two ranks crosses
the innermost level whose group holds both, and takes that level's links:

* `pair`: a link of its own per ordered pair of dies (the SIO die-to-die link of an A3
  package, the HCCS full mesh of an A2 server: one pair cannot exceed one link);
* `die`: the source die's egress port and the destination die's ingress port, shared by
  every put of the die that crosses this level;
* the name of an inner `die` level: the same ports as that level (the A3's servers reach
  the supernode through the same UB links they use inside the server).

An outer level may add an uplink: one per group of the level inside it, out of and into
the group, shared by all its dies (a server's links to the supernode's switches). An
uplink at least as wide as its dies' ports together (the A3's non-blocking supernode,
16 x 196 GB/s) can never be the bottleneck: it counts the bytes that cross it (its link
class) but imposes no level, so it neither costs a re-rating per event nor adds the
per-resource max-min's conservatism; a narrower one (an override modelling an
oversubscribed supernode) shares its bandwidth like any link. The put's flight latency
is the crossed level's. Resources exist only for the levels a world
of W ranks reaches, so a W 16 run on the A3 has no supernode links and a W 32 run has.

A preset without levels (the flat form, the ascend950) is one switch level, every die
reaching every other through its egress and ingress, with a die-to-die link inside a
package when `dies_per_package` is 2: its link classes keep their names (egress,
ingress, d2d). A put to the own rank never leaves the die.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npusim.engine.flow import Resource
from npusim.hw.config import FabricConfig, LevelConfig


@dataclass(frozen=True)
class Level:
    """A level as the fabric uses it; `prefix` starts its link kinds ('server.')."""

    name: str
    dies: int
    sharing: str  # pair | die | the name of an inner die level
    latency_ns: float
    link_gbps: float = 0.0
    egress_gbps: float = 0.0
    ingress_gbps: float = 0.0
    uplink_gbps: float | None = None
    prefix: str = ""


class NonBlocking(Resource):
    """A link whose bandwidth its flows can never exceed together (it is at least the sum
    of the ports that feed it): bytes are counted, no level is imposed."""

    __slots__ = ()

    def _water_fill(self) -> float:
        return math.inf


def levels_of(cfg: FabricConfig, world: int) -> tuple[Level, ...]:
    """The topology's levels; the flat form as its one or two levels."""
    if cfg.levels:
        return tuple(_named(lv) for lv in cfg.levels)
    out = []
    per = cfg.dies_per_package
    if per > 1:
        out.append(Level("package", per, "pair", cfg.d2d_latency_ns, link_gbps=cfg.d2d_gbps))
    out.append(Level("fabric", max(world, per), "die", cfg.link_latency_ns,
                     egress_gbps=cfg.egress_gbps, ingress_gbps=cfg.ingress_gbps))
    return tuple(out)


def joining(levels: tuple[Level, ...], src: int, dst: int) -> tuple[int, Level]:
    """The innermost of `levels` whose group holds both ranks (and the inner group size)."""
    inner = 1
    for lv in levels:
        if src // lv.dies == dst // lv.dies:
            return inner, lv
        inner = lv.dies
    raise ValueError(f"ranks {src} and {dst} are in no common level")


def level_between(cfg: FabricConfig, src: int, dst: int) -> Level:
    """The innermost level of a preset's topology joining two ranks, from the preset alone
    (no machine built)."""
    return joining(levels_of(cfg, max(src, dst) + 1), src, dst)[1]


def _named(lv: LevelConfig) -> Level:
    return Level(lv.name, lv.dies, lv.sharing, lv.latency_ns, lv.link_gbps or 0.0,
                 lv.egress_gbps or 0.0, lv.ingress_gbps or 0.0, lv.uplink_gbps,
                 prefix=f"{lv.name}.")


def _kind(level: Level, role: str, flat: bool) -> str:
    """Link class names: 'server.egress'; the flat form's 'egress', 'ingress', 'd2d'."""
    if flat:
        return "d2d" if role == "link" else role
    return level.prefix + role


class Fabric:
    def __init__(self, cfg: FabricConfig, world: int) -> None:
        self.cfg = cfg
        self.world = world
        self.levels = levels_of(cfg, world)
        flat = not cfg.levels
        self.egress: dict[str, list[Resource]] = {}
        self.ingress: dict[str, list[Resource]] = {}
        self.pair: dict[tuple[int, int], Resource] = {}
        self.uplink: dict[str, tuple[list[Resource], list[Resource]]] = {}
        self._listed: list[Resource] = []  # inner level first (the flat form: egress first)
        inner = 1
        for lv in self.levels:
            if world > inner:  # some pair of ranks crosses this level
                self._build(lv, inner, flat)
            inner = lv.dies
        if flat:
            self._listed.sort(key=lambda r: ("egress", "ingress", "d2d").index(r.kind))
        self._paths: dict[tuple[int, int], tuple[tuple[Resource, ...], float]] = {}

    def _build(self, lv: Level, inner: int, flat: bool) -> None:
        w = self.world
        if lv.sharing == "pair":
            kind = _kind(lv, "link", flat)
            for r in range(w):
                g = r // lv.dies * lv.dies
                for peer in range(g, min(w, g + lv.dies)):
                    if peer != r:
                        link = Resource(f"rank{r}->rank{peer}.{kind}", kind, r, lv.link_gbps)
                        self.pair[(r, peer)] = link
                        self._listed.append(link)
        elif lv.sharing == "die":
            out, into = _kind(lv, "egress", flat), _kind(lv, "ingress", flat)
            self.egress[lv.name] = [Resource(f"rank{r}.{out}", out, r, lv.egress_gbps)
                                    for r in range(w)]
            self.ingress[lv.name] = [Resource(f"rank{r}.{into}", into, r, lv.ingress_gbps)
                                     for r in range(w)]
            self._listed += self.egress[lv.name] + self.ingress[lv.name]
        if lv.uplink_gbps is not None:
            groups = range(0, w, inner)
            up, down = lv.prefix + "uplink", lv.prefix + "downlink"
            feed = self._ports_of(lv, inner)
            kinds = [NonBlocking if lv.uplink_gbps >= total * (1 - 1e-12) else Resource
                     for total in feed]
            span = {g: f"ranks{g}-{min(w, g + inner) - 1}" for g in groups}
            self.uplink[lv.name] = (
                [kinds[0](f"{span[g]}.{up}", up, g, lv.uplink_gbps) for g in groups],
                [kinds[1](f"{span[g]}.{down}", down, g, lv.uplink_gbps) for g in groups])
            self._listed += self.uplink[lv.name][0] + self.uplink[lv.name][1]

    def _ports_of(self, lv: Level, inner: int) -> tuple[float, float]:
        """What one inner group's dies can send and receive at most at this level: their
        egress and ingress together (a pair level's links: each die's links to the others
        of its group, which lead nowhere outside it, so none)."""
        ports = lv.name if lv.sharing == "die" else lv.sharing
        if lv.sharing == "pair":
            return (math.inf, math.inf)
        egress = next(x for x in self.levels if x.name == ports)
        return (inner * egress.egress_gbps, inner * egress.ingress_gbps)

    def level_of(self, src: int, dst: int) -> tuple[int, Level]:
        """The innermost level whose group holds both ranks (and the inner group size)."""
        return joining(self.levels, src, dst)

    def route(self, src: int, dst: int) -> tuple[tuple[Resource, ...], float]:
        """The link resources and added latency (ns) between two different ranks."""
        key = (src, dst)
        hit = self._paths.get(key)
        if hit is None:
            inner, lv = self.level_of(src, dst)
            if lv.sharing == "pair":
                links: tuple[Resource, ...] = (self.pair[key],)
            else:
                ports = lv.name if lv.sharing == "die" else lv.sharing
                links = (self.egress[ports][src], self.ingress[ports][dst])
            if lv.uplink_gbps is not None:
                up, down = self.uplink[lv.name]
                links = (*links, up[src // inner], down[dst // inner])
            hit = (links, lv.latency_ns)
            self._paths[key] = hit
        return hit

    def resources(self) -> list[Resource]:
        return list(self._listed)


def topology_text(cfg: FabricConfig) -> str:
    """One line for `npusim presets`: each level's group size and links."""
    if not cfg.levels:
        return (f"fabric {cfg.egress_gbps:g} GB/s out per die, "
                f"{cfg.dies_per_package} die(s) per package")
    parts = []
    for lv in levels_of(cfg, 0):
        if lv.sharing == "pair":
            links = f"{lv.link_gbps:g} GB/s per pair"
        elif lv.sharing == "die":
            links = f"{lv.egress_gbps:g} GB/s per die"
        else:
            links = f"{lv.sharing} ports"
        if lv.uplink_gbps is not None:
            links += f", {lv.uplink_gbps:g} GB/s uplink"
        parts.append(f"{lv.name} {lv.dies} dies ({links}, {lv.latency_ns / 1000:g} us)")
    return "topology " + ", ".join(parts)
