"""One run: scenario -> machine + inputs -> kernels on every core -> RunResult.

This is the only place that knows both the scenario (YAML world) and the kernels; the
kernels get a MoeTiling and named GM tensors, the report gets plain data.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from npusim.engine.trace import Sample, Trace
from npusim.fork import Forked
from npusim.hw.machine import Machine
from npusim.hw.memory import RowTable
from npusim.kernels.combine import combine_program
from npusim.kernels.dispatch import dispatch_program
from npusim.kernels.quant import int8_token_dequantize, mxfp8_dequantize, token_dtype
from npusim.kernels.tiling import MoeTiling
from npusim.result import LinkStats, OpRun, RunResult, TransferStat
from npusim.runtime.launch import LaunchResult, launch
from npusim.scenario import Routing, Scenario
from npusim.workload import casedir
from npusim.workload.inputs import generate_inputs

DISPATCH_OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine",
                    "expert_token_nums", "ep_recv_count")


def tiling_of(scenario: Scenario) -> MoeTiling:
    w = scenario.workload
    return MoeTiling(
        world=w.ep_world_size, bs=w.bs, h=w.h, k=w.k, experts_per_rank=w.experts_per_rank,
        cores=scenario.hardware.chip.aiv_cores, dtype=w.dtype,
        dispatch_quant=w.dispatch_quant, combine_quant=w.combine_quant,
        expert_token_nums_type=w.expert_token_nums_type, mxfp8_saturate=w.mxfp8_saturate,
        combine_recip=w.combine_recip, shared_experts=w.shared_experts,
        timing_only=w.timing_only, shared_expert_ranks=w.shared_expert_ranks,
    )


def load_inputs(scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Per-rank inputs: read from the case directory, or generated from the seed."""
    w = scenario.workload
    if scenario.data.case_dir is not None:
        return casedir.read_case_inputs(scenario.data.case_dir, w.ep_world_size, w.bs, w.h, w.k,
                                        w.experts_per_rank, w.dtype, w.op)
    inp = generate_inputs(w.ep_world_size, w.bs, w.h, w.k, w.experts_per_rank, w.dtype,
                          routing=w.routing.kind, seed=w.routing.seed,
                          zipf_s=w.routing.s if w.routing.s is not None else 1.2,
                          with_combine=w.op == "combine", payload=not w.timing_only,
                          shared_experts=w.shared_experts,
                          shared_expert_ranks=w.shared_expert_ranks,
                          **routing_args(w.routing))
    return inp.per_rank()


def routing_args(r: Routing) -> dict[str, Any]:
    """generate_inputs' keywords for the routing kinds past zipf: sigma, or the file's ids."""
    if r.kind == "lognormal":
        return {"sigma": r.sigma}
    return {"expert_ids": r.file_ids()} if r.kind == "file" else {}


