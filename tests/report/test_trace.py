"""Detailed tracing and the Chrome trace: hand arithmetic on round_hw, validity on a run."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim.engine.trace import Sample, Span, Trace
from npusim.hw.machine import Machine
from npusim.report.trace import build_trace, core_tid, dumps_trace
from npusim.result import OpRun, RunResult
from npusim.runtime.launch import launch
from npusim.sim import simulate
from tests.conftest import round_hw
from tests.kernels.cann_sample.samplehelp import scenario


def _puts(sizes: list[int], cores: set[int]):
    """Core c of rank 0 puts each size in turn into rank 1's window, then waits."""
    def program(ctx):
        if ctx.rank_id != 0 or ctx.core_id not in cores:
            return
        buf = ctx.alloc("out", max(sizes))
        ctx.ub_write(buf, 0, np.ones(max(sizes), np.uint8), ops=0)
        ops = [ctx.put(1, ctx.core_id * 65536 + i * 16384, buf, n, name=f"put{i}")
               for i, n in enumerate(sizes)]
        yield from ctx.wait(*ops)
    return program


def test_mte_slice_is_pipe_occupancy_and_delivery_is_in_the_span() -> None:
    m = Machine(round_hw(), world=2, trace=Trace(detailed=True))
    launch(m, _puts([10000, 10000], {0}))
    spans = [s for s in m.trace.spans if s.lane == "mte3"]
    # 10 B/ns port: each put streams 1000 ns; delivered 200 (put) + 50 (link) later;
    # the second streams as soon as the first's last byte left (flight latencies overlap)
    assert [(s.name, s.start_ns, s.end_ns, s.delivered_ns, s.bytes) for s in spans] == [
        ("put0", 0.0, pytest.approx(1000.0), pytest.approx(1250.0), 10000),
        ("put1", pytest.approx(1000.0), pytest.approx(2000.0), pytest.approx(2250.0), 10000),
    ]
    waits = [s for s in m.trace.spans if s.lane == "wait"]
    assert [(s.name, s.end_ns) for s in waits] == [("wait put0", pytest.approx(1250.0)),
                                                  ("wait put1", pytest.approx(2250.0))]


def test_link_counters_follow_the_shared_rate() -> None:
    # egress = one port: two cores each get half; the counter shows the sum, then zero
    hw = round_hw(fabric__egress_gbps=10.0, mte__put_gbps=10.0)
    m = Machine(hw, world=2, trace=Trace(detailed=True))
    launch(m, _puts([10000], {0, 1}))
    egress = [(s.t_ns, s.gbps) for s in m.trace.samples if s.resource == "rank0.egress"]
    assert egress == [(0.0, pytest.approx(10.0)), (pytest.approx(2000.0), 0.0)]
    ingress = [(s.t_ns, s.gbps) for s in m.trace.samples if s.resource == "rank1.ingress"]
    assert ingress == egress
    assert all(s.kind in ("egress", "ingress", "hbm") for s in m.trace.samples)


def test_no_observer_and_no_pipe_spans_without_detailed_tracing() -> None:
    m = Machine(round_hw(), world=2)
    assert m.net.observer is None
    launch(m, _puts([10000], {0}))
    assert m.trace.samples == [] and all(s.lane == "phase" for s in m.trace.spans)


def test_tracing_does_not_change_the_simulation(tmp_path: Path) -> None:
    sc = scenario(tmp_path, op="dispatch_combine", combine_quant="int8")
    plain, traced = simulate(sc), simulate(sc, detailed_trace=True)
    assert plain.events == traced.events
    for a, b in zip(plain.ops, traced.ops, strict=True):
        assert (a.start_ns, a.end_ns) == (b.start_ns, b.end_ns)
        assert [s for s in a.spans] == [s for s in b.spans if s.lane == "phase"]
        assert a.core_transfers == b.core_transfers
    assert plain.samples == [] and traced.samples


