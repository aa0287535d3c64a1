"""Host memory: each server's CPU sockets and their DRAM, and the paths NPU dies take to them.

A server (`host.dies` consecutive ranks) has `host.sockets` CPU sockets; its dies are split
evenly over them (die d of a server hangs off socket d // (dies / sockets), the NUMA node
a PE's process runs on). Each socket has DRAM of `host.socket_bytes` and `host.dram_gbps`
(reads and writes share it), takes writes in from the NPUs' interconnect at
`host.write_gbps` and serves reads out at `host.read_gbps` (a socket writes at about half
the rate it reads: hicann/hixl's D2rH against rH2D); each die has a path to the host of
`host.npu_link_gbps` each way. SHMEM's HOST_SIDE
heap of PE p lives in the DRAM of p's socket.

A transfer between die r and the host memory of PE p (a flow of the shared network, so
its time is latency + bytes over its share of every resource on its path):

    D2H / D2rH  r's host port (out), the socket's CPU port (in), the socket's DRAM
    H2D / rH2D  the socket's DRAM, the socket's CPU port (out), r's host port (in)

"r" (remote) is another PE's heap: on the same server it is reached through the same
switches (the CPUs hang off the NPUs' UB switches); on another server through the
supernode fabric, which adds the latency that the fabric level joining the two servers
adds over the server level (its non-blocking uplinks impose no share). A flat fabric (no
levels) has no server grouping to cross, so it has no path to another server's host.
One-way flight latency is `host.latency_ns`; a read pays it twice (request, data).

Pages. A host tensor is mapped in pages of its allocator's size (`host.huge_page_bytes`
for SHMEM's HOST_SIDE heap, `host.page_bytes` for ordinary pinned memory), and a die's
SMMU translates each access's pages: it keeps the last `host.tlb_entries` pages it
translated (least recently used out), and the pages an access touches that it does not
hold each need a table walk of `host.page_walk_ns`, `host.walkers` of them at a time:

    walk time = ceil(missed pages / walkers) x page_walk_ns

added to the access's latency (an SDMA SQE's engine holds for it before its bytes). A
run is one iteration of a loop: the cache starts as an earlier one left it, with each
tensor's first pages, on a die's first touch, in the room it has (evicting nothing).

What it leaves out: host traffic does not share the die's UB ports with MTE puts (they
are separate resources here), and the CPUs' coherence traffic is not modelled; the walk
is one figure whatever the page size. Hardware only: nothing here knows of SHMEM calls
or kernels.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from npusim.engine.flow import Resource
from npusim.hw.config import HardwareConfig, HostConfig
from npusim.hw.machine import Rank
from npusim.hw.memory import Region
from npusim.units import ceil_div


class HostRegion(Region):
    """A tensor in PE `rank`'s HOST_SIDE heap: bytes in its socket's DRAM, mapped into every
    die's address space (rank = the PE that allocated it, not a die holding the bytes). It
    keeps the storage of the GM tensor it was made from (dense, shared rows or mapped)."""

    host_side = True

    def __init__(self, inner: Region, page_bytes: int) -> None:
        super().__init__(inner.name, inner.rank, inner.nbytes)
        self.inner = inner
        self.page_bytes = page_bytes  # its allocator's page: what the SMMU translates

    @property
    def pages(self) -> int:
        return ceil_div(self.nbytes, self.page_bytes)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.inner.read(offset, nbytes)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        self.inner.read_into(offset, out)

    def peek(self, offset: int, nbytes: int) -> np.ndarray:
        return self.inner.peek(offset, nbytes)

    def write(self, offset: int, data: np.ndarray) -> None:
        self.inner.write(offset, data)
        self._notify(offset, data.size)

    def as_array(self, dtype: np.dtype | type, shape: tuple[int, ...] | None = None
                 ) -> np.ndarray:
        return self.inner.as_array(dtype, shape)


class Tlb:
    """One die's cache of host-page translations (its SMMU's), least recently used out."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self.pages: OrderedDict[tuple[int, str, int], None] = OrderedDict()
        self.known: set[tuple[int, str]] = set()
        self.misses = 0

    def warm(self, region: HostRegion) -> None:
        """On the die's first touch of `region`: its first pages as an earlier iteration of
        the loop left them, as many as the cache has room for (nothing is evicted)."""
        tensor = (region.rank, region.name)
        if tensor in self.known:
            return
        self.known.add(tensor)
        for page in range(min(self.entries - len(self.pages), region.pages)):
            self.pages.setdefault((*tensor, page), None)

    def touch(self, region: HostRegion, offset: int, nbytes: int) -> int:
        """The pages of `nbytes` at `offset` translated in order; returns how many missed."""
        self.warm(region)
        first = offset // region.page_bytes
        last = (offset + max(nbytes, 1) - 1) // region.page_bytes
        missed = 0
        for page in range(first, last + 1):
            key = (region.rank, region.name, page)
            if key in self.pages:
                self.pages.move_to_end(key)
                continue
            missed += 1
            self.pages[key] = None
            if len(self.pages) > self.entries:
                self.pages.popitem(last=False)
        self.misses += missed
        return missed


