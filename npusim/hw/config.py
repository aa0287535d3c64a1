"""Hardware presets: YAML in configs/ -> a validated, frozen HardwareConfig.

A preset is data (design principle 4): every value lives in configs/*.yaml as
``{value: V, sourced|calibrated|assumed: {...}}`` (its provenance, npusim.hw.provenance;
docs/presets.md), or as a plain number in a user's file. Scenarios override single
values by dotted key (``fabric.egress_gbps: 500``, which replaces the entry by the plain
value); unknown keys and wrong types are input errors that name the file and the key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npusim.errors import InputError, excerpt
from npusim.hw.provenance import (
    Provenance,
    assumed_problem,
    calibrated_problem,
    is_entry,
    sourced_problem,
    split_entry,
)
from npusim.paths import LOOP, is_loop
from npusim.shipped import configs_dir
from npusim.suggest import did_you_mean
from npusim.useryaml import load_text
from npusim.values import as_number, is_number

CONFIG_DIR = configs_dir()  # package data (npusim._data.configs), whatever the install


# The chip architectures, by the CANN SoC names the kernels are built for (build.sh
# --soc / SOC_VERSION_LIST): the A2 (Atlas 800T A2, 910B), the A3 (Atlas A3, 910C) and
# the 950. Families choose their code paths from `chip.arch`, never from a preset's name.
ARCHS = ("ascend910b", "ascend910_93", "ascend950")


@dataclass(frozen=True)
class ChipConfig:
    # a name with its source (an entry with `sourced`, like a number's)
    arch: str = field(metadata={"choices": ARCHS, "unit": "SoC"})
    clock_ghz: float = field(metadata={"unit": "GHz", "min": 0.1, "max": 10.0})
    aiv_cores: int = field(metadata={"unit": "cores", "min": 1, "max": 256})
    # GetSystemCycle()'s counter, which kernels' profiling frames read (ticks per us)
    system_counter_mhz: float = field(metadata={"unit": "MHz", "min": 1.0, "max": 1e4})


@dataclass(frozen=True)
class UBConfig:
    bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 16 << 20})
    alignment: int = field(metadata={"unit": "B", "min": 1, "max": 4096})


@dataclass(frozen=True)
class ScalarConfig:
    cycles_per_op: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e4})
    loop_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e4})


@dataclass(frozen=True)
class DCacheConfig:
    """The scalar unit's data cache in front of GM (scalar loads and stores, dcci)."""

    line_bytes: int = field(metadata={"unit": "B", "min": 4, "max": 4096})
    miss_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e6})  # line fill
    dcci_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e6})  # one line
    dcci_entire_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})


@dataclass(frozen=True)
class VectorConfig:
    bytes_per_cycle: int = field(metadata={"unit": "B/repeat", "min": 1, "max": 1 << 16})
    issue_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e5})
    cycles_per_repeat: float = field(metadata={"unit": "cycles", "min": 0.1, "max": 100.0})
    vf_cycles_per_instr: float = field(metadata={"unit": "cycles", "min": 0.1, "max": 100.0})
    # how vector work written as MemBase calls or VF programs is timed (npusim/hw/vf.py):
    # regbase = the 950's VF unit; membase = one instruction per call (A2/A3)
    model: str = field(metadata={"choices": ("regbase", "membase")})
    vf_call_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e5})
    vf_latency_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e3})
    vf_pair_issue: int = field(metadata={"unit": "instructions", "min": 1, "max": 8})
    vf_loads_per_cycle: float = field(metadata={"unit": "instructions", "min": 0.1,
                                                "max": 16.0})
    vf_stores_per_cycle: float = field(metadata={"unit": "instructions", "min": 0.1,
                                                 "max": 16.0})


