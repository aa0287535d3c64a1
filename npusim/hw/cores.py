"""Core kinds: what pipes and local buffers a kind of core has, as data.

A core is an instance of a kind (SimPy's template methods: the base builds whatever the
kind declares). The machine builds a kind's cores and buffers from the preset keys the
kind names; the runtime drains the pipes it declares and checks a kernel's buffers and
pipes against them; the report's stream times, ports and diagnosis, and the trace's
lanes, iterate its pipes. So a new kind (an AIC cube core with MTE1, cube and FixPipe
and L1/L0A/L0B/L0C, or an SDMA engine) is a declaration here, not a change to the
runtime's core loop.

Pipe roles: "issue" is the scalar unit (it issues everything and is never drained),
"fixed" a pipe whose instructions cost a time known at issue (vector), "transfer" an
MTE queue whose transfers last as long as the shared resources on their path allow.
Plain data and no simpy, so the report may read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PipeKind:
    name: str  # the pipe's name in kernels, transfers, trace lanes: "mte2"
    role: str  # "issue" | "fixed" | "transfer"
    label: str = ""  # for reports: "MTE2 (GM->UB)"
    # transfer pipes: remote? -> dotted preset key of the port cap in GB/s (absent: none)
    caps: Mapping[bool, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BufferKind:
    name: str  # "ub"
    size_key: str  # dotted preset key of its size in bytes
    align_key: str  # dotted preset key of its alignment in bytes


@dataclass(frozen=True)
class CoreKind:
    name: str  # "aiv"
    count_key: str  # dotted preset key of the cores per rank
    pipes: tuple[PipeKind, ...]
    buffers: tuple[BufferKind, ...]

    def count(self, cfg: Any) -> int:
        return int(config_value(cfg, self.count_key))

    def pipe_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pipes)

    def drained(self) -> tuple[str, ...]:
        """Pipes a PipeBarrier<PIPE_ALL> waits for, in declared order."""
        return tuple(p.name for p in self.pipes if p.role != "issue")

    def transfer_pipes(self) -> tuple[PipeKind, ...]:
        return tuple(p for p in self.pipes if p.role == "transfer")

    def labels(self) -> dict[str, str]:
        return {p.name: p.label or p.name for p in self.pipes}


def config_value(cfg: Any, dotted: str) -> Any:
    """A dotted key of a HardwareConfig or of its dict form (a report's hardware)."""
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
        if node is None:
            return None
    return node


AIV = CoreKind(
    "aiv", "chip.aiv_cores",
    pipes=(
        PipeKind("scalar", "issue", "scalar"),
        PipeKind("vector", "fixed", "vector"),
        PipeKind("mte2", "transfer", "MTE2 (GM->UB)", {False: "mte.gm_to_ub_gbps"}),
        PipeKind("mte3", "transfer", "MTE3 (UB->GM, puts)",
                 {False: "mte.ub_to_gm_gbps", True: "mte.put_gbps"}),
    ),
    buffers=(BufferKind("ub", "ub.bytes", "ub.alignment"),),
)

KINDS: dict[str, CoreKind] = {AIV.name: AIV}


def register(kind: CoreKind) -> CoreKind:
    """Make a kind known by name (to the machine, launch, report and trace)."""
    KINDS[kind.name] = kind
    return kind


def kind(name: str) -> CoreKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown core kind {name!r}; kinds: {', '.join(KINDS)}") from None
