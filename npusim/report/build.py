"""RunResult -> the report document (schema npusim.report/1), as plain JSON-able data.

Phase accounting works only on trace Spans (lane == "phase"), so the report never
touches simpy. Times are microseconds relative to each op's start, rounded to 4
decimals (0.1 ns) so two identical runs give byte-identical reports. Every field is
documented in docs/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npusim.engine.trace import Span
from npusim.hw.cores import CoreKind
from npusim.hw.cores import kind as core_kind
from npusim.report.diagnose import diagnose
from npusim.report.work import (
    TRANSFER_FIELDS,
    bytes_by_phase,
    heaviest,
    link_classes,
    port_caps,
    stream_ns,
)
from npusim.result import LinkStats, OpRun, RunResult, TransferStat

SCHEMA = "npusim.report/1"
US_DECIMALS = 4


def _r(x: float, nd: int = US_DECIMALS) -> float:
    v = round(float(x), nd)
    return 0.0 if v == 0 else v  # no "-0.0"


def _us(ns: float) -> float:
    return _r(ns / 1000.0)


@dataclass
class _Interval:
    """A phase's first start and last end, the summed span lengths (busy) and the count."""

    start: float
    end: float
    busy: float = 0.0
    count: int = 0

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
        iv = _merge(self.core.setdefault((s.rank, s.core), {}), s)
        iv.busy += s.end_ns - s.start_ns
        iv.count += 1
        _merge(self.rank.setdefault(s.rank, {}), s)
        _merge(self.op, s)

    def finish(self, kernel_order: Iterable[str]) -> None:
        """The kernel's declared phase order (its family's declaration) for the phases it
        declares, others after them by first start; rank and op busy = max over cores."""
        known = [n for n in kernel_order if n in self.op]
        rest = sorted((n for n in self.order if n not in known),
                      key=lambda n: (self.op[n].start, self.order.index(n)))
        self.order = known + rest
        for (r, _c), phases in sorted(self.core.items()):
            for name, iv in phases.items():
                for agg in (self.rank[r][name], self.op[name]):
                    agg.busy = max(agg.busy, iv.busy)
                    agg.count = max(agg.count, iv.count)


def _merge(phases: dict[str, _Interval], s: Span) -> _Interval:
    iv = phases.get(s.name)
    if iv is not None:
        iv.merge(s.start_ns, s.end_ns)
    else:
        iv = phases[s.name] = _Interval(s.start_ns, s.end_ns)
    return iv