@dataclass(frozen=True)
class Path:
    """A host transfer's resources, flight latency (ns) and name (D2H, D2rH, H2D, rH2D)."""

    resources: tuple[Resource, ...]
    latency_ns: float
    kind: str
    cross_server: bool


def socket_of(cfg: HostConfig, rank: int) -> tuple[int, int]:
    """(server, socket) of a die: its server's host and the socket it hangs off."""
    per = cfg.dies // cfg.sockets
    return rank // cfg.dies, rank % cfg.dies // per


def server_latency_ns(cfg: HardwareConfig) -> float | None:
    """What crossing to another server adds to a host transfer's flight: the latency of
    the fabric level joining servers minus that of the server level (None: the fabric has
    no level above a server, the flat form)."""
    host = cfg.host
    if host is None or not cfg.fabric.levels:
        return None
    inner = 0.0
    for lv in cfg.fabric.levels:
        if lv.dies == host.dies:
            inner = lv.latency_ns
        elif lv.dies > host.dies:
            return max(0.0, lv.latency_ns - inner)
    return None


def path_problem(cfg: HardwareConfig, world: int) -> str | None:
    """Why `world` PEs cannot all reach every PE's host memory on this preset (one line),
    or None."""
    host = cfg.host
    if host is None:
        return f"{cfg.name} has no host memory (no host section)"
    if host.dies % host.sockets:
        return (f"host.dies {host.dies} is not a multiple of host.sockets {host.sockets}: "
                "a server's dies are split evenly over its sockets")
    if world > host.dies and server_latency_ns(cfg) is None:
        return (f"{world} PEs span {ceil_div(world, host.dies)} servers of {host.dies} dies, but "
                f"{cfg.name} has no path to another server's host (D2rH / rH2D need a fabric "
                f"level joining servers); allowed: at most {host.dies} PEs")
    return None


