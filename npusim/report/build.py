"""RunResult -> the report document (schema npusim.report/1), as plain JSON-able data.

Phase accounting works only on trace Spans (lane == "phase"), so the report never
touches simpy. Times are microseconds relative to each op's start, rounded to 4
decimals (0.1 ns) so two identical runs give byte-identical reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npusim.engine.trace import Span
from npusim.result import LinkStats, OpRun, RunResult

SCHEMA = "npusim.report/1"
US_DECIMALS = 4


def _r(x: float, nd: int = US_DECIMALS) -> float:
    v = round(float(x), nd)
    return 0.0 if v == 0 else v  # no "-0.0"


def _us(ns: float) -> float:
    return _r(ns / 1000.0)


@dataclass
class _Interval:
    start: float
    end: float

    def merge(self, start: float, end: float) -> None:
        self.start = min(self.start, start)
        self.end = max(self.end, end)


@dataclass
class _PhaseTable:
    """Phase intervals per (rank, core), per rank and per op; names in first-seen order."""

    order: list[str] = field(default_factory=list)
    core: dict[tuple[int, int], dict[str, _Interval]] = field(default_factory=dict)
    rank: dict[int, dict[str, _Interval]] = field(default_factory=dict)
    op: dict[str, _Interval] = field(default_factory=dict)

    def add(self, s: Span) -> None:
        if s.name not in self.op:
            self.order.append(s.name)
        _merge(self.core.setdefault((s.rank, s.core), {}), s)
        _merge(self.rank.setdefault(s.rank, {}), s)
        _merge(self.op, s)


def _merge(phases: dict[str, _Interval], s: Span) -> None:
    if s.name in phases:
        phases[s.name].merge(s.start_ns, s.end_ns)
    else:
        phases[s.name] = _Interval(s.start_ns, s.end_ns)


def _phases_dict(phases: Mapping[str, _Interval], order: list[str], t0: float) -> dict[str, Any]:
    return {
        n: {"start_us": _us(phases[n].start - t0), "end_us": _us(phases[n].end - t0)}
        for n in order
        if n in phases
    }


def _per_rank(values: list[int], rank: int) -> int | None:
    return int(values[rank]) if rank < len(values) else None


def _link(link: LinkStats, duration_ns: float) -> dict[str, Any]:
    achieved = link.bytes / duration_ns if duration_ns > 0 else 0.0  # B/ns == GB/s
    util = achieved / link.bandwidth_gbps if link.bandwidth_gbps > 0 else 0.0
    return {
        "name": link.name,
        "kind": link.kind,
        "rank": int(link.rank),
        "bandwidth_gbps": _r(link.bandwidth_gbps),
        "bytes": int(link.bytes),
        "achieved_gbps": _r(achieved),
        "utilisation": _r(util),
    }


def _critical(table: _PhaseTable, rank: int, t_end: float) -> dict[str, Any]:
    """The core and phase that end last on the critical rank (lowest core, first phase)."""
    for (r, c), phases in sorted(table.core.items()):
        if r != rank:
            continue
        for name in table.order:
            iv = phases.get(name)
            if iv is not None and iv.end == t_end:
                return {"rank": rank, "core": c, "phase": name}
    return {"rank": rank, "core": None, "phase": None}


def build_op(op: OpRun) -> dict[str, Any]:
    """One op's entry: latency, phase spans per op / rank / core, bytes and links."""
    table = _PhaseTable()
    for s in op.spans:
        if s.lane == "phase":
            table.add(s)
    t0 = op.start_ns
    ranks_seen = set(range(op.ranks)) | set(table.rank)
    ranks: list[dict[str, Any]] = []
    rank_end: dict[int, float] = {}
    for r in sorted(ranks_seen):
        phases = table.rank.get(r, {})
        end = max((iv.end for iv in phases.values()), default=op.end_ns)
        rank_end[r] = end
        cores = [
            {"core": c, "phases": _phases_dict(p, table.order, t0)}
            for (rr, c), p in sorted(table.core.items())
            if rr == r
        ]
        ranks.append(
            {
                "rank": r,
                "latency_us": _us(end - t0),
                "phases": _phases_dict(phases, table.order, t0),
                "bytes_sent": _per_rank(op.bytes_sent, r),
                "bytes_received": _per_rank(op.bytes_received, r),
                "cores": cores,
            }
        )
    crit_rank = max(sorted(rank_end), key=lambda r: rank_end[r]) if rank_end else None
    latency_ns = rank_end[crit_rank] - t0 if crit_rank is not None else op.end_ns - t0
    duration = op.end_ns - op.start_ns
    return {
        "op": op.op,
        "latency_us": _us(latency_ns),
        "phases": _phases_dict(table.op, table.order, t0),
        "phase_order": list(table.order),
        "ranks": ranks,
        "start_us": _us(op.start_ns),
        "end_us": _us(op.end_ns),
        "duration_us": _us(duration),
        "cores_per_rank": int(op.cores_per_rank),
        "critical": (
            _critical(table, crit_rank, rank_end[crit_rank]) if crit_rank is not None else None
        ),
        "bytes_sent_total": int(sum(op.bytes_sent)),
        "bytes_received_total": int(sum(op.bytes_received)),
        "links": [_link(lk, duration) for lk in op.links],
    }


def jsonable(obj: Any) -> Any:
    """Plain JSON types only: numpy values, Paths, tuples and sets converted."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((jsonable(v) for v in obj), key=repr)
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None  # JSON has no NaN/Infinity
    return str(obj)  # Path and anything else: its text


def build_report(result: RunResult) -> dict[str, Any]:
    """The report document for one run (see docs for every field)."""
    hardware = jsonable(result.hardware)
    if "name" not in hardware:
        hardware = {"name": result.scenario.get("hardware_name", "unknown"), **hardware}
    return {
        "schema": SCHEMA,
        "scenario": jsonable(result.scenario),
        "hardware": hardware,
        "ops": [build_op(op) for op in result.ops],
        "sim": {"wall_s": _r(result.wall_s, 3), "events": int(result.events)},
    }


def phase_names(ops: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every phase name over ops, first-seen order (for tables)."""
    seen: dict[str, None] = {}
    for op in ops:
        for name in op.get("phase_order", op.get("phases", {})):
            seen.setdefault(name, None)
    return list(seen)