def default_workers() -> int:
    """Processes a single run may use: 2 (dispatch and combine) where 2 CPUs are free to it."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(2, cpus)


def simulate(scenario: Scenario, detailed_trace: bool = False,
             progress: Callable[[str], None] | None = None, workers: int = 1) -> RunResult:
    """Run the scenario's ops, one after the other.

    Each op runs on an idle machine of its own from t = 0 and is then placed where the
    previous op's machine stopped: between dispatch and combine the hardware runs the
    experts, and combine reads nothing of dispatch but its output tensors.

    workers >= 2 (dispatch_combine, where os.fork exists): combine is simulated in a forked
    process while dispatch runs, on the reference dispatch outputs. It is kept only if the
    simulated dispatch wrote exactly those (otherwise combine is simulated again on what
    dispatch wrote), so the result is the same as with workers = 1, byte for byte.
    """
    wall0 = time.perf_counter()
    t = tiling_of(scenario)
    inputs = load_inputs(scenario)
    limit_ns = scenario.run.sim_time_limit_us * 1000.0
    ops = scenario.workload.ops
    standalone = scenario.data.case_dir is not None  # combine reads the case's expand_x

    def machine() -> Machine:
        return Machine(scenario.hardware, t.world, Trace(detailed=detailed_trace))

    def combine_leg(dispatch_out: list[dict[str, np.ndarray]] | None) -> Leg:
        m = machine()
        expand, meta = combine_inputs(t, inputs, None if standalone else dispatch_out)
        return Leg.of(m, run_combine(m, t, inputs, expand, meta, limit_ns))

    ahead: Forked | None = None
    how_ahead = ""
    if workers >= 2 and ops == ("dispatch", "combine") and Forked.available():
        def speculate() -> tuple[bytes, Leg]:
            assumed = None if standalone else reference_dispatch_outputs(t, inputs)
            return dispatch_digest(assumed, t), combine_leg(assumed)

        try:
            ahead = Forked(speculate)
        except OSError as exc:  # one process it is
            how_ahead = f"redone: no second process ({exc.strerror or exc})"
    legs: list[Leg] = []
    dispatch_out: list[dict[str, np.ndarray]] | None = None
    try:
        for op in ops:
            if progress:
                progress(op)
            if op == "dispatch":
                m = machine()
                run, dispatch_out = run_dispatch(m, t, inputs, limit_ns)
                legs.append(Leg.of(m, run))
                del m  # its window and tensors go; dispatch_out keeps the outputs
                gc.collect()  # the machine is a reference cycle: free its UBs before combine's
                continue
            leg = None
            if ahead is not None:
                found, ahead = ahead.result(), None
                if found is None:
                    how_ahead = "redone: the forked combine did not finish"
                elif found[0] != dispatch_digest(None if standalone else dispatch_out, t):
                    how_ahead = ("redone: the simulated dispatch wrote other outputs than "
                                 "npusim's numpy reference dispatch")
                else:
                    leg, how_ahead = found[1], "kept"
            legs.append(leg if leg is not None else combine_leg(dispatch_out))
    finally:
        if ahead is not None:
            ahead.cancel()
    runs, samples, clock = [], [], 0.0
    for leg in legs:
        runs.append(shifted(leg.run, clock))
        samples += [replace(s, t_ns=s.t_ns + clock) for s in leg.samples] if clock else leg.samples
        clock += leg.clock_ns
    if standalone:
        for run in runs:
            for r, outs in enumerate(run.outputs):
                casedir.write_outputs(scenario.data.case_dir, r, {
                    k: v for k, v in outs.items() if k in DISPATCH_OUTPUTS + ("x",) and v.size
                })
    return RunResult(scenario.to_dict(), scenario.hardware.to_dict(), runs,
                     sum(leg.events for leg in legs), time.perf_counter() - wall0,
                     samples=samples, combine_ahead=how_ahead)


@dataclass
class Leg:
    """One op simulated on an idle machine from t = 0."""

    run: OpRun
    clock_ns: float  # the machine's clock when the op was over: where the next op starts
    events: int
    samples: list[Sample]

    @classmethod
    def of(cls, machine: Machine, run: OpRun) -> Leg:
        return cls(run, machine.env.now, machine.env.events_processed, machine.trace.samples)


def shifted(run: OpRun, offset: float) -> OpRun:
    """The op placed `offset` ns later in the run."""
    if not offset:
        return run
    return replace(
        run, start_ns=run.start_ns + offset, end_ns=run.end_ns + offset,
        spans=[replace(s, start_ns=s.start_ns + offset, end_ns=s.end_ns + offset,
                       delivered_ns=None if s.delivered_ns is None
                       else s.delivered_ns + offset) for s in run.spans],
        core_end_ns=[[e + offset for e in row] for row in run.core_end_ns])


def combine_inputs(t: MoeTiling, inputs: list[dict[str, np.ndarray]],
                   dispatch_out: list[dict[str, np.ndarray]] | None
                   ) -> tuple[list[np.ndarray | RowTable], list[dict[str, np.ndarray]] | None]:
    """Combine's expand_x and dispatch metadata: the identity experts' outputs of dispatch's
    rows (zero rows in a timing-only run), or, without a dispatch, the inputs' expand_x."""
    if dispatch_out is None:
        return [r["expand_x"] for r in inputs], None
    if t.timing_only:
        row_bytes = t.h * token_dtype(t.dtype).itemsize
        return [RowTable.zeros(t.max_rows_of(r), row_bytes) for r in range(t.world)], dispatch_out
    return expert_outputs(dispatch_out, t), dispatch_out


def reference_dispatch_outputs(t: MoeTiling, inputs: list[dict[str, np.ndarray]]
                               ) -> list[dict[str, np.ndarray]]:
    """What a correct dispatch writes (npusim.reference), in run_dispatch's layout; in a
    timing-only run only what combine reads of it (assist info and counts)."""
    from npusim.reference import reference_dispatch

    if t.timing_only:
        return routing_meta(t, inputs)
    return reference_dispatch(
        [r["x"] for r in inputs], [r["expert_ids"] for r in inputs], t.experts_per_rank,
        t.dispatch_quant, t.expert_token_nums_type, saturate=t.mxfp8_saturate,
        shared_experts=t.shared_experts, shared_expert_ranks=t.shared_expert_ranks)


