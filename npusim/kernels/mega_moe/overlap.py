"""How much of MegaMoE's communication the fusion hides, and which stage is critical.

Per rank, from what the program recorded on its cores (npusim.kernels.mega_moe.sync):

- communication C: the union of the intervals in which a remote transfer of the rank is
  in flight (BuildSendMasks' mask stores, the dispatch's remote MTE2 pulls, the
  CombineTokens write-backs), from its start on the pipe to delivery (the rank barrier's
  4 B scalar stores are latency, not transfers, and are left out);
- compute X: the union of the intervals in which a cube (mmad) or a vector unit of the
  rank is busy;
- hidden = |C and X| / |C|: the share of communication time during which the rank also
  computes, so the fusion overlaps it; exposed = |C| - |C and X|, communication with
  nothing to hide it behind (on the critical path unless another rank is later).

A stage's time is the length of the union, over every rank, of the intervals the cores
that do its work (WORKERS: the AIC for the projections, AIV1 for counting and dispatch,
every AIV for the rest; the others only wait in it) spend in it. Stages overlap (that is
the pipeline); the critical stage is the work stage with the longest time, the one that
bounds the layer (synchronize_ranks, the barriers' waiting, is reported but not a
candidate).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from npusim.kernels.kernel import CoreTiming

Interval = tuple[float, float]
WORKERS = {"build_send_masks": "aiv", "quantize_local_tokens": "aiv",
           "synchronize_ranks": "aiv", "count_received_tokens": "aiv1", "dispatch": "aiv1",
           "first_projection": "aic", "second_projection": "aic", "combine": "aiv"}


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


def overlap_fields(comm: Sequence[Sequence[Interval]], compute: Sequence[Sequence[Interval]],
                   stages: dict[str, list[Interval]]) -> dict[str, Any]:
    """The report's family_fields: per rank communication / hidden / exposed time (us),
    the hidden fraction over all ranks, the stage spans and the critical stage."""
    per_rank = []
    c_total = h_total = 0.0
    for c, x in zip(comm, compute, strict=True):
        cu, xu = union(c), union(x)
        c_ns, h_ns = length(cu), intersect(cu, xu)
        c_total += c_ns
        h_total += h_ns
        per_rank.append({"communication_us": round(c_ns / 1e3, 4),
                         "hidden_us": round(h_ns / 1e3, 4),
                         "exposed_us": round((c_ns - h_ns) / 1e3, 4),
                         "compute_us": round(length(xu) / 1e3, 4)})
    spans = {k: round(length(union(v)) / 1e3, 4) for k, v in stages.items()}
    work = [k for k in spans if k != "synchronize_ranks"]
    critical = max(work, key=lambda k: spans[k]) if work else ""
    return {"communication_hidden_fraction": round(h_total / c_total, 4) if c_total else 0.0,
            "communication_per_rank": per_rank,
            "stage_us": spans,
            "critical_stage": critical}


def timing_fields(t: Any, run: Any, cores: Sequence[Sequence[CoreTiming]]) -> dict[str, Any]:
    """overlap_fields of a finished call: every core's notes (npusim.kernels.mega_moe.sync)
    and the run's phase spans, then per core kind the cube's and the vector's busy time."""
    comm, compute = [], []
    for row in cores:
        c: list[Interval] = []
        x: list[Interval] = []
        for core in row:
            n = core.notes
            if n is None:
                continue
            c += [(op.start_at, op.done_at) for op in n.remote if op.done_at is not None]
            x += n.compute
        comm.append(c)
        compute.append(x)
    stages: dict[str, list[Interval]] = {}
    for s in run.spans:
        if s.lane != "phase":
            continue
        core = cores[s.rank][s.core]
        kind = core.kind
        role = f"aiv{core.sub_block}" if kind == "aiv" else kind
        if not role.startswith(WORKERS.get(s.name, role)):
            continue
        stages.setdefault(s.name, []).append((s.start_ns, s.end_ns))
    order = {name: i for i, name in enumerate(run.phase_order)}
    stages = dict(sorted(stages.items(), key=lambda kv: order.get(kv[0], len(order))))
    out = overlap_fields(comm, compute, stages)
    busy: dict[str, float] = {}
    for r, row in enumerate(cores):
        for c, core in enumerate(row):
            kind = core.kind
            for pipe, ns in run.core_busy_ns[r][c].items():
                key = f"{kind}_{pipe}"
                busy[key] = busy.get(key, 0.0) + ns
    out["busy_us_total"] = {k: round(v / 1e3, 4) for k, v in sorted(busy.items())
                            if k.split("_", 1)[1] in ("cube", "mte1", "fixpipe", "vector")}
    return out
