"""Where an SDMA engine's copy goes: between which memories, over which resources, and how
long it holds its engine.

An engine copies from any memory it can address to any other: its own die's GM, another
die's GM (over the fabric level joining them), or a PE's host memory (npusim.hw.host).
The engine takes its SQEs one at a time; what an SQE costs it beyond its bytes is the
response it must wait for before it can go on:

    a read of another die's GM   the request's and the first bytes' flight over the
                                 level, and `sdma.read_ns` (the far side's turnaround)
    a read of host memory        the host's round trip (2 x `host.latency_ns`)
    a write into host memory     the same: the CPU completes a write (non-posted)
    a write into another die     nothing: posted, the engine streams on
    its own die's GM             nothing

The hold comes before the SQE's bytes stream (sdma.Path.setup_ns), and the two memories'
holds add (a host-to-host copy pays both); sdma.sqe adds the table walks of host pages
the die's SMMU does not hold (npusim.hw.host). A leg that holds the engine has had its flight
counted in the hold (the response came back), so the bytes land `sdma.latency_ns` plus
the flights of the legs that do not (a posted write) after the last byte: a host write
completes, and the next SQE starts, a round trip after its bytes, as the CPU answers.
Hardware only: it knows no library or kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.hw.config import HardwareConfig
from npusim.hw.fabric import level_between
from npusim.hw.host import host_of, server_latency_ns
from npusim.hw.machine import Machine
from npusim.hw.sdma import Path


@dataclass(frozen=True)
class Memory:
    """A copy's source or destination: die `rank`'s GM, or PE `rank`'s host memory."""

    rank: int
    host: bool = False

    @property
    def tag(self) -> str:
        """D or H, the letter a direction such as D2rH names it by."""
        return "H" if self.host else "D"


@dataclass(frozen=True)
class Leg:
    """One side of a copy: the resources it crosses, its one-way flight (ns), the time it
    holds the engine (ns), and whether it leaves the engine's die."""

    resources: tuple
    flight_ns: float
    hold_ns: float
    remote: bool


def hold_ns(cfg: HardwareConfig, rank: int, mem: Memory, reading: bool) -> float:
    """How long an SQE of die `rank`'s engine waits on `mem`'s side before it goes on, from
    the preset alone (the rule above): a read of another die, `sdma.read_ns` + the joining
    level's flight both ways; host memory either way, the host's round trip (the
    supernode's extra flight too when the PE is on another server); nothing else."""
    if mem.host:
        host = cfg.host
        cross = rank // host.dies != mem.rank // host.dies
        return 2 * (host.latency_ns + ((server_latency_ns(cfg) or 0.0) if cross else 0.0))
    if mem.rank == rank or not reading:
        return 0.0
    return cfg.sdma.read_ns + 2 * level_between(cfg.fabric, mem.rank, rank).latency_ns


def read_leg(machine: Machine, rank: int, src: Memory, nbytes: int) -> Leg:
    """Engine of die `rank` reading `nbytes` of `src`."""
    hold = hold_ns(machine.cfg, rank, src, True)
    if src.host:
        path = host_of(machine).read_path(rank, src.rank)
        return Leg(path.resources, path.latency_ns / 2, hold, src.rank != rank)
    read = machine.ranks[src.rank].read_path(nbytes)
    if src.rank == rank:
        return Leg(read, 0.0, hold, False)
    links, flight = machine.fabric.route(src.rank, rank)
    return Leg((*read, *links), flight, hold, True)


def write_leg(machine: Machine, rank: int, dst: Memory, nbytes: int) -> Leg:
    """Engine of die `rank` writing `nbytes` into `dst`."""
    hold = hold_ns(machine.cfg, rank, dst, False)
    if dst.host:
        path = host_of(machine).write_path(rank, dst.rank)
        return Leg(path.resources, path.latency_ns, hold, dst.rank != rank)
    landing = machine.ranks[dst.rank].write_path(nbytes)
    if dst.rank == rank:
        return Leg(landing, 0.0, hold, False)
    links, flight = machine.fabric.route(rank, dst.rank)
    return Leg((*links, *landing), flight, hold, True)


def counted(a: Memory, b: Memory) -> bool:
    """Whether a copy from `a` to `b` counts as bytes sent between ranks (device GM of two
    dies; host memory is not a rank's)."""
    return not (a.host or b.host) and a.rank != b.rank


def engine_copy(machine: Machine, rank: int, src: Memory, dst: Memory, nbytes: int) -> Path:
    """The path of one SQE of die `rank`'s engine copying `nbytes` from `src` to `dst`: the
    resources of both legs, the engine's rate cap, the legs' holds as its setup, and its
    landing `sdma.latency_ns` plus the flights of the legs that hold nothing after its
    last byte."""
    a, b = read_leg(machine, rank, src, nbytes), write_leg(machine, rank, dst, nbytes)
    sdma = machine.cfg.sdma
    flight = sum(leg.flight_ns for leg in (a, b) if not leg.hold_ns)
    # a copy within one socket's memory crosses its DRAM twice; a flow counts a resource
    # once, so such a copy loads it at its rate once (the socket's ports bind first)
    resources = tuple(dict.fromkeys((*a.resources, *b.resources)))
    return Path(resources, sdma.latency_ns + flight,
                sdma.bandwidth_gbps, setup_ns=a.hold_ns + b.hold_ns)