def dispatch_digest(dispatch_out: list[dict[str, np.ndarray]] | None, t: MoeTiling) -> bytes:
    """A hash of everything combine reads of dispatch's outputs: every rank's counts and
    its first ep_recv_count[-1] rows of assist info (and of expand_x and scales, unless
    the run is timing-only). The combine kernel reads no row beyond the count."""
    h = hashlib.sha256()
    for d in dispatch_out or []:
        recv = np.ascontiguousarray(d["ep_recv_count"], dtype=np.int32)
        n = int(recv[-1]) if recv.size else 0
        parts = [recv, d["assist_info_for_combine"][:n]]
        if not t.timing_only:
            parts += [d["expand_x"][:n], d["dynamic_scales"][:n]]
        for a in parts:
            a = np.ascontiguousarray(a)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            if a.size:
                h.update(a.reshape(-1).view(np.uint8))
    return h.digest()


def expert_outputs(dispatch_out: list[dict[str, np.ndarray]], t: MoeTiling
                   ) -> list[np.ndarray | RowTable]:
    """Identity experts (shared ones too): every rank's dispatched rows dequantised to the
    token dtype. A token reaches several ranks as the same bytes; dequantisation is a pure
    function of them, so each distinct (row, scales) is dequantised once, bit-identically,
    and the ranks' expand_x tensors share those rows (RowTable) instead of a copy each."""
    dt = token_dtype(t.dtype)
    if t.dispatch_quant == "none":  # the rows as they are (combine only reads them)
        return [d["expand_x"].view(dt) for d in dispatch_out]
    row_view = np.int8 if t.dispatch_quant == "int8" else np.uint8
    where: dict[bytes, int] = {}  # (row, scales) bytes -> index among the distinct rows
    picks, firsts = [], []
    for r, d in enumerate(dispatch_out):
        n = int(d["ep_recv_count"][-1])
        if not n:
            picks.append(np.empty(0, np.intp))
            continue
        rows = d["expand_x"][:n].view(np.uint8)
        scales = d["dynamic_scales"][:n].reshape(n, -1).view(np.uint8)
        pick = np.empty(n, np.intp)
        for i in range(n):
            key = rows[i].tobytes() + scales[i].tobytes()
            j = where.get(key)
            if j is None:
                j = where[key] = len(firsts)
                firsts.append((r, i))
            pick[i] = j
        picks.append(pick)
    if firsts:
        data = np.stack([dispatch_out[r]["expand_x"][i] for r, i in firsts]).view(row_view)
        scales = np.stack([dispatch_out[r]["dynamic_scales"][i] for r, i in firsts])
        if t.dispatch_quant == "mxfp8":
            distinct = mxfp8_dequantize(data, scales, out_dtype=dt)
        else:
            distinct = int8_token_dequantize(data, scales, out_dtype=dt)
    else:
        distinct = np.zeros((0, t.h), dtype=dt)
    table = np.ascontiguousarray(distinct).view(np.uint8).reshape(len(firsts), t.h * dt.itemsize)
    return [RowTable(table, pick, t.max_rows_of(r)) for r, pick in enumerate(picks)]


def _op_run(machine: Machine, name: str, res: LaunchResult,
            outputs: list[dict[str, np.ndarray]]) -> OpRun:
    """The op's figures: its machine ran this op alone, so every counter is the op's."""
    return OpRun(
        op=name, start_ns=res.start_ns, end_ns=res.end_ns, ranks=machine.world,
        cores_per_rank=machine.cfg.chip.aiv_cores, spans=machine.trace.spans, outputs=outputs,
        bytes_sent=[r.bytes_out for r in machine.ranks],
        bytes_received=[r.bytes_in for r in machine.ranks],
        links=[LinkStats(link.name, link.kind, link.rank, link.bandwidth, link.bytes)
               for link in machine.resources()],
        core_bytes_put=[[ctx.bytes_put for ctx in row] for row in res.contexts],
        core_end_ns=[list(row) for row in res.core_end_ns],
        core_transfers=[[[TransferStat(*key, *val) for key, val in ctx.transfers.items()]
                         for ctx in row] for row in res.contexts],
    )


def _set_window_zones(machine: Machine, t: MoeTiling) -> None:
    """Tell the window sanitiser the kernel's layout (every access must stay in a zone)."""
    zones = t.window.regions()
    for rank in machine.ranks:
        rank.window.set_zones(zones)