def capacity_problem(cfg: HardwareConfig, world: int, heap_bytes: int) -> str | None:
    """Why a HOST_SIDE heap of `heap_bytes` per PE does not fit its socket's DRAM, or None."""
    host = cfg.host
    assert host is not None
    per_socket = min(world, host.dies // host.sockets)
    need = per_socket * heap_bytes
    if need > host.socket_bytes:
        return (f"{per_socket} PE(s) per socket x {heap_bytes} B of HOST_SIDE heap = {need} B, "
                f"above a socket's {host.socket_bytes} B of DRAM (host.socket_bytes)")
    return None


class Host:
    """The host memory of every server a machine's ranks sit in (built on first use)."""

    def __init__(self, cfg: HardwareConfig, world: int) -> None:
        problem = path_problem(cfg, world)
        if problem:
            raise ValueError(problem)
        assert cfg.host is not None
        self.cfg = cfg.host
        self.world = world
        self.extra_ns = server_latency_ns(cfg) or 0.0
        self.heaps: dict[int, list[HostRegion]] = {}  # per PE, its HOST_SIDE tensors
        self._die: dict[int, tuple[Resource, Resource]] = {}
        self._socket: dict[tuple[int, int], tuple[Resource, Resource, Resource]] = {}
        self._listed: list[Resource] = []
        self._tlb: dict[int, Tlb] = {}

    # -- the heap -----------------------------------------------------------------------
    def adopt(self, rank: Rank, name: str, huge_pages: bool = True) -> HostRegion:
        """GM tensor `name` of `rank` placed in that PE's host memory (by default SHMEM's
        HOST_SIDE heap, aclshmemx_malloc(..., HOST_SIDE), in huge pages; else pinned memory
        in the OS's base pages), filled by the host's aclrtMemcpy before the launch,
        untimed: the same bytes, now in host DRAM; the tensor is read back from there after
        the run. The same region on every later call."""
        region = rank.tensors[name]
        if isinstance(region, HostRegion):
            return region
        c = self.cfg
        host = HostRegion(region, c.huge_page_bytes if huge_pages else c.page_bytes)
        rank.tensors[name] = host
        self.heaps.setdefault(rank.index, []).append(host)
        return host

    # -- translation --------------------------------------------------------------------
    def walk_ns(self, rank: int, region: HostRegion, offset: int, nbytes: int) -> float:
        """What die `rank`'s SMMU adds to an access of `nbytes` of `region` at `offset`: the
        walks of the pages it does not hold, `walkers` at a time."""
        tlb = self._tlb.get(rank)
        if tlb is None:
            tlb = self._tlb[rank] = Tlb(self.cfg.tlb_entries)
        missed = tlb.touch(region, offset, nbytes)
        return math.ceil(missed / self.cfg.walkers) * self.cfg.page_walk_ns

    def misses(self, rank: int) -> int:
        """Host pages die `rank`'s SMMU has had to walk so far."""
        tlb = self._tlb.get(rank)
        return tlb.misses if tlb else 0

    # -- resources ------------------------------------------------------------------------
    def _die_ports(self, rank: int) -> tuple[Resource, Resource]:
        ports = self._die.get(rank)
        if ports is None:
            bw = self.cfg.npu_link_gbps
            ports = self._die[rank] = (
                Resource(f"rank{rank}.host.npu_out", "host.npu_out", rank, bw),
                Resource(f"rank{rank}.host.npu_in", "host.npu_in", rank, bw))
            self._listed += ports
        return ports

    def _socket_of_pe(self, pe: int) -> tuple[Resource, Resource, Resource]:
        key = socket_of(self.cfg, pe)
        res = self._socket.get(key)
        if res is None:
            server, sock = key
            first = server * self.cfg.dies + sock * (self.cfg.dies // self.cfg.sockets)
            name = f"server{server}.socket{sock}"
            c = self.cfg
            res = self._socket[key] = (
                Resource(f"{name}.cpu_in", "host.cpu_in", first, c.write_gbps),
                Resource(f"{name}.cpu_out", "host.cpu_out", first, c.read_gbps),
                Resource(f"{name}.dram", "host.dram", first, c.dram_gbps))
            self._listed += res
        return res

    def _latency(self, rank: int, pe: int) -> tuple[float, bool]:
        cross = rank // self.cfg.dies != pe // self.cfg.dies
        return self.cfg.latency_ns + (self.extra_ns if cross else 0.0), cross

    def write_path(self, rank: int, pe: int) -> Path:
        """Die `rank` writing into PE `pe`'s host memory (D2H when pe is rank, else D2rH)."""
        out, _ = self._die_ports(rank)
        cpu_in, _, dram = self._socket_of_pe(pe)
        latency, cross = self._latency(rank, pe)
        return Path((out, cpu_in, dram), latency, "D2H" if pe == rank else "D2rH", cross)

    def read_path(self, rank: int, pe: int) -> Path:
        """Die `rank` reading PE `pe`'s host memory (H2D when pe is rank, else rH2D): the
        flight latency both ways (the request out, the data back)."""
        _, into = self._die_ports(rank)
        _, cpu_out, dram = self._socket_of_pe(pe)
        latency, cross = self._latency(rank, pe)
        return Path((dram, cpu_out, into), 2 * latency, "H2D" if pe == rank else "rH2D", cross)

    def resources(self) -> list[Resource]:
        return list(self._listed)


def host_of(machine: object) -> Host:
    """The machine's host memory, built when a kernel first touches it."""
    host = getattr(machine, "host", None)
    if host is None:
        host = Host(machine.cfg, machine.world)  # type: ignore[attr-defined]
        machine.host = host  # type: ignore[attr-defined]
    return host


def lone_path(cfg: HardwareConfig, rank: int, pe: int, write: bool) -> tuple[float, float]:
    """(flight latency ns, narrowest bandwidth GB/s) of die `rank`'s path to PE `pe`'s host
    memory when nothing else uses it: what one transfer there costs beyond its issue."""
    host = cfg.host
    assert host is not None
    cross = rank // host.dies != pe // host.dies
    latency = host.latency_ns + ((server_latency_ns(cfg) or 0.0) if cross else 0.0)
    return (latency if write else 2 * latency,
            min(host.npu_link_gbps, host.write_gbps if write else host.read_gbps,
                host.dram_gbps))


def walk_of(machine: object, rank: int, region: Region, offset: int, nbytes: int) -> float:
    """The table walks die `rank` pays to reach `nbytes` of `region` at `offset` (0 for
    device GM, which the SMMU's host translations do not cover)."""
    if not isinstance(region, HostRegion):
        return 0.0
    return host_of(machine).walk_ns(rank, region, offset, nbytes)