def _phases_dict(phases: Mapping[str, _Interval], order: list[str], t0: float,
                 count: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in order:
        iv = phases.get(n)
        if iv is None:
            continue
        out[n] = {"start_us": _us(iv.start - t0), "end_us": _us(iv.end - t0),
                  "busy_us": _us(iv.busy)}
        if count:
            out[n]["count"] = iv.count
    return out


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


def _core_ends(op: OpRun, table: _PhaseTable) -> dict[tuple[int, int], float]:
    """Each core's end: its kernel end (program returned, pipes drained) when the run
    recorded it (the latency the perf harness and `npusim validate` use), else the end of
    its last phase."""
    ends = {key: max(iv.end for iv in phases.values()) for key, phases in table.core.items()}
    for r, row in enumerate(op.core_end_ns):
        for c, t in enumerate(row):
            ends[(r, c)] = float(t)
    return ends


def _critical(table: _PhaseTable, ends: Mapping[tuple[int, int], float], rank: int
              ) -> dict[str, Any]:
    """The core that ends last on the critical rank (lowest index on a tie) and its phase
    that ends last (first in kernel order on a tie)."""
    cores = sorted((c for (r, c) in ends if r == rank), key=lambda c: (-ends[(rank, c)], c))
    if not cores:
        return {"rank": rank, "core": None, "phase": None}
    core = cores[0]
    phases = table.core.get((rank, core), {})
    names = [n for n in table.order if n in phases]
    phase = max(names, key=lambda n: (phases[n].end, -names.index(n))) if names else None
    return {"rank": rank, "core": core, "phase": phase}


def _transfers(stats: list[TransferStat]) -> list[list[Any]]:
    """Rows in TRANSFER_FIELDS order."""
    return [[t.phase, t.pipe, t.name, bool(t.remote), int(t.count), int(t.bytes)]
            for t in stats]


def _windows(op: OpRun, table: _PhaseTable) -> dict[str, tuple[str | None, float]]:
    """Per link kind, the phase whose span the link's utilisation is measured over: for
    fabric links the phase that put the most bytes to other ranks; HBM serves every
    phase, so its window is the whole op."""
    remote = heaviest(bytes_by_phase(op.core_transfers, remote_only=True))
    duration = op.end_ns - op.start_ns
    iv = table.op.get(remote) if remote is not None else None
    fabric = (remote, iv.end - iv.start) if iv is not None else (None, duration)
    return {"fabric": fabric, "hbm": (None, duration)}


def _link_classes(op: OpRun, table: _PhaseTable) -> dict[str, Any]:
    out = {}
    for kind, c in link_classes(op.links, op.end_ns - op.start_ns, _windows(op, table)).items():
        out[kind] = {
            "links": c["links"], "bandwidth_gbps": _r(c["bandwidth_gbps"]), "bytes": c["bytes"],
            "achieved_gbps_mean": _r(c["achieved_gbps_mean"]),
            "achieved_gbps_max": _r(c["achieved_gbps_max"]),
            "utilisation_max": _r(c["utilisation_max"]),
            "busiest": c["busiest"], "busiest_rank": c["busiest_rank"],
            "busiest_bytes": c["busiest_bytes"],
            "phase": c["phase"], "utilisation_in_phase": _r(c["utilisation_in_phase"]),
        }
    return out


def _core_entry(op: OpRun, table: _PhaseTable, r: int, c: int, t0: float,
                caps: Mapping[tuple[str, bool], float], end: float | None,
                label: str | None = None) -> dict[str, Any]:
    stats = _at(op.core_transfers, r, c) or []
    stream = stream_ns(stats, caps)
    head: dict[str, Any] = {"core": c}
    if label:  # a MIX launch's core: its kind and index among its kind
        head["kind"] = label
    return {
        **head,
        "end_us": _us(end - t0) if end is not None else None,
        "phases": _phases_dict(table.core.get((r, c), {}), table.order, t0, count=True),
        "bytes_put": int(_at(op.core_bytes_put, r, c) or 0),
        "stream_us": {pipe: _us(ns) for pipe, ns in stream.items()},
        "busy_us": {pipe: _us(ns) for pipe, ns in (_at(op.core_busy_ns, r, c) or {}).items()},
        "instructions": {k: int(round(v))
                         for k, v in (_at(op.core_counters, r, c) or {}).items()},
        "transfers": _transfers(stats),
    }


def _at(rows: list[list[Any]], r: int, c: int) -> Any:
    return rows[r][c] if r < len(rows) and c < len(rows[r]) else None


def _ports(ranks: list[dict[str, Any]], latency_us: float, kind: CoreKind) -> dict[str, Any]:
    """Per transfer pipe of the core kind, the core whose transfers need the longest at
    its port caps."""
    out: dict[str, Any] = {}
    for pipe in (p.name for p in kind.transfer_pipes()):
        best = None
        for rank in ranks:
            for core in rank["cores"]:
                us = core["stream_us"].get(pipe, 0.0)
                if us > 0 and (best is None or us > best[0]):
                    best = (us, rank["rank"], core)
        if best is None:
            continue
        us, r, core = best
        nbytes = sum(t[5] for t in core["transfers"] if t[1] == pipe)
        out[pipe] = {"rank": r, "core": core["core"], "bytes": nbytes, "stream_us": us,
                     "share_of_latency": _r(us / latency_us) if latency_us > 0 else 0.0}
    return out


def _instructions(op: OpRun) -> dict[str, int]:
    """Executed instructions of every core of every rank, per counter."""
    total: dict[str, float] = {}
    for row in op.core_counters:
        for counts in row:
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
    return {k: int(round(v)) for k, v in total.items()}


def _pipe_ratios(op: OpRun, latency_ns: float) -> dict[str, float]:
    """Per pipe, its busy time over the op's latency, averaged over the launched cores
    that have the pipe (a profiler's aiv_vec_ratio, aiv_mte2_ratio, ...; a MIX launch's
    cube and mte1 ratios over its AICs, vector over its AIVs, mte2 over both)."""
    cores = [b for row in op.core_busy_ns for b in row]
    if not cores or latency_ns <= 0:
        return {}
    pipes = dict.fromkeys(p for b in cores for p in b)
    out = {}
    for p in pipes:
        having = [b[p] for b in cores if p in b]
        out[p] = _r(sum(having) / len(having) / latency_ns, 4)
    return out


def build_op(op: OpRun, hardware: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One op's entry: latency, phase spans per op / rank / core, bytes, links and the
    diagnosis. `hardware` (the preset as a dict) gives the port caps for stream times."""
    table = _PhaseTable()
    for s in op.spans:
        if s.lane == "phase":
            table.add(s)
    table.finish(op.phase_order)
    kind = core_kind(op.core_kind)
    caps = port_caps(hardware or {}, kind)
    # a MIX launch: each core's stream times at its own kind's port caps
    part_caps = {p.name: port_caps(hardware or {}, p) for p, _ in kind.parts}
    labels = op.core_labels
    t0 = op.start_ns
    n_cores = max((len(row) for row in op.core_transfers), default=0)
    ranks_seen = set(range(op.ranks)) | set(table.rank)
    ends = _core_ends(op, table)
    ranks: list[dict[str, Any]] = []
    rank_end: dict[int, float] = {}
    for r in sorted(ranks_seen):
        phases = table.rank.get(r, {})
        end = max((t for (rr, _c), t in ends.items() if rr == r), default=op.end_ns)
        rank_end[r] = end
        cores = sorted({c for (rr, c) in table.core if rr == r}
                       | (set(range(n_cores)) if r < len(op.core_transfers) else set()))
        ranks.append(
            {
                "rank": r,
                "latency_us": _us(end - t0),
                "phases": _phases_dict(phases, table.order, t0),
                "bytes_sent": _per_rank(op.bytes_sent, r),
                "bytes_received": _per_rank(op.bytes_received, r),
                "l2_held_bytes": _per_rank(op.l2_held, r),
                "cores": [_core_entry(op, table, r, c, t0,
                                      part_caps[labels[c].split()[0]] if c < len(labels)
                                      else caps, ends.get((r, c)),
                                      labels[c] if c < len(labels) else None)
                          for c in cores],
            }
        )
    crit_rank = max(sorted(rank_end), key=lambda r: rank_end[r]) if rank_end else None
    latency_ns = rank_end[crit_rank] - t0 if crit_rank is not None else op.end_ns - t0
    duration = op.end_ns - op.start_ns
    entry: dict[str, Any] = {
        "op": op.op,
        "latency_us": _us(latency_ns),
        "phases": _phases_dict(table.op, table.order, t0),
        "phase_order": list(table.order),
        "critical": _critical(table, ends, crit_rank) if crit_rank is not None else None,
        "diagnosis": None,
        "start_us": _us(op.start_ns),
        "end_us": _us(op.end_ns),
        "duration_us": _us(duration),
        "cores_per_rank": int(op.cores_per_rank),
        "bytes_sent_total": int(sum(op.bytes_sent)),
        "bytes_received_total": int(sum(op.bytes_received)),
        "l2_held_bytes_total": int(sum(op.l2_held)),
        "link_classes": _link_classes(op, table),
        "ports": _ports(ranks, _us(latency_ns), kind),
        "instructions": _instructions(op),
        "pipe_ratios": _pipe_ratios(op, latency_ns),
        "family_fields": jsonable(op.family_fields),
        "transfer_fields": list(TRANSFER_FIELDS),
        "links": [_link(lk, duration) for lk in op.links],
        "ranks": ranks,
    }
    entry["diagnosis"] = diagnose(entry, hardware, kind)
    return entry


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


def build_report(result: RunResult,
                 fidelity: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The report document for one run (see docs for every field); `fidelity` is each
    op's ledger as plain data (npusim.fidelity.run.fidelity_docs), by op name."""
    hardware = jsonable(result.hardware)
    if "name" not in hardware:
        hardware = {"name": result.scenario.get("hardware_name", "unknown"), **hardware}
    ops = [build_op(op, hardware) for op in result.ops]
    for entry in ops:
        if fidelity is not None and entry["op"] in fidelity:
            entry["fidelity"] = jsonable(fidelity[entry["op"]])
    return {
        "schema": SCHEMA,
        "scenario": jsonable(result.scenario),
        "hardware": hardware,
        "ops": ops,
        "sim": {"wall_s": _r(result.wall_s, 3), "events": int(result.events)},
    }


def phase_names(ops: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every phase name over ops, first-seen order (for tables)."""
    seen: dict[str, None] = {}
    for op in ops:
        for name in op.get("phase_order", op.get("phases", {})):
            seen.setdefault(name, None)
    return list(seen)
