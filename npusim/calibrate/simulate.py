"""A table's rows as timing-only scenarios, simulated in parallel processes; rows of one
run share its simulation."""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from npusim.calibrate.table import Measurement, bandwidth_field, family_of, timed_ops


def row_doc(m: Measurement, hardware: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The scenario that times the row: its run (see timed_ops), timing only."""
    workload = dict(m.workload)
    workload["op"] = timed_ops(family_of(workload), workload)[m.op][0]
    workload["timing_only"] = True
    doc = {
        "name": m.name,
        "hardware": hardware,
        "hardware_overrides": {**m.hardware, **overrides},
        "workload": workload,
    }
    if m.run:
        doc["run"] = dict(m.run)
    return doc


def simulate_row(args: tuple[dict[str, Any], str]) -> list[tuple[float, dict[str, Any]]]:
    """Each op of the row's run: its latency (us) and its family_fields; runs in a worker
    process."""
    from npusim.scenario import scenario_from_doc
    from npusim.sim import simulate

    doc, src = args
    sc = scenario_from_doc(doc, src, Path.cwd())
    result = simulate(sc)
    return [((op.end_ns - op.start_ns) / 1000.0, op.family_fields) for op in result.ops]


def row_value(m: Measurement, op: tuple[float, dict[str, Any]]) -> float:
    """The simulated counterpart of the row's measured value: the op's latency, or the
    bandwidth figure its kernel names (NaN if the run gave none, which no check passes)."""
    us, fields = op
    if not m.bandwidth:
        return us
    v = fields.get(bandwidth_field(m))
    return float(v) if isinstance(v, int | float) and v > 0 else math.nan


def _job_key(doc: dict[str, Any]) -> str:
    """Rows whose scenarios differ only in name share one simulation (two combine rows of
    one mc2 shape both read the fused run's result)."""
    return repr(sorted((k, repr(v)) for k, v in doc.items() if k != "name"))


def table_runs(
    rows: list[Measurement], hardware: str, overrides: dict[str, Any]
) -> tuple[list[tuple[dict[str, Any], int]], list[tuple[int, int]]]:
    """The distinct runs that time a table's rows, each with the index of its first row,
    and per row: its run and its op's place in that run."""
    runs: list[tuple[dict[str, Any], int]] = []
    where: list[tuple[int, int]] = []
    keys: dict[str, int] = {}
    for i, m in enumerate(rows):
        doc = row_doc(m, hardware, overrides)
        key = _job_key(doc)
        if key not in keys:
            keys[key] = len(runs)
            runs.append((doc, i))
        where.append((keys[key], timed_ops(family_of(m.workload), m.workload)[m.op][1]))
    return runs, where


def simulate_table(
    rows: list[Measurement],
    hardware: str,
    overrides: dict[str, Any],
    source: str,
    workers: int | None = None,
) -> list[float]:
    """Simulated latency of every row (validates every row's scenario first, here)."""
    return simulate_tables(rows, hardware, [overrides], source, workers)[0]


def simulate_tables(
    rows: list[Measurement],
    hardware: str,
    points: list[dict[str, Any]],
    source: str,
    workers: int | None = None,
) -> list[list[float]]:
    """The table simulated at each point (a set of overrides), every run of every point
    in one pool, the longest first: a fit's Jacobian needs a table per parameter, and
    simulated one point after another, the longest run of each leaves the other workers
    idle until it ends."""
    from npusim.scenario import scenario_from_doc

    jobs: list[tuple[dict[str, Any], str]] = []
    costs: list[float] = []
    places: list[list[tuple[int, int]]] = []
    for overrides in points:
        runs, where = table_runs(rows, hardware, overrides)
        base = len(jobs)
        for doc, i in runs:
            src = f"{source} (row {i + 2})"
            scenario_from_doc(doc, src, Path.cwd())  # bad rows fail here, in the parent
            jobs.append((doc, src))
            costs.append(_cost(rows[i]))
        places.append([(base + j, k) for j, k in where])
    results = _run_jobs(jobs, costs, workers)
    return [[row_value(m, results[j][k]) for m, (j, k) in zip(rows, where, strict=True)]
            for where in places]


def _run_jobs(
    jobs: list[tuple[dict[str, Any], str]], cost: list[float], workers: int | None
) -> list[list[tuple[float, dict[str, Any]]]]:
    """Every job's latencies, in job order: here with one worker, else in a process pool."""
    n = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    if n <= 1:
        return [simulate_row(j) for j in jobs]
    # the longest runs first keeps every worker busy to the end (a stable sort: equal
    # runs of several points go in point order)
    order = sorted(range(len(jobs)), key=lambda i: -cost[i])
    with ProcessPoolExecutor(max_workers=min(n, len(jobs))) as pool:
        done = dict(zip(order, pool.map(simulate_row, [jobs[i] for i in order]), strict=True))
    return [done[i] for i in range(len(jobs))]


def _cost(m: Measurement) -> float:
    w = m.workload
    return w.get("bs", 1) * w.get("k", 1) * w.get("ep_world_size", 1) * w.get("h", 1)
