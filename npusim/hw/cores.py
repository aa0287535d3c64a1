"""Core kinds: what pipes and local buffers a kind of core has, as data.

A core is an instance of a kind (SimPy's template methods: the base builds whatever the
kind declares). The machine builds a kind's cores and buffers from the preset keys the
kind names; the runtime drains the pipes it declares and checks a kernel's buffers and
pipes against them; the report's stream times, ports and diagnosis, and the trace's
lanes, iterate its pipes. So a new kind is a declaration here, not a change to the
runtime's core loop: the AIC cube core (MTE2, MTE1, cube, FixPipe; L1/L0A/L0B/L0C) is one,
and a MIX launch's kind (MIX_AIC_1_2) names the kinds of one block.

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
    # transfer pipes: remote? -> dotted preset key of the port cap in GB/s, or in B per
    # cycle when the key ends in "_bytes_per_cycle" (converted at chip.clock_ghz)
    caps: Mapping[bool, str] = field(default_factory=dict)
    latency: str = ""  # transfer pipes: dotted key of the latency after the last byte (ns)


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
    # a MIX launch (KERNEL_TYPE_MIX_AIC_1_2): the kinds of one block and how many cores of
    # each a block has, in block order (aic 1, aiv 2); empty for a plain kind
    parts: tuple[tuple[CoreKind, int], ...] = ()

    def count(self, cfg: Any) -> int:
        value = config_value(cfg, self.count_key)
        if value is None:
            raise KeyError(f"core kind {self.name} needs the preset key {self.count_key}")
        return int(value)

    def pipe_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pipes)

    def drained(self) -> tuple[str, ...]:
        """Pipes a PipeBarrier<PIPE_ALL> waits for, in declared order."""
        return tuple(p.name for p in self.pipes if p.role != "issue")

    def transfer_pipes(self) -> tuple[PipeKind, ...]:
        return tuple(p for p in self.pipes if p.role == "transfer")

    def labels(self) -> dict[str, str]:
        return {p.name: p.label or p.name for p in self.pipes}


def pipe_cap(cfg: Any, pipe: PipeKind, remote: bool = False) -> float | None:
    """A transfer pipe's port cap in GB/s (a B/cycle key converted at chip.clock_ghz), or
    None when the kind or the preset gives none."""
    key = pipe.caps.get(remote)
    value = config_value(cfg, key) if key else None
    if value is None:
        return None
    if key.endswith("_bytes_per_cycle"):
        return float(value) * float(config_value(cfg, "chip.clock_ghz"))
    return float(value)


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
        PipeKind("mte2", "transfer", "MTE2 (GM->UB)",
                 {False: "mte.gm_to_ub_gbps", True: "mte.put_gbps"}, "mte.gm_to_ub_latency_ns"),
        PipeKind("mte3", "transfer", "MTE3 (UB->GM, puts)",
                 {False: "mte.ub_to_gm_gbps", True: "mte.put_gbps"}),
    ),
    buffers=(BufferKind("ub", "ub.bytes", "ub.alignment"),),
)

AIC = CoreKind(
    "aic", "aic.cores",
    pipes=(
        PipeKind("scalar", "issue", "scalar"),
        PipeKind("mte2", "transfer", "MTE2 (GM->L1)", {False: "aic.mte2_bytes_per_cycle"},
                 "aic.mte2_latency_ns"),
        PipeKind("mte1", "fixed", "MTE1 (L1->L0A/L0B)"),
        PipeKind("cube", "fixed", "cube (M)"),
        PipeKind("fixpipe", "transfer", "FixPipe (L0C->GM/UB)",
                 {False: "aic.fixpipe_gm_bytes_per_cycle"}, "aic.fixpipe_latency_ns"),
    ),
    buffers=(BufferKind("l1", "aic.l1_bytes", "aic.l1_alignment"),
             BufferKind("l0a", "aic.l0a_bytes", "aic.l0a_alignment"),
             BufferKind("l0b", "aic.l0b_bytes", "aic.l0b_alignment"),
             BufferKind("l0c", "aic.l0c_bytes", "aic.l0c_alignment")),
)


def mix(name: str, parts: tuple[tuple[CoreKind, int], ...]) -> CoreKind:
    """A MIX launch's kind: one block is `parts` (1 AIC and 2 AIV); its pipes are every
    part's (one lane per pipe name in the trace), it owns no buffers of its own."""
    pipes = {p.name: p for k, _ in parts for p in k.pipes}  # a later part's wins
    order = dict.fromkeys(p.name for k, _ in parts for p in k.pipes)
    return CoreKind(name, parts[0][0].count_key, tuple(pipes[n] for n in order), (), parts)


MIX_AIC_1_2 = mix("mix_aic_1_2", ((AIC, 1), (AIV, 2)))

# The die's system DMA engines (STARS SDMA; npusim.hw.sdma): no program runs on them, AIV
# cores post GM -> GM copies to their one in-order queue (aclshmemx_sdma_put_nbi)
SDMA = CoreKind(
    "sdma", "sdma.engines",
    pipes=(PipeKind("sdma", "transfer", "SDMA (GM->GM)",
                    {False: "sdma.bandwidth_gbps", True: "sdma.bandwidth_gbps"}),),
    buffers=(),
)

# The die's RoCE NIC (npusim.hw.rdma): its send queues, each in order; AIV cores post RDMA
# WRITE work requests to them (AIVRDMAPostSend) and ring the doorbell
RDMA = CoreKind(
    "rdma", "rdma.engines",
    pipes=(PipeKind("rdma", "transfer", "RDMA (NIC send queue)",
                    {False: "rdma.port_gbps", True: "rdma.port_gbps"}),),
    buffers=(),
)

# The die's AICPUs (the preset's `aicpu` section): scalar cores a runtime runs its own
# kernels on (pyPTO's task scheduling, HIXL's descriptor expansion into an RTSQ)
AICPU = CoreKind("aicpu", "aicpu.cores", pipes=(PipeKind("scalar", "issue", "scalar"),),
                 buffers=())

KINDS: dict[str, CoreKind] = {k.name: k for k in (AIV, AIC, MIX_AIC_1_2, SDMA, RDMA, AICPU)}


def register(kind: CoreKind) -> CoreKind:
    """Make a kind known by name (to the machine, launch, report and trace)."""
    KINDS[kind.name] = kind
    return kind


def kind(name: str) -> CoreKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown core kind {name!r}; kinds: {', '.join(KINDS)}") from None
