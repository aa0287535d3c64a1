"""The outcome of a run as plain data (no simpy): what the report layer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npusim.engine.stats import LinkStats, TransferStat
from npusim.engine.trace import Sample, Span

__all__ = ["LinkStats", "OpRun", "RunResult", "TransferStat"]


@dataclass
class OpRun:
    """One kernel call (one kernel of the scenario's family) on every rank."""

    op: str
    start_ns: float
    end_ns: float
    ranks: int
    cores_per_rank: int
    spans: list[Span] = field(default_factory=list)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)  # per source rank, puts to other ranks
    bytes_received: list[int] = field(default_factory=list)  # per destination rank
    l2_held: list[int] = field(default_factory=list)  # per rank, GM write bytes its L2 held
    links: list[LinkStats] = field(default_factory=list)
    core_bytes_put: list[list[int]] = field(default_factory=list)  # [rank][core], remote puts
    core_transfers: list[list[list[TransferStat]]] = field(default_factory=list)  # [rank][core]
    core_end_ns: list[list[float]] = field(default_factory=list)  # [rank][core], pipes drained
    phase_order: tuple[str, ...] = ()  # the kernel's phases as its family declares them
    core_kind: str = "aiv"  # the kind of core it ran on (npusim.hw.cores)
    # a MIX launch: each core's kind and index among its kind ("aic 0", "aiv 1"), by core
    # (the same on every rank); empty for a plain kind
    core_labels: list[str] = field(default_factory=list)
    engines: tuple[str, ...] = ()  # kinds built beside it that run no program (sdma)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # per rank, if kept
    # [rank][core] pipe -> busy ns (transfer pipes: time with a transfer in flight)
    core_busy_ns: list[list[dict[str, float]]] = field(default_factory=list)
    # [rank][core] counter -> executed instructions (RVECEX, RVECLD, RVECST, SCALAR)
    core_counters: list[list[dict[str, float]]] = field(default_factory=list)
    # what the kernel's family reports of this call (Kernel.fields), JSON-able
    family_fields: dict[str, Any] = field(default_factory=dict)
    # per rank, the host pages its die's SMMU had to walk (npusim.hw.host)
    translation_misses: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    scenario: dict[str, Any]
    hardware: dict[str, Any]
    ops: list[OpRun]
    events: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)  # link rates (detailed trace only)
    # How a combine forked ahead of dispatch went (workers >= 2; not part of the report):
    # "" (none was), "kept", or "redone: <why>" when combine had to run again after dispatch.
    combine_ahead: str = ""
