"""The simulated machine: W ranks (dies), each with cores of declared kinds (AIV by
default; npusim.hw.cores), HBM, GM and a window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from npusim.engine.env import SimEnv
from npusim.engine.flow import FlowNetwork, Resource
from npusim.engine.stats import LinkStats, RankStats
from npusim.engine.trace import Trace
from npusim.hw.config import HardwareConfig
from npusim.hw.cores import AIV, CoreKind, config_value
from npusim.hw.fabric import Fabric
from npusim.hw.l2 import L2
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
    """One core of a kind: the pipes and local buffers the kind declares, by name (as
    attributes too: core.vector, core.mte2, core.ub)."""

    def __init__(self, env: simpy.Environment, rank: int, index: int, kind: CoreKind,
                 buffers: dict[str, UnifiedBuffer],
                 later: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        self.rank = rank
        self.index = index
        self.kind = kind
        self.pipes: dict[str, FixedPipe | TransferPipe] = {}
        for p in kind.pipes:
            pipe = TransferPipe(env, p.name, later) if p.role == "transfer" else FixedPipe(p.name)
            self.pipes[p.name] = pipe
            setattr(self, p.name, pipe)
        self.buffers = buffers
        for name, buf in buffers.items():
            setattr(self, name, buf)

    def busy_ns(self) -> dict[str, float]:
        """Per pipe, its busy time (a transfer pipe: time with a transfer in flight)."""
        return {name: pipe.busy_union_ns if isinstance(pipe, TransferPipe) else pipe.busy_ns
                for name, pipe in self.pipes.items()}


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
                 later: Callable[[float, Callable[[], None]], None] | None = None,
                 kinds: tuple[CoreKind, ...] = (AIV,), window_bytes: int | None = None) -> None:
        self.index = index
        self.cfg = cfg
        self.hbm = Resource(f"rank{index}.hbm", "hbm", index, cfg.hbm.bandwidth_gbps)
        self._hbm_path = (self.hbm,)
        self.l2 = L2(cfg.l2.bytes if cfg.l2 else 0)
        self.window = SparseRegion("window", index, window_bytes or cfg.window.bytes)
        self.tensors: dict[str, Region] = {}
        # cores by kind; `cores` are those of the first kind (the kernel's). A MIX kind's
        # parts are built as kinds of their own, and the MIX kind's list is its blocks'
        # cores in block order (aic 0, aiv 0, aiv 1, aic 1, aiv 2, ...)
        built = {part.name: part for k in kinds for part in ([p for p, _ in k.parts] or [k])}
        self.cores_of = {k.name: [Core(env, index, c, k, bufs, later)
                                  for c, bufs in enumerate(self._buffers(k, cfg))]
                         for k in built.values()}
        for k in kinds:
            if k.parts:
                self.cores_of[k.name] = self._blocks(k)
        self.cores = self.cores_of[kinds[0].name]
        self.barrier = Barrier(env, len(self.cores), cfg.sync.syncall_ns)
        # SyncAll of one kind's cores in a MIX launch (SyncAll<isAIVOnly>); set by launch
        self.barriers: dict[str, Barrier] = {}
        self.bytes_out = 0  # bytes this rank put into other ranks' windows
        self.bytes_in = 0  # bytes other ranks put into this rank's window

    def stats(self) -> RankStats:
        """The die's window traffic and the writes its L2 held, since it was built."""
        return RankStats(self.bytes_out, self.bytes_in, self.l2.absorbed)

    def read_path(self, nbytes: int) -> tuple[Resource, ...]:
        """The resources a GM read of `nbytes` from this die crosses: its HBM."""
        self.l2.read(nbytes)
        return self._hbm_path

    def write_path(self, nbytes: int) -> tuple[Resource, ...]:
        """The resources a GM write of `nbytes` into this die crosses: none while its L2
        has room for the lines (npusim.hw.l2), its HBM after."""
        return () if self.l2.write(nbytes) else self._hbm_path

    def _blocks(self, kind: CoreKind) -> list[Core]:
        """The cores of a MIX kind's blocks, block by block; as many blocks as every part
        has cores for."""
        blocks = min(len(self.cores_of[p.name]) // n for p, n in kind.parts)
        return [self.cores_of[p.name][b * n + j] for b in range(blocks)
                for p, n in kind.parts for j in range(n)]

    def _buffers(self, kind: CoreKind, cfg: HardwareConfig) -> list[dict[str, UnifiedBuffer]]:
        """Every core's local buffers, each kind of buffer a slice of one map for the rank:
        pages the kernels never touch cost nothing, and all of it goes back to the OS with
        the machine (small heap allocations per core would stay in the process's heap, and
        a second machine, such as combine's after dispatch's, would add its own)."""
        n = kind.count(cfg)
        out: list[dict[str, UnifiedBuffer]] = [{} for _ in range(n)]
        for b in kind.buffers:
            cap, align = int(config_value(cfg, b.size_key)), int(config_value(cfg, b.align_key))
            marks = UnifiedBuffer.marks_bytes(cap)
            label = b.name.upper()
            data = paged_zeros(n * cap, f"the {label}s of rank {self.index}")
            written = paged_zeros(n * marks, f"the {label} write marks of rank {self.index}")
            for c in range(n):
                out[c][b.name] = UnifiedBuffer(cap, align, data[c * cap:(c + 1) * cap],
                                               written[c * marks:(c + 1) * marks], label)
        return out

    def tensor(self, name: str, data: np.ndarray | int | RowTable) -> Region:
        """Create (or replace) a GM tensor from an array, a byte size or shared rows."""
        region: Region = (RowTableRegion(name, self.index, data) if isinstance(data, RowTable)
                          else DenseRegion(name, self.index, data))
        self.tensors[name] = region
        return region

    def workspace(self, name: str, nbytes: int) -> Region:
        """A GM area of the runtime's own on this rank (SHMEM's core sync pool, the SDMA and
        RDMA workspaces): made, zeroed, at the first core's first use, then shared."""
        region = self.tensors.get(name)
        return self.tensor(name, nbytes) if region is None else region

    def region(self, name: str) -> Region:
        return self.window if name == "window" else self.tensors[name]


class Machine:
    """W identical ranks on one fabric, sharing one simulator and one flow network;
    `window_bytes`, where given, the window each rank maps instead of the preset's."""

    def __init__(self, cfg: HardwareConfig, world: int, trace: Trace | None = None,
                 kinds: tuple[CoreKind, ...] = (AIV,), window_bytes: int | None = None) -> None:
        self.cfg = cfg
        self.kinds = kinds
        self.world = world
        self.env = SimEnv()
        self.net = FlowNetwork(self.env)
        self.trace = trace or Trace()
        self.fabric = Fabric(cfg.fabric, world)
        # transfers issued ahead of simulated time start from the flow network's timer
        self.ranks = [Rank(self.env, r, cfg, self.net.call_at, kinds, window_bytes)
                      for r in range(world)]
        # the servers' host memory (npusim.hw.host.Host): built when a kernel first
        # touches it, so runs that do not add no resources
        self.host: Any = None
        # each die's NIC port, out and in (npusim.hw.rdma.nic_ports): built on first use
        self.nic: dict[int, tuple[Resource, Resource]] = {}
        if self.trace.detailed:  # link-utilisation counters for the timeline
            self.net.observer = self._sample

    def release(self) -> None:
        """Break the machine's reference cycles once its op is over and read (the simulator
        and its processes, the flow network and its groups, the local buffers and theirs),
        so reference counting frees it without a full collection; it runs nothing after."""
        self.env.close()
        self.net.close()
        for rank in self.ranks:
            for cores in rank.cores_of.values():
                for core in cores:
                    for buf in core.buffers.values():
                        buf.close()

    def _sample(self, res: Resource, t_ns: float, gbps: float) -> None:
        self.trace.sample(res.name, res.kind, res.rank, t_ns, gbps)

    def resources(self) -> list[Resource]:
        host = self.host.resources() if self.host is not None else []
        nic = [port for ports in self.nic.values() for port in ports]
        return [*(r.hbm for r in self.ranks), *self.fabric.resources(), *host, *nic]

    def link_stats(self) -> list[LinkStats]:
        """Every shared resource's bytes since the machine was built."""
        return [LinkStats(r.name, r.kind, r.rank, r.bandwidth, r.bytes)
                for r in self.resources()]
