"""How much of a fused kernel's communication hides behind its compute, and which stage
bounds it: the figures of a MIX launch that overlaps transfers with GEMMs (MegaMoE,
DeepEP-Ascend's fused MoE layers).

A program notes on each core (`note_remote`, `note_compute`, kept on `ctx.notes`):

- every remote transfer it issues (a put to or a pull from another rank), with a tag
  naming the communication it belongs to ("dispatch", "combine"); the transfer counts from
  its start on the pipe to its delivery;
- every compute instruction (a cube mmad, a vector op), with a tag naming the work it
  belongs to ("gmm1", "gmm2", "vector"); it counts while its unit is busy.

Per rank, communication C is the union of its transfers' intervals and compute X the union
of its compute intervals; hidden = |C and X| is the communication time during which the
rank also computes (the fusion overlaps it), exposed = |C| - hidden (nothing hides it: on
the critical path unless another rank is later). `layer_fields` also splits by tag: the
dispatch hidden behind GMM1, the combine behind GMM2.

A stage's time is the length of the union, over every rank, of the phase spans of the cores
that do its work (`workers`: "aic", "aiv", "aiv0", "aiv1"; the other cores only wait in
it). Stages overlap (that is the pipeline); the critical stage is the work stage with the
longest time (stages named in `waits`, a barrier's waiting, are reported, not candidates).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from npusim.kernels.kernel import CoreTiming

Interval = tuple[float, float]


class Notes:
    """One core's remote transfers (tag, Op handle) and compute intervals (tag, ns, ns)."""

    __slots__ = ("remote", "compute")

    def __init__(self) -> None:
        self.remote: list[tuple[str, Any]] = []
        self.compute: list[tuple[str, float, float]] = []


def notes(ctx: Any) -> Notes:
    n = ctx.notes
    if n is None:
        n = ctx.notes = Notes()
    return n


def note_remote(ctx: Any, op: Any, tag: str = "") -> Any:
    """Record a transfer to or from another rank (the caller knows it is remote)."""
    notes(ctx).remote.append((tag, op))
    return op


def note_compute(ctx: Any, op: Any, tag: str = "") -> Any:
    """Record a compute instruction's busy interval (known when it is issued)."""
    notes(ctx).compute.append((tag, op.start_at, op.done_at))
    return op


def union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(x: Sequence[Interval], y: Sequence[Interval]) -> float:
    """|x and y| of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _us(ns: float) -> float:
    return round(ns / 1e3, 4)


def overlap_fields(comm: Sequence[Sequence[Interval]], compute: Sequence[Sequence[Interval]],
                   stages: Mapping[str, list[Interval]], waits: Sequence[str] = ()
                   ) -> dict[str, Any]:
    """Per rank communication / hidden / exposed time (us), the hidden fraction over all
    ranks, the stage spans and the critical stage."""
    per_rank = []
    c_total = h_total = 0.0
    for c, x in zip(comm, compute, strict=True):
        cu, xu = union(c), union(x)
        c_ns, h_ns = length(cu), intersect(cu, xu)
        c_total += c_ns
        h_total += h_ns
        per_rank.append({"communication_us": _us(c_ns), "hidden_us": _us(h_ns),
                         "exposed_us": _us(c_ns - h_ns), "compute_us": _us(length(xu))})
    spans = {k: _us(length(union(v))) for k, v in stages.items()}
    work = [k for k in spans if k not in waits]
    critical = max(work, key=lambda k: spans[k]) if work else ""
    return {"communication_hidden_fraction": round(h_total / c_total, 4) if c_total else 0.0,
            "communication_per_rank": per_rank,
            "stage_us": spans,
            "critical_stage": critical}


def stage_intervals(run: Any, cores: Sequence[Sequence[CoreTiming]],
                    workers: Mapping[str, str]) -> dict[str, list[Interval]]:
    """Each phase's spans on the cores that work in it, in the run's phase order."""
    stages: dict[str, list[Interval]] = {}
    for s in run.spans:
        if s.lane != "phase":
            continue
        core = cores[s.rank][s.core]
        kind = core.kind
        role = f"aiv{core.sub_block}" if kind == "aiv" else kind
        if not role.startswith(workers.get(s.name, role)):
            continue
        stages.setdefault(s.name, []).append((s.start_ns, s.end_ns))
    order = {name: i for i, name in enumerate(run.phase_order)}
    return dict(sorted(stages.items(), key=lambda kv: order.get(kv[0], len(order))))


def busy_totals(run: Any, cores: Sequence[Sequence[CoreTiming]]) -> dict[str, float]:
    """Busy time (us, summed over the ranks' cores) of the cube, MTE1, FixPipe and vector
    pipes, per core kind."""
    busy: dict[str, float] = {}
    for r, row in enumerate(cores):
        for c, core in enumerate(row):
            for pipe, ns in run.core_busy_ns[r][c].items():
                key = f"{core.kind}_{pipe}"
                busy[key] = busy.get(key, 0.0) + ns
    return {k: _us(v) for k, v in sorted(busy.items())
            if k.split("_", 1)[1] in ("cube", "mte1", "fixpipe", "vector")}


def _notes_of(row: Sequence[CoreTiming]) -> Iterable[Notes]:
    return (core.notes for core in row if core.notes is not None)


def _remote(row: Sequence[CoreTiming], tags: Sequence[str] | None) -> list[Interval]:
    return [(op.start_at, op.done_at) for n in _notes_of(row) for tag, op in n.remote
            if op.done_at is not None and (tags is None or tag in tags)]


def _compute(row: Sequence[CoreTiming], tags: Sequence[str] | None) -> list[Interval]:
    return [(a, b) for n in _notes_of(row) for tag, a, b in n.compute
            if tags is None or tag in tags]


def timing_fields(run: Any, cores: Sequence[Sequence[CoreTiming]],
                  workers: Mapping[str, str], waits: Sequence[str] = ()) -> dict[str, Any]:
    """overlap_fields of a finished launch over every noted transfer and compute, then the
    busy time per core kind and pipe."""
    comm = [_remote(row, None) for row in cores]
    compute = [_compute(row, None) for row in cores]
    out = overlap_fields(comm, compute, stage_intervals(run, cores, workers), waits)
    out["busy_us_total"] = busy_totals(run, cores)
    return out


def layer_fields(run: Any, cores: Sequence[Sequence[CoreTiming]], workers: Mapping[str, str],
                 hides: Mapping[str, Sequence[str]], waits: Sequence[str] = ()
                 ) -> dict[str, Any]:
    """timing_fields plus, per communication tag, its time and how much of it hides behind
    the compute tagged hides[tag] (per-rank means, us): e.g. {"dispatch": ("gmm1",),
    "combine": ("gmm2",)} for a fused MoE layer."""
    out = timing_fields(run, cores, workers, waits)
    ranks = max(len(cores), 1)
    split: dict[str, dict[str, Any]] = {}
    for tag, behind in hides.items():
        c_ns = h_ns = 0.0
        for row in cores:
            cu = union(_remote(row, (tag,)))
            c_ns += length(cu)
            h_ns += intersect(cu, union(_compute(row, tuple(behind))))
        split[tag] = {"communication_us": _us(c_ns / ranks), "hidden_us": _us(h_ns / ranks),
                      "exposed_us": _us((c_ns - h_ns) / ranks),
                      "hidden_behind": "+".join(behind)}
    out["overlap"] = split
    return out
