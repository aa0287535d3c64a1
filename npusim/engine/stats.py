"""What components report of a finished run, as plain records (no simpy): a shared
resource's bytes, a rank's traffic, a core's transfers, pipe busy time and counters. The
components build them (Machine.link_stats, Rank.stats, KernelContext.stats); the driver
collects them into the OpRun without reading the components' internals."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LinkStats:
    """Bytes and busy time of one shared resource (a die's egress, HBM, ...)."""

    name: str
    kind: str  # "egress" | "ingress" | "d2d" | "hbm", or a level's ("server.egress")
    rank: int
    bandwidth_gbps: float
    bytes: int = 0


@dataclass(frozen=True)
class TransferStat:
    """What one core moved with one kind of transfer in one phase (per kernel call).

    phase is the kernel phase the transfer was issued in ("start" outside any phase);
    pipe "mte2" (GM -> UB) or "mte3" (UB -> GM, puts); remote: a put over the fabric
    to another rank; bytes as charged to the pipe (strided blocks rounded to 32 B)."""

    phase: str
    pipe: str
    name: str
    remote: bool
    count: int
    bytes: int


@dataclass(frozen=True)
class RankStats:
    """One die's window traffic and the writes its L2 held."""

    bytes_sent: int  # put into other ranks' windows
    bytes_received: int  # other ranks put into this rank's window
    l2_held: int  # bytes of writes that stayed in the L2


@dataclass(frozen=True)
class CoreStats:
    """One launched core: what it put, its transfers, each pipe's busy time (a transfer
    pipe: time with a transfer in flight) and its instruction counters."""

    label: str  # "AIC 0" / "AIV 1" within a MIX block, else the kind and index
    bytes_put: int
    transfers: list[TransferStat] = field(default_factory=list)
    busy_ns: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