@dataclass(frozen=True)
class MTEConfig:
    gm_to_ub_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    ub_to_gm_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    put_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    gm_to_ub_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    ub_to_gm_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    put_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    # when a put to another die completes (what SyncFunc<MTE3_S>, PipeBarrier<PIPE_MTE3>
    # and a queue's FreeTensor wait for): "landed" when its bytes land, "acked" when the
    # remote die's write response is back, one link latency later (npusim.runtime.transfer)
    put_completion: str = field(default="landed", metadata={"choices": ("landed", "acked")})


@dataclass(frozen=True)
class HBMConfig:
    bandwidth_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e7})


@dataclass(frozen=True)
class L2Config:
    """The die's write-back L2 in front of the HBM (npusim.hw.l2): writes that fit in it
    cross no HBM during the kernel. Optional: without it every write crosses the HBM."""

    bytes: int = field(metadata={"unit": "B", "min": 0, "max": 1 << 40})


SHARINGS = ("pair", "die")  # or the name of an inner level whose die ports a level uses


@dataclass(frozen=True)
class LevelConfig:
    """One level of the topology: groups of `dies` dies (package, server, supernode) and
    the links a put between two of its groups' dies crosses (npusim.hw.fabric)."""

    name: str
    dies: int = field(metadata={"unit": "dies", "min": 1, "max": 1 << 20})
    sharing: str = field(metadata={"choices": SHARINGS})
    latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    link_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 1e-3, "max": 1e7, "sharing": "pair"})
    egress_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 1e-3, "max": 1e7, "sharing": "die"})
    ingress_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 1e-3, "max": 1e7, "sharing": "die"})
    uplink_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 1e-3, "max": 1e7, "optional": True})


@dataclass(frozen=True)
class FabricConfig:
    """Either `levels` (a topology, inner to outer) or the flat single level: every die
    reaches every other through one switch (egress, ingress), with an optional die-to-die
    link inside a package. The flat form's fields are None when levels are given."""

    dies_per_package: int | None = field(default=None, metadata={
        "unit": "dies", "min": 1, "max": 2})
    egress_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 1e-3, "max": 1e7})
    ingress_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 1e-3, "max": 1e7})
    link_latency_ns: float | None = field(default=None, metadata={
        "unit": "ns", "min": 0.0, "max": 1e7})
    d2d_gbps: float | None = field(default=None, metadata={
        "unit": "GB/s", "min": 0.0, "max": 1e7})
    d2d_latency_ns: float | None = field(default=None, metadata={
        "unit": "ns", "min": 0.0, "max": 1e7})
    levels: tuple[LevelConfig, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if not self.levels:
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name != "levels"}
        return {"levels": {lv.name: {k: v for k, v in dataclasses.asdict(lv).items()
                                     if k != "name" and v is not None}
                           for lv in self.levels}}


@dataclass(frozen=True)
class SyncConfig:
    syncall_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    poll_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e7})


@dataclass(frozen=True)
class KernelConfig:
    launch_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e8})
    # a plain task's launch (no SHMEM set-up), for kernels that are not SHMEM kernels
    task_launch_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e8})
    # block b of a launch starts block_stagger_ns * b after block 0: the block scheduler
    # hands the blocks out in order, so identical cores do not start (and stay) in lockstep
    block_stagger_ns: float = field(default=0.0,
                                    metadata={"unit": "ns", "min": 0.0, "max": 1000.0})


@dataclass(frozen=True)
class SDMAConfig:
    """The die's system DMA engines (STARS SDMA, npusim.hw.sdma): GM -> GM copies that
    AIV cores post as SQEs. Optional: the ascend950 preset has none (SHMEM's SDMA put/get
    is not supported there)."""

    engines: int = field(metadata={"unit": "engines", "min": 1, "max": 64})
    bandwidth_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    # how long a read of another die's memory holds the engine for its first bytes,
    # beyond the round trip's flight (npusim.hw.copy_path)
    read_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})


