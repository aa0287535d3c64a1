"""trace.json: the run as a Chrome trace (Perfetto UI, chrome://tracing).

One process per rank (pid = rank), one thread per core lane ("core c phase", "core c
scalar", ... "core c wait") plus a thread with the ops, complete events ("X", ts and dur
in microseconds) named by kernel step, and counters ("C") with every link's used
bandwidth over time. Slices on one thread never partially overlap: a core's lanes are
sequential by construction, and an MTE slice is the pipe's occupancy (first to last
byte); its delivery time is in args. Consecutive scalar slices of one step are merged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from npusim.engine.trace import Sample, Span
from npusim.hw.cores import AIV, CoreKind
from npusim.hw.cores import kind as core_kind
from npusim.result import RunResult

SCHEMA = "npusim.trace/1"


def lanes_of(kinds: Iterable[CoreKind]) -> tuple[str, ...]:
    """A core's threads: its phases, every pipe the core kinds declare, its waits."""
    pipes = dict.fromkeys(p for k in kinds for p in k.pipe_names())
    return ("phase", *pipes, "wait")


LANES = lanes_of([AIV])
_STRIDE = 8  # tids per core: room for the lanes
_OPS_TID = 0
_TICKS = 10  # time unit inside: 0.1 ns ticks, so rounding keeps slices ordered
_TICKS_PER_US = 10_000


def core_tid(core: int, lane: str, lanes: tuple[str, ...] = LANES) -> int:
    """The thread id of one lane of one core (tid 0 is the rank's op thread)."""
    return 1 + core * max(_STRIDE, len(lanes)) + lanes.index(lane)


def _tick(ns: float) -> int:
    return round(ns * _TICKS)


def _us(ticks: int) -> float:
    return ticks / _TICKS_PER_US


def _meta(kind: str, pid: int, tid: int, value: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": value}


def _slices(spans: Iterable[Span], lanes: tuple[str, ...]
            ) -> list[tuple[int, int, int, int, str, dict[str, Any]]]:
    """(pid, tid, start tick, end tick, name, args); scalar runs of one step merged."""
    out: list[tuple[int, int, int, int, str, dict[str, Any]]] = []
    last: dict[tuple[int, int], int] = {}
    tids = {lane: i for i, lane in enumerate(lanes)}
    stride = max(_STRIDE, len(lanes))
    for s in spans:
        lane = tids.get(s.lane)
        if lane is None:
            continue
        t0, t1 = _tick(s.start_ns), _tick(s.end_ns)
        if t1 <= t0 and s.lane != "phase":
            continue  # zero-length pipe activity carries no information
        tid = 1 + s.core * stride + lane
        key = (s.rank, tid)
        if s.lane == "scalar" and key in last:
            i = last[key]
            p = out[i]
            if p[4] == s.name and p[3] == t0:
                out[i] = (p[0], p[1], p[2], t1, p[4], p[5])
                continue
        args: dict[str, Any] = {}
        if s.bytes:
            args["bytes"] = s.bytes
        if s.delivered_ns is not None:
            args["delivered_us"] = _us(_tick(s.delivered_ns))
        last[key] = len(out)
        out.append((s.rank, tid, t0, t1, s.name, args))
    return out


def _counters(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    out = []
    for s in samples:
        label = s.resource.split(".", 1)[1] if s.resource.startswith(f"rank{s.rank}.") \
            else s.resource
        out.append({"name": f"{label} GB/s", "ph": "C", "pid": s.rank, "tid": _OPS_TID,
                    "ts": _us(_tick(s.t_ns)), "args": {"GB/s": round(s.gbps, 4)}})
    return out


def build_trace(result: RunResult) -> dict[str, Any]:
    """The Chrome trace document of a run (detailed spans if the run recorded them)."""
    ranks = max((op.ranks for op in result.ops), default=0)
    spans = [s for op in result.ops for s in op.spans]
    lanes = lanes_of(core_kind(k) for k in dict.fromkeys(
        k for op in result.ops for k in (op.core_kind, *op.engines)))
    stride = max(_STRIDE, len(lanes))
    slices = _slices(spans, lanes)
    for op in result.ops:
        for r in range(op.ranks):
            slices.append((r, _OPS_TID, _tick(op.start_ns), _tick(op.end_ns), op.op, {}))
    # parents before children: by thread, start, then longer first
    slices.sort(key=lambda x: (x[0], x[1], x[2], -(x[3] - x[2])))
    events: list[dict[str, Any]] = []
    threads = sorted({(p, t) for p, t, *_ in slices})
    for r in range(ranks):
        events.append(_meta("process_name", r, 0, {"name": f"rank {r}"}))
        events.append(_meta("process_sort_index", r, 0, {"sort_index": r}))
    labels = next((op.core_labels for op in result.ops if op.core_labels), [])
    for pid, tid in threads:
        if tid == _OPS_TID:
            name = "ops"
        else:
            core, lane = divmod(tid - 1, stride)
            who = f"core {core} ({labels[core]})" if core < len(labels) else f"core {core}"
            name = f"{who} {lanes[lane]}"
        events.append(_meta("thread_name", pid, tid, {"name": name}))
        events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
    for pid, tid, t0, t1, name, args in slices:
        ev: dict[str, Any] = {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": _us(t0),
                              "dur": _us(t1 - t0)}
        if args:
            ev["args"] = args
        events.append(ev)
    events.extend(_counters(result.samples))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"schema": SCHEMA, "scenario": result.scenario.get("name"),
                      "detailed": any(s.lane != "phase" for s in spans)},
    }


def dumps_trace(doc: dict[str, Any]) -> str:
    """Compact JSON, one event per line (small, and still diffable)."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    lines = [json.dumps(ev, separators=(",", ":"), allow_nan=False) for ev in doc["traceEvents"]]
    body = ",\n".join(lines)
    rest = json.dumps(head, separators=(",", ":"), allow_nan=False)[1:-1]
    return '{"traceEvents":[\n' + body + "\n]," + rest + "}\n"
