"""Family ``shmem_host``: hicann/shmem's sdma_d2h_demo (put / get / all) and rma_d2h_demo.

Tensor names are the examples' (main.cpp). HOST_SIDE buffers (host_dst, host_src, input)
live in each PE's host DRAM (npusim.hw.host); the driver reads them back after the run as
the examples' aclrtMemcpy does. The report's family_fields give the examples' check
(every PE's segment pe holds pe + 10; rma: the value read is the next PE) and each path's
latency and bandwidth, alone on the model's hardware and as the run moved it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from npusim.hw.host import capacity_problem, lone_path, path_problem
from npusim.kernels.family import Misfit, Option
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.shmem_host.programs import (
    AIVS_PER_BLOCK,
    SDMA_UB_OFFSET,
    SDMA_UB_SIZE,
    HostTiling,
    get_program,
    put_program,
    rma_program,
)
from npusim.kernels.vector_sample import Unwindowed

DATA_TYPES = {"int": "int32", "uint8": "uint8", "int64": "int64", "fp32": "float32"}
VALUE_OFFSET = 10  # every PE writes pe + 10
RMA_BYTES = 2 << 20  # aclshmemx_malloc(2 MiB, HOST_SIDE)
MIB = 1 << 20


def _dt(t: HostTiling) -> np.dtype:
    return np.dtype(t.dtype)


def _segment(t: HostTiling, r: int) -> tuple[int, ...]:
    return (t.elements,) if t.pe_of(r) is not None else (0,)


def _all_segments(t: HostTiling, r: int) -> tuple[int, ...]:
    return (t.pes * t.elements,) if t.pe_of(r) is not None else (0,)


def _paths(t: HostTiling, frames: Sequence[Sequence[Mapping[str, Any]]], write: bool,
           names: tuple[str, str]) -> dict[str, Any]:
    """Per PE: the transfer (first post to last quiet over its workers) and the bytes it
    moved; per path kind the bytes and the lone-path figures."""
    spans = []
    for r, row in enumerate(frames):
        if t.pe_of(r) is None:
            continue
        got = [f["transfer"] for f in row if "transfer" in f]
        if got:
            spans.append(max(b for _, b in got) - min(a for a, _ in got))
    moved = t.segment_bytes * len(t.peers(0))
    span = max(spans) if spans else 0.0
    out: dict[str, Any] = {"transfer_us": span / 1000.0, "bytes_per_pe": moved,
                           "gbps_per_pe": moved / span if span else 0.0}
    kinds: dict[str, Any] = {}
    for pe in t.peers(0):
        kind = names[0] if pe == 0 else names[1]
        latency, gbps = lone_path(t.hw, 0, t.rank_of(pe), write)
        entry = kinds.setdefault(kind, {"bytes_per_pe": 0, "cross_server": False})
        entry["bytes_per_pe"] += t.segment_bytes
        # PE 0 sits on server 0: a path of this kind crosses servers if any of its PEs does
        entry["cross_server"] = entry["cross_server"] or t.rank_of(pe) >= t.host_dies
        # the engine's own latency and cap come on top of the host path's
        entry["lone_latency_us"] = (latency + t.sdma_latency_ns) / 1000.0
        entry["lone_gbps"] = min(gbps, t.sdma_gbps)
    out["paths"] = kinds
    return out


def _check(arrays: Sequence[Arrays], t: HostTiling, name: str) -> dict[str, Any]:
    """validate_segments on every PE: segment pe of `name` holds pe + 10 for every pe the
    PE moved (the others stay 0, as the host initialised them)."""
    bad = []
    for r, outs in enumerate(arrays):
        me = t.pe_of(r)
        if me is None:
            continue
        got = outs[name].reshape(t.pes, t.elements)
        for pe in range(t.pes):
            want = pe + VALUE_OFFSET if pe in t.peers(me) else 0
            if not np.array_equal(got[pe], np.full(t.elements, want, _dt(t))):
                bad.append(f"PE {me} segment {pe}")
    return {"validated": not bad, "failed_segments": bad[:8]}


class _Sdma(Kernel):
    """sdma_d2h_demo's put and get: one SDMA transfer per target PE from sub-block 0 of
    each block; they differ in the direction, `write` (device to host) or not."""

    engines = ("sdma",)
    profiles = True  # fields reads Call.frames: the transfer frames
    write: ClassVar[bool]
    kinds: ClassVar[tuple[str, str]]  # the path to this PE's host, to another's

    def cores(self, tiling: HostTiling) -> int:
        return tiling.cores

    def program(self, tiling: HostTiling) -> Any:
        return (put_program if self.write else get_program)(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        t = call.tiling
        paths = _paths(t, call.frames, self.write, self.kinds) if call.frames else {}
        return {**_check(call.outputs, t, self.outputs[0].name), **paths}


def _phase(op: str, share: str) -> Phase:
    return Phase(op, "sub-block 0 of each of the blocks: for every target PE an "
                 f"aclshmemx_sdma_{op}_nbi of its share {share}, then aclshmemx_sdma_quiet "
                 "(frame transfer)")


class Put(_Sdma):
    name = "put"
    phases = (_phase("put", "into that PE's host_dst"),)
    inputs = (TensorSpec("device_src", _dt, _segment, "[elem_count] this PE's pe + 10"),)
    outputs = (TensorSpec("host_dst", _dt, _all_segments,
                          "[n_pes * elem_count] HOST_SIDE: segment i from PE i"),)
    write, kinds = True, ("D2H", "D2rH")


class Get(_Sdma):
    name = "get"
    phases = (_phase("get", "of that PE's host_src segment"),)
    inputs = (TensorSpec("host_src", _dt, _all_segments,
                         "[n_pes * elem_count] HOST_SIDE: segment my_pe holds my_pe + 10"),)
    outputs = (TensorSpec("device_dst", _dt, _all_segments,
                          "[n_pes * elem_count] segment i read from PE i's host"),)
    write, kinds = False, ("H2D", "rH2D")


class Rma(Kernel):
    name = "rma"
    profiles = True  # fields reads Call.frames: the transfer frames
    phases = (Phase("rma", "AIV 0: 10 x (aclshmem_int32_p to the next PE's HOST_SIDE input, "
                    "aclshmem_quiet, aclshmem_int32_g of it, aclshmem_quiet) (frame "
                    "transfer)"),)
    outputs = (TensorSpec("input", const(np.int32),
                          lambda t, r: (t.rma_bytes // 4,) if t.pe_of(r) is not None else (0,),
                          "[2 MiB / 4] HOST_SIDE: the previous PE writes this PE's number"),
               TensorSpec("output", const(np.int32),
                          lambda t, r: (1,) if t.pe_of(r) is not None else (0,),
                          "[1] the value read back from the next PE"))

    def cores(self, tiling: HostTiling) -> int:
        return 1

    def program(self, tiling: HostTiling) -> Any:
        return rma_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        tiling, bad = call.tiling, []
        for r, outs in enumerate(call.outputs):
            me = tiling.pe_of(r)
            if me is None:
                continue
            if int(outs["output"][0]) != (me + 1) % tiling.pes or int(outs["input"][0]) != me:
                bad.append(f"PE {me}")
        checked = {"validated": not bad, "failed_pes": bad}
        if not call.frames:
            return checked
        frames = call.frames
        loops = frames[0][0].get("transfer") if frames and frames[0] else None
        per = (loops[1] - loops[0]) / 10 if loops else 0.0
        kind = "D2H" if tiling.pes == 1 else "D2rH"
        latency, _ = lone_path(tiling.hw, 0, tiling.rank_of(1 % tiling.pes), True)
        return {**checked, "round_trip_us": per / 1000.0, "path": kind,
                "lone_latency_us": latency / 1000.0}


PUT, GET, RMA = Put(), Get(), Rma()


class ShmemHost(Unwindowed):
    name = "shmem_host"
    uses_moe_shape = False
    help = ("hicann/shmem's host-memory examples: sdma_d2h_demo (SDMA put / get between "
            "device GM and every PE's HOST_SIDE heap: D2H, D2rH, H2D, rH2D) and rma_d2h_demo "
            "(scalar put / get to host memory); Atlas A3")
    ops = (PUT, GET, RMA)
    references = True  # reference_outputs
    runs = {"put": ("put",), "get": ("get",), "all": ("put", "get"), "rma": ("rma",)}
    options = (
        Option("pes", "int", 2, "n_pes: PEs (the examples' default 2; rma_d2h_demo runs 8)",
               lo=1, hi=64),
        Option("elements", "int", 1 << 20, "elem_count: elements per PE segment (default "
               "1024 * 1024)", lo=1, hi=(1 << 31) - 1),
        Option("data_type", "choice", "int", "the example's type argument",
               choices=tuple(DATA_TYPES)),
        Option("blocks", "int", 20, "SDMA_BLOCK_NUM: blocks launched (two AIVs each, "
               "sub-block 0 submits)", lo=1, hi=128),
        Option("targets", "choice", "all", "the PEs each put / get reaches: all (the "
               "example), self (D2H / H2D only), peers (D2rH / rH2D only)",
               choices=("all", "self", "peers")),
        Option("placement", "choice", "server", "server: PE i on die i (the example's "
               "PE -> NPU map); across: each PE on a server of its own (remote hosts "
               "reached through the supernode)", choices=("server", "across")),
    )

    def tiling(self, shape: None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> HostTiling:
        host = hardware.host
        dies = host.dies if host is not None else 1
        stride = dies if options["placement"] == "across" else 1
        sdma = hardware.sdma
        return HostTiling(options["pes"], options["elements"], DATA_TYPES[options["data_type"]],
                          options["blocks"], options["targets"], stride, RMA_BYTES, hardware,
                          dies, sdma.latency_ns if sdma else 0.0,
                          sdma.bandwidth_gbps if sdma else 0.0, not timing_only)

    def misfit(self, shape: None, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if hardware.host is None:
            return Misfit("hardware", f"{hardware.name} has no host memory (no host section); "
                          "allowed: atlas_a3, ascend950 or a preset with host")
        if op != "rma" and hardware.sdma is None:
            return Misfit("hardware", f"{hardware.name} has no SDMA engine (no sdma section): "
                          "sdma_d2h_demo runs on the Atlas A3 only; allowed: atlas_a3 or a "
                          "preset with sdma")
        return None

    def tiling_misfit(self, tiling: HostTiling, shape: None, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        if options["placement"] == "server" and t.pes > t.host_dies:
            return Misfit("workload.pes", f"{t.pes} PEs on one server (placement: server, PE i "
                          f"on die i) need {t.pes} dies; {hardware.name} has {t.host_dies} "
                          f"per server (host.dies); allowed: at most {t.host_dies}, or "
                          "placement: across")
        if op != "rma" and options["targets"] == "peers" and t.pes < 2:
            return Misfit("workload.pes", f"{t.pes}: with targets: peers a PE moves data to "
                          "or from the other PEs only, and there is none (its "
                          "aclshmemx_sdma_quiet would wait for nothing); allowed: at least 2, "
                          "or targets: all or self")
        if options["placement"] == "across" and t.world > _outer_dies(hardware):
            return Misfit("workload.pes", f"{t.pes} PEs one per server need "
                          f"{t.world} dies; {hardware.name} has {_outer_dies(hardware)}")
        problem = path_problem(hardware, t.world)
        if problem:
            key = "workload.placement" if options["placement"] == "across" else "workload.pes"
            return Misfit(key, problem)
        heap = RMA_BYTES if op == "rma" else t.pes * t.segment_bytes
        problem = capacity_problem(hardware, t.world if t.stride == 1 else 1, heap)
        if problem:
            return Misfit("workload.elements", f"{t.elements}: the HOST_SIDE heap of "
                          f"n_pes * elem_count elements: {problem}")
        aiv = hardware.chip.aiv_cores
        if op != "rma" and t.cores > aiv:
            if aiv < AIVS_PER_BLOCK:  # not even one block fits: no blocks value helps
                return Misfit("hardware.chip.aiv_cores", f"{aiv}: {t.blocks} blocks of two "
                              f"AIVs need {t.cores} AIV cores; allowed: at least {t.cores}")
            return Misfit("workload.blocks", f"{t.blocks} blocks of two AIVs need {t.cores} "
                          f"AIV cores; {hardware.name} has {aiv}; allowed: at most "
                          f"{aiv // AIVS_PER_BLOCK}")
        if SDMA_UB_OFFSET + SDMA_UB_SIZE > hardware.ub.bytes:
            return Misfit("hardware.ub.bytes", f"{hardware.ub.bytes} B: the SDMA scratch sits "
                          f"at UB offset {SDMA_UB_OFFSET}")
        return None

    def make_inputs(self, shape: None, options: Mapping[str, Any], op: str,
                    routing: Any, payload: bool) -> list[Arrays]:
        return []  # the inputs depend on the placement: op_inputs builds them

    def op_inputs(self, kernel: str, tiling: HostTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        """Per rank the inputs `kernel` reads (put: device_src, get: host_src), each PE's
        segment pe + 10; left zero in a timing-only run, where zeros never written take no
        memory (a payload of 1e8 elements would)."""
        t = tiling
        dt = _dt(t)
        specs = self.kernel(kernel).inputs
        out: list[Arrays] = []
        for r in range(t.world):
            me = t.pe_of(r)
            arrays = {s.name: np.zeros(s.shape(t, r), dt) for s in specs}
            if me is not None and t.payload:
                for a in arrays.values():  # host_src: segment me of pes; device_src: one
                    at = me * t.elements if a.size > t.elements else 0
                    a[at:at + t.elements] = me + VALUE_OFFSET
            out.append(arrays)
        return out

    def reference_outputs(self, kernel: str, tiling: HostTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        from npusim.kernels.shmem_host.reference import expected

        return expected(kernel, tiling)


def _outer_dies(hardware: Any) -> int:
    levels = hardware.fabric.levels
    return levels[-1].dies if levels else 1 << 20


FAMILY = ShmemHost()