@dataclass(frozen=True)
class RDMAConfig:
    """The die's RoCE NIC as RDMA WRITEs see it (npusim.hw.rdma): in-order send queues
    that AIV cores post work requests to (AIVRDMAPostSend), each packet of at most
    `mtu_bytes` of payload carrying `header_bytes` of framing on the wire. Optional: a
    preset without it has no RDMA path."""

    engines: int = field(metadata={"unit": "engines", "min": 1, "max": 1024})
    port_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    mtu_bytes: int = field(metadata={"unit": "B", "min": 256, "max": 1 << 16})
    header_bytes: int = field(metadata={"unit": "B", "min": 0, "max": 4096})
    wqe_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    # one way, from the NIC's last byte out to its landing in the far memory (a NIC
    # port's route, npusim.hw.rdma.memory_path; an RDMA READ pays it twice)
    latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e8})


@dataclass(frozen=True)
class AICPUConfig:
    """The die's scheduling AICPUs as a task runtime uses them (pyPTO's machine: they
    place ready tile tasks on idle AIC/AIV cores and poll WaitUntil signals). Optional: a
    preset without it has none, and a family that needs them is refused."""

    cores: int = field(metadata={"unit": "cores", "min": 1, "max": 64})
    task_dispatch_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    # a completed task: reading its core's completion, then releasing each successor
    completion_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    resolve_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    # one stitched device task's end (every core and AICPU done) to the next one's start
    submit_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e8})
    poll_ns: float = field(metadata={"unit": "ns", "min": 1.0, "max": 1e7})
    # an AICPU kernel that writes SQEs into an RTSQ (HIXL's descriptor expansion): its
    # fixed cost on its stream, and the cost of building and copying in one SQE
    kernel_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e8})
    sqe_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})


@dataclass(frozen=True)
class HostConfig:
    """Each server's host memory (npusim.hw.host): CPU sockets with their DRAM, the path
    of each NPU die to them and, through the supernode fabric, to another server's host.
    Optional: a preset without it has no host memory (HOST_SIDE heaps are refused)."""

    dies: int = field(metadata={"unit": "dies", "min": 1, "max": 1 << 20})  # per server
    sockets: int = field(metadata={"unit": "sockets", "min": 1, "max": 64})  # per server
    socket_bytes: int = field(metadata={"unit": "B", "min": 1 << 20, "max": 1 << 50})
    dram_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})  # per socket
    # what a socket takes in from the NPUs' interconnect (writes into its memory) and
    # serves out (reads of it): not the same rate
    write_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    read_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    # a die's path to the host, each direction
    npu_link_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e6})
    latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})  # one way
    # the host thread's cost of one aclrtMemcpyAsync (a task submitted to a stream)
    memcpy_async_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e8})
    # the pages of host memory as the die's SMMU translates them (npusim.hw.host, Tlb):
    # the OS's base page (pinned memory: torch_npu's swapped memory), the huge page of
    # SHMEM's HOST_SIDE heap, the translations a die caches, what a miss costs, and how
    # many misses its walkers resolve at once
    page_bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 1 << 30})
    huge_page_bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 1 << 40})
    tlb_entries: int = field(metadata={"unit": "pages", "min": 1, "max": 1 << 24})
    page_walk_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e6})
    walkers: int = field(metadata={"unit": "walks", "min": 1, "max": 1024})


@dataclass(frozen=True)
class WindowConfig:
    bytes: int = field(metadata={"unit": "B", "min": 1 << 20, "max": 1 << 40})


