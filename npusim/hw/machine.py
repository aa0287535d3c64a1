"""The simulated machine: W ranks (dies), each with AIV cores, HBM, GM and a window."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from npusim.engine.env import SimEnv
from npusim.engine.flow import FlowNetwork, Resource
from npusim.engine.trace import Trace
from npusim.hw.config import HardwareConfig
from npusim.hw.fabric import Fabric
from npusim.hw.memory import (
    DenseRegion,
    Region,
    RowTable,
    RowTableRegion,
    SparseRegion,
    paged_zeros,
)
from npusim.hw.pipe import FixedPipe, TransferPipe
from npusim.hw.ub import UnifiedBuffer


class Core:
    """One AIV core: four pipes and its UB."""

    def __init__(self, env: simpy.Environment, rank: int, index: int, cfg: HardwareConfig,
                 later: Callable[[float, Callable[[], None]], None] | None = None,
                 ub: UnifiedBuffer | None = None) -> None:
        self.rank = rank
        self.index = index
        self.ub = ub if ub is not None else UnifiedBuffer(cfg.ub.bytes, cfg.ub.alignment)
        self.scalar = FixedPipe("scalar")
        self.vector = FixedPipe("vector")
        self.mte2 = TransferPipe(env, "mte2", later)
        self.mte3 = TransferPipe(env, "mte3", later)


class Barrier:
    """SyncAll across the cores of one rank: all leave together after the last arrives."""

    def __init__(self, env: simpy.Environment, parties: int, cost_ns: float) -> None:
        self.env = env
        self.parties = parties
        self.cost_ns = cost_ns
        self.arrived = 0
        self.event = env.event()
        self.generation = 0

    def arrive(self) -> simpy.Event:
        ev = self.event
        self.arrived += 1
        if self.arrived == self.parties:
            self.arrived = 0
            self.generation += 1
            self.event = self.env.event()
            self.env.timeout(self.cost_ns).callbacks.append(lambda _e, ev=ev: ev.succeed())
        return ev


class Rank:
    """One die: cores, HBM bandwidth, named GM tensors and the symmetric window."""

    def __init__(self, env: SimEnv, index: int, cfg: HardwareConfig,
                 later: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        self.index = index
        self.cfg = cfg
        self.hbm = Resource(f"rank{index}.hbm", "hbm", index, cfg.hbm.bandwidth_gbps)
        self.window = SparseRegion("window", index, cfg.window.bytes)
        self.tensors: dict[str, Region] = {}
        self.cores = [Core(env, index, c, cfg, later, ub)
                      for c, ub in enumerate(self._unified_buffers(cfg))]
        self.barrier = Barrier(env, len(self.cores), cfg.sync.syncall_ns)
        self.bytes_out = 0  # bytes this rank put into other ranks' windows
        self.bytes_in = 0  # bytes other ranks put into this rank's window

    def _unified_buffers(self, cfg: HardwareConfig) -> list[UnifiedBuffer]:
        """Every core's UB as a slice of one map for the rank: pages the kernels never touch
        cost nothing, and all of it goes back to the OS with the machine (small heap
        allocations per core would stay in the process's heap, and a second machine, such as
        combine's after dispatch's, would add its own)."""
        n, cap = cfg.chip.aiv_cores, cfg.ub.bytes
        marks = UnifiedBuffer.marks_bytes(cap)
        data = paged_zeros(n * cap, f"the UBs of rank {self.index}")
        written = paged_zeros(n * marks, f"the UB write marks of rank {self.index}")
        return [UnifiedBuffer(cap, cfg.ub.alignment, data[c * cap:(c + 1) * cap],
                              written[c * marks:(c + 1) * marks]) for c in range(n)]

    def tensor(self, name: str, data: np.ndarray | int | RowTable) -> Region:
        """Create (or replace) a GM tensor from an array, a byte size or shared rows."""
        region: Region = (RowTableRegion(name, self.index, data) if isinstance(data, RowTable)
                          else DenseRegion(name, self.index, data))
        self.tensors[name] = region
        return region

    def region(self, name: str) -> Region:
        return self.window if name == "window" else self.tensors[name]


class Machine:
    """W identical ranks on one fabric, sharing one simulator and one flow network."""

    def __init__(self, cfg: HardwareConfig, world: int, trace: Trace | None = None) -> None:
        self.cfg = cfg
        self.world = world
        self.env = SimEnv()
        self.net = FlowNetwork(self.env)
        self.trace = trace or Trace()
        self.fabric = Fabric(cfg.fabric, world)
        # transfers issued ahead of simulated time start from the flow network's timer
        self.ranks = [Rank(self.env, r, cfg, self.net.call_at) for r in range(world)]
        if self.trace.detailed:  # link-utilisation counters for the timeline
            self.net.observer = self._sample

    def _sample(self, res: Resource, t_ns: float, gbps: float) -> None:
        self.trace.sample(res.name, res.kind, res.rank, t_ns, gbps)

    def resources(self) -> list[Resource]:
        return [*(r.hbm for r in self.ranks), *self.fabric.resources()]