def run_dispatch(machine: Machine, t: MoeTiling, inputs: list[dict[str, np.ndarray]],
                 limit_ns: float) -> tuple[OpRun, list[dict[str, np.ndarray]]]:
    """Dispatch on every rank of an idle machine; its OpRun and every rank's outputs."""
    rec = t.record
    row_dtype = token_dtype(t.dtype) if t.dispatch_quant == "none" else np.uint8
    scale_bytes = {"mxfp8": rec.scale_bytes, "int8": 4, "none": 0}[t.dispatch_quant]
    for r, (rank, inp) in enumerate(zip(machine.ranks, inputs, strict=True)):
        a, wl = t.max_rows_of(r), t.status_count(r)
        rank.tensor("x", np.ascontiguousarray(inp["x"], dtype=token_dtype(t.dtype)))
        rank.tensor("expert_ids", np.ascontiguousarray(inp["expert_ids"], dtype=np.int32))
        rank.tensor("expand_x", a * rec.data_bytes)
        rank.tensor("dynamic_scales", a * scale_bytes)
        rank.tensor("assist_info_for_combine", a * 12)
        rank.tensor("expert_token_nums", 8 * t.local_experts(r))
        rank.tensor("ep_recv_count", 4 * wl)
        rank.tensor("workspace", 4 * t.cores * wl)
    _set_window_zones(machine, t)
    res = launch(machine, dispatch_program(t), time_limit_ns=limit_ns, cores=t.cores)
    outputs = []
    for r, rank in enumerate(machine.ranks):
        tens = rank.tensors
        a = t.max_rows_of(r)
        if t.dispatch_quant == "mxfp8":
            scales = tens["dynamic_scales"].as_array(np.uint8, (a, scale_bytes))
        elif t.dispatch_quant == "int8":
            scales = tens["dynamic_scales"].as_array(np.float32, (a,))
        else:
            scales = np.zeros((a, 0), np.float32)
        x_dtype = np.int8 if t.dispatch_quant == "int8" else row_dtype
        outputs.append({
            "expand_x": tens["expand_x"].as_array(x_dtype, (a, t.h)),
            "dynamic_scales": scales,
            "assist_info_for_combine": tens["assist_info_for_combine"].as_array(
                np.int32, (a, 3)),
            "expert_token_nums": tens["expert_token_nums"].as_array(np.int64),
            "ep_recv_count": tens["ep_recv_count"].as_array(np.int32),
        })
    return _op_run(machine, "dispatch", res, outputs), outputs


def run_combine(machine: Machine, t: MoeTiling, inputs: list[dict[str, np.ndarray]],
                expand: list[np.ndarray | RowTable], meta: list[dict[str, np.ndarray]] | None,
                limit_ns: float) -> OpRun:
    """Combine on every rank of an idle machine. `meta` carries dispatch's assist info and
    counts; without it (a standalone combine) they are derived from the routing as dispatch
    would produce."""
    dt = token_dtype(t.dtype)
    if meta is None:
        meta = routing_meta(t, inputs)
    for rank, inp, ex, m in zip(machine.ranks, inputs, expand, meta, strict=True):
        rank.tensor("expand_x", ex if isinstance(ex, RowTable)
                    else np.ascontiguousarray(ex, dtype=dt))
        rank.tensor("assist_info_for_combine",
                    np.ascontiguousarray(m["assist_info_for_combine"], dtype=np.int32))
        rank.tensor("ep_recv_count", np.ascontiguousarray(m["ep_recv_count"], dtype=np.int32))
        rank.tensor("expert_ids", np.ascontiguousarray(inp["expert_ids"], dtype=np.int32))
        rank.tensor("expert_scales", np.ascontiguousarray(inp["expert_scales"],
                                                          dtype=np.float32))
        rank.tensor("x", t.bs * t.h * 2)
    _set_window_zones(machine, t)
    res = launch(machine, combine_program(t), time_limit_ns=limit_ns, cores=t.cores)
    outputs = [{"x": rank.tensors["x"].as_array(dt, (t.bs, t.h))}
               for rank in machine.ranks]
    return _op_run(machine, "combine", res, outputs)


def routing_meta(t: MoeTiling, inputs: list[dict[str, np.ndarray]]
                 ) -> list[dict[str, np.ndarray]]:
    """Dispatch's assist info and receive counts as the routing determines them."""
    from npusim.reference import dispatch_plan

    plans = dispatch_plan([inp["expert_ids"] for inp in inputs], t.experts_per_rank,
                          t.shared_experts, t.shared_expert_ranks)
    meta = []
    for r, plan in enumerate(plans):
        assist = np.zeros((t.max_rows_of(r), 3), np.int32)
        assist[:plan.n] = np.stack([plan.src, plan.token, plan.k], axis=1)
        meta.append({"assist_info_for_combine": assist,
                     "ep_recv_count": np.cumsum(plan.counts).astype(np.int32)})
    return meta