@dataclass(frozen=True)
class AICConfig:
    """The AIC (cube) cores of a die: count, L1/L0 buffers, pipe rates and the cube's
    throughput (npusim.hw.cores.AIC; docs/model.md, "AIC cube cores"). Optional: a preset
    without it has no AIC cores, and a kernel that needs them is refused."""

    cores: int = field(metadata={"unit": "cores", "min": 1, "max": 256})
    l1_bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 64 << 20})
    l1_alignment: int = field(metadata={"unit": "B", "min": 1, "max": 4096})
    l0a_bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 16 << 20})
    l0a_alignment: int = field(metadata={"unit": "B", "min": 1, "max": 4096})
    l0b_bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 16 << 20})
    l0b_alignment: int = field(metadata={"unit": "B", "min": 1, "max": 4096})
    l0c_bytes: int = field(metadata={"unit": "B", "min": 1024, "max": 16 << 20})
    l0c_alignment: int = field(metadata={"unit": "B", "min": 1, "max": 4096})
    mte2_bytes_per_cycle: float = field(metadata={"unit": "B/cycle", "min": 1e-3, "max": 1e5})
    mte2_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    mte1_l0a_bytes_per_cycle: float = field(metadata={"unit": "B/cycle", "min": 1e-3,
                                                      "max": 1e5})
    mte1_l0b_bytes_per_cycle: float = field(metadata={"unit": "B/cycle", "min": 1e-3,
                                                      "max": 1e5})
    mte1_issue_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e5})
    # MACs per cycle of one mmad by input dtype (0: the cube does not take the dtype)
    cube_fp16_macs_per_cycle: float = field(metadata={"unit": "MACs/cycle", "min": 0.0,
                                                      "max": 1e7})
    cube_int8_macs_per_cycle: float = field(metadata={"unit": "MACs/cycle", "min": 0.0,
                                                      "max": 1e7})
    cube_fp8_macs_per_cycle: float = field(metadata={"unit": "MACs/cycle", "min": 0.0,
                                                     "max": 1e7})
    cube_issue_cycles: float = field(metadata={"unit": "cycles", "min": 0.0, "max": 1e5})
    fixpipe_ub_bytes_per_cycle: float = field(metadata={"unit": "B/cycle", "min": 0.0,
                                                        "max": 1e5})
    fixpipe_gm_bytes_per_cycle: float = field(metadata={"unit": "B/cycle", "min": 1e-3,
                                                        "max": 1e5})
    fixpipe_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    flag_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    # the CrossCoreSetFlag modes the chip has: "0,1,2" (A2/A3), "0,1,2,4" (the 950's mode 4)
    flag_modes: str = field(metadata={"choices": ("0,1,2", "0,1,2,4")})


@dataclass(frozen=True)
class HardwareConfig:
    """One chip's figures; the machine builds W identical ranks from it."""

    name: str
    chip: ChipConfig
    ub: UBConfig
    scalar: ScalarConfig
    dcache: DCacheConfig
    vector: VectorConfig
    mte: MTEConfig
    hbm: HBMConfig
    fabric: FabricConfig
    sync: SyncConfig
    kernel: KernelConfig
    window: WindowConfig
    aic: AICConfig | None = None  # no AIC cores when absent
    sdma: SDMAConfig | None = None  # no SDMA engines when absent
    l2: L2Config | None = None  # no L2 modelled when absent
    aicpu: AICPUConfig | None = None  # no scheduling AICPUs when absent
    host: HostConfig | None = None  # no host memory when absent (npusim.hw.host)
    rdma: RDMAConfig | None = None  # no RDMA path when absent (npusim.hw.rdma)

    @property
    def cycle_ns(self) -> float:
        return 1.0 / self.chip.clock_ghz

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["fabric"] = self.fabric.to_dict()
        if self.aic is None:
            del out["aic"]
        # a section left out is not reported
        for optional in ("sdma", "l2", "aicpu", "host", "rdma"):
            if getattr(self, optional) is None:
                del out[optional]
        return out