def _check_chrome_trace(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The validity rules of the Chrome trace event format that viewers rely on."""
    threads: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in ev, (key, ev)
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
            threads[(ev["pid"], ev["tid"])].append(ev)
        elif ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                      for v in ev["args"].values()), ev
        else:
            assert ev["ph"] == "M" and "args" in ev, ev
    eps = 1e-9
    for key, evs in threads.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[float] = []  # ends of the open slices
        for e in evs:
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1] <= start + eps:
                stack.pop()
            assert not stack or end <= stack[-1] + eps, f"partial overlap on {key}: {e}"
            stack.append(end)
    return threads


def test_chrome_trace_of_a_run_is_valid(tmp_path: Path) -> None:
    sc = scenario(tmp_path, op="dispatch_combine", combine_quant="int8", ep_world_size=2,
                  experts_per_rank=4)
    result = simulate(sc, detailed_trace=True)
    text = dumps_trace(build_trace(result))
    doc = json.loads(text)
    threads = _check_chrome_trace(doc)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert set(threads) <= set(names)
    assert names[(0, core_tid(3, "mte3"))] == "core 3 mte3"
    lanes = {n.split()[-1] for n in names.values()}
    assert lanes == {"ops", "phase", "scalar", "vector", "mte2", "mte3", "wait"}
    slices = [e for evs in threads.values() for e in evs]
    by_lane = defaultdict(set)
    for e in slices:
        by_lane[names[(e["pid"], e["tid"])].split()[-1]].add(e["name"])
    assert by_lane["ops"] == {"dispatch", "combine"}
    assert {"send_data", "local_copy", "combine"} <= by_lane["phase"]
    assert {"put_token", "copy_row", "put_flag"} <= by_lane["mte3"]
    assert "load_token" in by_lane["mte2"]
    put = next(e for e in slices if e["name"] == "put_token")
    assert put["args"]["bytes"] > 0 and put["args"]["delivered_us"] >= put["ts"] + put["dur"]
    counters = {(e["pid"], e["name"]) for e in doc["traceEvents"] if e["ph"] == "C"}
    assert {(0, "egress GB/s"), (1, "ingress GB/s"), (0, "hbm GB/s")} <= counters
    assert dumps_trace(build_trace(simulate(sc, detailed_trace=True))) == text  # deterministic


def test_trace_slices_by_hand() -> None:
    spans = [
        Span(0, 1, "phase", "send_data", 1000.0, 5000.0),
        Span(0, 1, "scalar", "send_data", 1000.0, 1001.0),
        Span(0, 1, "scalar", "send_data", 1001.0, 1003.0),  # merged with the one before
        Span(0, 1, "scalar", "send_data", 1004.0, 1005.0),  # a gap: a new slice
        Span(0, 1, "vector", "cast", 1003.0, 1003.0),  # zero length: dropped
        Span(0, 1, "mte3", "put", 1100.0, 1200.0, 512, delivered_ns=1900.0),
    ]
    op = OpRun("dispatch", 500.0, 6000.0, ranks=1, cores_per_rank=2, spans=spans)
    res = RunResult({"name": "hand"}, {"name": "hw"}, [op], events=1, wall_s=0.0,
                    samples=[Sample("rank0.egress", "egress", 0, 1100.0, 12.5)])
    doc = json.loads(dumps_trace(build_trace(res)))
    _check_chrome_trace(doc)
    xs = [(e["tid"], e["name"], e["ts"], e["dur"], e.get("args")) for e in doc["traceEvents"]
          if e["ph"] == "X"]
    assert xs == [
        (0, "dispatch", 0.5, 5.5, None),
        (core_tid(1, "phase"), "send_data", 1.0, 4.0, None),
        (core_tid(1, "scalar"), "send_data", 1.0, 0.003, None),
        (core_tid(1, "scalar"), "send_data", 1.004, 0.001, None),
        (core_tid(1, "mte3"), "put", 1.1, 0.1, {"bytes": 512, "delivered_us": 1.9}),
    ]
    (c,) = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert c == {"name": "egress GB/s", "ph": "C", "pid": 0, "tid": 0, "ts": 1.1,
                 "args": {"GB/s": 12.5}}
