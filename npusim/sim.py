"""One run: scenario -> machine + inputs -> kernels on every core -> RunResult.

This is the only place that knows both the scenario (YAML world) and the kernels; the
kernels get a MoeTiling and named GM tensors, the report gets plain data.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from npusim.engine.trace import Trace
from npusim.hw.machine import Machine
from npusim.hw.memory import RowTable
from npusim.kernels.combine import combine_program
from npusim.kernels.dispatch import dispatch_program
from npusim.kernels.quant import int8_token_dequantize, mxfp8_dequantize, token_dtype
from npusim.kernels.tiling import MoeTiling
from npusim.result import LinkStats, OpRun, RunResult, TransferStat
from npusim.runtime.launch import LaunchResult, launch
from npusim.scenario import Scenario
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
                          shared_expert_ranks=w.shared_expert_ranks)
    return inp.per_rank()


def simulate(scenario: Scenario, detailed_trace: bool = False,
             progress: Callable[[str], None] | None = None) -> RunResult:
    wall0 = time.perf_counter()
    t = tiling_of(scenario)
    hw = scenario.hardware
    inputs = load_inputs(scenario)
    machine = Machine(hw, t.world, Trace(detailed=detailed_trace))
    limit_ns = scenario.run.sim_time_limit_us * 1000.0
    ops: list[OpRun] = []
    dispatch_out: list[dict[str, np.ndarray]] | None = None
    for op in scenario.workload.ops:
        if progress:
            progress(op)
        if op == "dispatch":
            run, dispatch_out = run_dispatch(machine, t, inputs, limit_ns)
        else:
            if dispatch_out is not None and scenario.data.case_dir is None:
                row_bytes = t.h * token_dtype(t.dtype).itemsize
                expand = (expert_outputs(dispatch_out, t) if not t.timing_only
                          else [RowTable.zeros(t.max_rows_of(r), row_bytes)
                                for r in range(t.world)])
                meta = dispatch_out
            else:
                expand = [r["expand_x"] for r in inputs]
                meta = None
            run = run_combine(machine, t, inputs, expand, meta, limit_ns)
        ops.append(run)
    if scenario.data.case_dir is not None:
        for run in ops:
            for r, outs in enumerate(run.outputs):
                casedir.write_outputs(scenario.data.case_dir, r, {
                    k: v for k, v in outs.items() if k in DISPATCH_OUTPUTS + ("x",) and v.size
                })
    return RunResult(scenario.to_dict(), hw.to_dict(), ops, machine.env.events_processed,
                     time.perf_counter() - wall0, samples=machine.trace.samples)


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


def _stats_before(machine: Machine) -> tuple[list[int], list[int], list[int]]:
    return ([r.bytes_out for r in machine.ranks], [r.bytes_in for r in machine.ranks],
            [res.bytes for res in machine.resources()])


def _op_run(machine: Machine, name: str, res: LaunchResult, before, spans_from: int,
            outputs: list[dict[str, np.ndarray]]) -> OpRun:
    start, end = res.start_ns, res.end_ns
    out0, in0, res0 = before
    links = [LinkStats(res.name, res.kind, res.rank, res.bandwidth, res.bytes - b0)
             for res, b0 in zip(machine.resources(), res0, strict=True)]
    return OpRun(
        op=name, start_ns=start, end_ns=end, ranks=machine.world,
        cores_per_rank=machine.cfg.chip.aiv_cores,
        spans=machine.trace.spans[spans_from:], outputs=outputs,
        bytes_sent=[r.bytes_out - b for r, b in zip(machine.ranks, out0, strict=True)],
        bytes_received=[r.bytes_in - b for r, b in zip(machine.ranks, in0, strict=True)],
        links=links,
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
    before = _stats_before(machine)
    first_span = len(machine.trace.spans)
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
    return _op_run(machine, "dispatch", res, before, first_span, outputs), outputs


def run_combine(machine: Machine, t: MoeTiling, inputs: list[dict[str, np.ndarray]],
                expand: list[np.ndarray | RowTable], meta: list[dict[str, np.ndarray]] | None,
                limit_ns: float) -> OpRun:
    """Combine on every rank. `meta` carries dispatch's assist info and counts; without it
    (a standalone combine) they are derived from the routing as dispatch would produce."""
    from npusim.reference import dispatch_plan

    dt = token_dtype(t.dtype)
    if meta is None:
        plans = dispatch_plan([inp["expert_ids"] for inp in inputs], t.experts_per_rank,
                              t.shared_experts, t.shared_expert_ranks)
        meta = []
        for r, plan in enumerate(plans):
            assist = np.zeros((t.max_rows_of(r), 3), np.int32)
            assist[:plan.n] = np.stack([plan.src, plan.token, plan.k], axis=1)
            meta.append({"assist_info_for_combine": assist,
                         "ep_recv_count": np.cumsum(plan.counts).astype(np.int32)})
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
    before = _stats_before(machine)
    first_span = len(machine.trace.spans)
    res = launch(machine, combine_program(t), time_limit_ns=limit_ns, cores=t.cores)
    outputs = [{"x": rank.tensors["x"].as_array(dt, (t.bs, t.h))}
               for rank in machine.ranks]
    return _op_run(machine, "combine", res, before, first_span, outputs)