def preset_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def resolve_preset(name_or_path: str) -> Path:
    """A preset name ('ascend950') or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise InputError(str(p), None, LOOP if is_loop(p) else "hardware file not found")
        return p
    candidate = CONFIG_DIR / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    names = preset_names()
    raise InputError(
        "hardware",
        None,
        f"unknown preset {excerpt(name_or_path)}{did_you_mean(name_or_path, names)}; "
        f"allowed: {', '.join(names)} or a path to a YAML file",
    )


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A preset (or sweep) file's mapping; a key given twice is refused, as in scenarios."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), None, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    doc = load_text(text, str(path))
    if not isinstance(doc, dict):
        raise InputError(str(path), None, "must be a YAML mapping of keys to values")
    return doc


def apply_overrides(
    doc: dict[str, Any], overrides: dict[str, Any], source: str, prefix: str = ""
) -> dict[str, Any]:
    """Return a copy of doc with dotted-key overrides applied; keys must already exist."""
    out = copy.deepcopy(doc)
    for dotted, value in overrides.items():
        if not isinstance(dotted, str):
            raise InputError(source, f"{prefix}{dotted}", "override keys must be dotted strings")
        node = out
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if is_entry(node):
                here = ".".join(parts[:i])
                raise InputError(source, f"{prefix}{dotted}", f"unknown hardware key: {here} "
                                 f"is a single value; override it as {here}")
            if not isinstance(node, dict) or part not in node:
                here = ".".join(parts[:i])
                choices = list(node) if isinstance(node, dict) else []
                full = [f"{here}.{c}" if here else c for c in choices]
                raise InputError(
                    source,
                    f"{prefix}{dotted}",
                    f"unknown hardware key{did_you_mean(dotted, full)}; "
                    f"allowed here: {', '.join(full)}",
                )
            if i == len(parts) - 1:
                if isinstance(node[part], dict) and not is_entry(node[part]):
                    raise InputError(
                        source, f"{prefix}{dotted}", "names a section; override a single value"
                    )
                node[part] = value  # a plain value: an override has no provenance
            else:
                node = node[part]
    return out


def _build(cls: type, doc: Any, source: str, key: str,
           prov: dict[str, tuple[Any, str, Provenance | None]] | None = None) -> Any:
    if not isinstance(doc, dict):
        raise InputError(source, key or None, f"must be a mapping with keys {_names(cls)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in doc:
        if k not in fields:
            full = f"{key}.{k}" if key else str(k)
            raise InputError(
                source, full, f"unknown key{did_you_mean(str(k), fields)}; allowed: {_names(cls)}"
            )
    values = {}
    for name, f in fields.items():
        full = f"{key}.{name}" if key else name
        if name not in doc:
            if f.default is not dataclasses.MISSING:  # an optional section
                continue
            choices = f.metadata.get("choices")
            raise InputError(source, full, "missing" + (f"; allowed: {', '.join(choices)}"
                                                        if choices else ""))
        values[name] = _value(f, doc[name], source, full, prov)
    return cls(**values)


def _names(cls: type) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls))


def _value(f: dataclasses.Field, raw: Any, source: str, key: str,
           prov: dict[str, tuple[Any, str, Provenance | None]] | None = None) -> Any:
    ftype = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    ftype = ftype.removesuffix(" | None")
    if ftype == "FabricConfig":
        return _build_fabric(raw, source, key, prov)
    if ftype in ("int", "float"):
        raw, origin = split_entry(raw, source, key)
        if prov is not None:
            prov[key] = (raw, f.metadata["unit"], origin)
    if ftype == "str" and "unit" in f.metadata:  # a name with provenance
        raw, origin = split_entry(raw, source, key, text=True)
        if prov is not None:
            prov[key] = (raw, f.metadata["unit"], origin)
    if ftype == "str":
        choices = f.metadata.get("choices")
        if not isinstance(raw, str) or not raw:
            raise InputError(source, key, f"must be one of: {', '.join(choices)}" if choices
                             else "must be a non-empty string")
        if choices and raw not in choices:
            raise InputError(source, key, f"{excerpt(raw)}{did_you_mean(raw, choices)}; "
                             f"allowed: {', '.join(choices)}")
        return raw
    if ftype in ("int", "float"):
        return _number(f, ftype, raw, source, key)
    # nested section
    section_cls = globals()[ftype]
    return _build(section_cls, raw, source, key, prov)


def _number(f: dataclasses.Field, ftype: str, raw: Any, source: str, key: str) -> int | float:
    """An int or float field's value: a finite number (NaN fails every comparison, so it
    is refused by name, not by the range check), whole for an int, within [min, max]."""
    kind = "an integer" if ftype == "int" else "a number"
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if not is_number(raw):
        raise InputError(source, key, f"must be {kind} in [{lo}, {hi}], got {excerpt(raw)}")
    raw = as_number(raw)
    if isinstance(raw, float) and not math.isfinite(raw):
        raise InputError(source, key, f"{excerpt(raw)} is out of range [{lo}, {hi}], not a "
                         "finite number")
    if (lo is not None and raw < lo) or (hi is not None and raw > hi):  # exact for any int
        raise InputError(source, key, f"{excerpt(raw)} is out of range [{lo}, {hi}]")
    if ftype == "int" and raw != int(raw):
        raise InputError(source, key, f"must be {kind} in [{lo}, {hi}], got {excerpt(raw)}")
    return int(raw) if ftype == "int" else float(raw)


_FLAT = ("dies_per_package", "egress_gbps", "ingress_gbps", "link_latency_ns", "d2d_gbps",
         "d2d_latency_ns")


def _build_fabric(doc: Any, source: str, key: str,
                  prov: dict[str, tuple[Any, str, Provenance | None]] | None) -> FabricConfig:
    """The flat single level (the six _FLAT keys) or `levels`, never both."""
    if not isinstance(doc, dict):
        raise InputError(source, key, f"must be a mapping with keys {', '.join(_FLAT)}, "
                         "or with levels")
    if "levels" not in doc:
        return _build(_FlatFabric, doc, source, key, prov).fabric()
    for k in doc:
        if k != "levels":
            raise InputError(source, f"{key}.{k}", "not with fabric.levels (a topology gives "
                             "its bandwidths and latencies per level); allowed here: levels")
    raw = doc["levels"]
    where = f"{key}.levels"
    if not isinstance(raw, dict) or not raw:
        raise InputError(source, where, "must be a mapping of level names (inner to outer, "
                         "e.g. package, server, supernode) to their links")
    fields = {f.name: f for f in dataclasses.fields(LevelConfig) if f.name != "name"}
    levels: list[LevelConfig] = []
    for name, body in raw.items():
        here = f"{where}.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise InputError(source, here, "a level name must be a word (letters, digits, _)")
        if not isinstance(body, dict):
            raise InputError(source, here, f"must be a mapping with keys {', '.join(fields)}")
        levels.append(_level(name, body, fields, levels, source, here, prov))
    return FabricConfig(levels=tuple(levels))


def _level(name: str, body: dict[str, Any], fields: dict[str, dataclasses.Field],
           inner: list[LevelConfig], source: str, here: str,
           prov: dict[str, tuple[Any, str, Provenance | None]] | None) -> LevelConfig:
    for k in body:
        if k not in fields:
            raise InputError(source, f"{here}.{k}", f"unknown key{did_you_mean(str(k), fields)}; "
                             f"allowed: {', '.join(fields)}")
    for k in ("dies", "sharing", "latency_ns"):
        if k not in body:
            raise InputError(source, f"{here}.{k}", "missing")
    sharing = body["sharing"]
    ports = {lv.name for lv in inner if lv.sharing == "die"}
    if not isinstance(sharing, str) or (sharing not in SHARINGS and sharing not in ports):
        raise InputError(source, f"{here}.sharing", f"{excerpt(sharing)}; allowed: pair (a "
                         "link per pair of dies), die (each die's egress and ingress ports)"
                         + "".join(f", {p} (the die ports of level {p})" for p in sorted(ports)))
    need = {k for k, f in fields.items() if f.metadata.get("sharing") == sharing}
    for k, f in fields.items():
        if "sharing" in f.metadata and (k in need) != (k in body):
            what = "missing" if k in need else "not with sharing: " + str(sharing)
            raise InputError(source, f"{here}.{k}", f"{what} (pair levels give link_gbps, die "
                             "levels egress_gbps and ingress_gbps, a level using another's "
                             "ports neither)")
    if "uplink_gbps" in body and not inner:
        raise InputError(source, f"{here}.uplink_gbps", "the innermost level has no inner "
                         "groups to join; allowed on an outer level only")
    values: dict[str, Any] = {"name": name, "sharing": sharing}
    for k, f in fields.items():
        if k != "sharing" and k in body:
            values[k] = _value(f, body[k], source, f"{here}.{k}", prov)
    lv = LevelConfig(**values)
    if inner:
        prev = inner[-1]
        if lv.dies <= prev.dies or lv.dies % prev.dies:
            raise InputError(source, f"{here}.dies", f"{lv.dies}: a level holds whole groups "
                             f"of the level inside it ({prev.name}: {prev.dies} dies); allowed: "
                             f"a multiple of {prev.dies} above it")
    elif lv.dies < 2:
        raise InputError(source, f"{here}.dies", f"{lv.dies}: a level joins at least 2 dies")
    return lv


@dataclass(frozen=True)
class _FlatFabric:
    """The flat form's keys, all required (loaded like any other section)."""

    dies_per_package: int = field(metadata={"unit": "dies", "min": 1, "max": 2})
    egress_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e7})
    ingress_gbps: float = field(metadata={"unit": "GB/s", "min": 1e-3, "max": 1e7})
    link_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})
    d2d_gbps: float = field(metadata={"unit": "GB/s", "min": 0.0, "max": 1e7})
    d2d_latency_ns: float = field(metadata={"unit": "ns", "min": 0.0, "max": 1e7})

    def fabric(self) -> FabricConfig:
        return FabricConfig(**dataclasses.asdict(self))


def load_hardware(name_or_path: str, overrides: dict[str, Any] | None = None,
                  override_source: str = "scenario") -> HardwareConfig:
    """Load a preset and apply dotted overrides; every error names file and key."""
    path = resolve_preset(name_or_path)
    doc = read_yaml_mapping(path)
    if overrides:
        doc = apply_overrides(doc, overrides, override_source, prefix="hardware_overrides.")
        source = f"{path} (with overrides from {override_source})"
    else:
        source = str(path)
    cfg: HardwareConfig = _build(HardwareConfig, doc, source, "")
    if not cfg.fabric.levels and cfg.fabric.dies_per_package > 1 and cfg.fabric.d2d_gbps <= 0:
        raise InputError(source, "fabric.d2d_gbps", "must be > 0 when dies_per_package > 1")
    return cfg


def load_provenance(name_or_path: str) -> dict[str, tuple[Any, str, Provenance | None]]:
    """Every value of a preset by dotted key: (value, unit, provenance or None)."""
    path = resolve_preset(name_or_path)
    prov: dict[str, tuple[Any, str, Provenance | None]] = {}
    _build(HardwareConfig, read_yaml_mapping(path), str(path), "", prov)
    return prov


def preset_problems(name_or_path: str, root: Path) -> list[str]:
    """Every value of a preset whose provenance is missing or does not hold ('key: why').
    `root` is the folder fit report paths are relative to (the repository)."""
    entries = load_provenance(name_or_path)
    copies: dict[str, dict[str, tuple[Any, str, Provenance | None]]] = {}
    out = []
    for key, (value, unit, prov) in entries.items():
        if prov is None:
            out.append(f"{key}: no provenance")
            continue
        if prov.kind == "sourced":
            why = sourced_problem(value if isinstance(value, str) else float(value), unit, prov)
        elif prov.kind == "calibrated":
            why = calibrated_problem(key, float(value), prov, root)
        else:
            same = None
            if "same_as" in prov.fields:
                other = prov.fields["same_as"]
                try:
                    if other not in copies:
                        copies[other] = load_provenance(other)
                    same = float(copies[other][key][0])
                except InputError as exc:
                    out.append(f"{key}: same_as {other}: {exc}")
                    continue
            why = assumed_problem(float(value), prov, same)
        if why:
            out.append(f"{key}: {why}")
    return out
