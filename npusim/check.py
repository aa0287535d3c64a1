"""Latency regression check: run scenarios, compare each with its committed baseline.

A baseline (reports/baselines/<scenario name>.json, schema npusim.baseline/1) holds only
what the check judges: each op's latency and op-level phase spans, plus digests of the
scenario and hardware preset so a failure can say whether an input changed. Scenarios
without a case directory run timing-only (no payload numerics): the times are identical
(tests/sim/test_timing_only.py) and the check is several times faster.
"""

from __future__ import annotations

import dataclasses
import glob
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim.errors import InputError, NpusimError
from npusim.report.compare import (
    Comparison,
    UnusableInput,
    baseline_of,
    compare_profiles,
    load_profile,
    profile_of,
)
from npusim.report.io import write_json_atomic

EXIT_OK, EXIT_FAIL, EXIT_INPUT = 0, 1, 2


@dataclass
class Outcome:
    """One scenario's result: status is ok, changed (faster), REGRESSED, missing baseline,
    FAILED (the simulation failed), unusable (a file is broken) or updated."""

    path: str
    name: str
    status: str
    text: str
    wall_s: float = 0.0


def expand(patterns: Sequence[str]) -> list[str]:
    """Paths and glob patterns -> sorted unique paths (a pattern matching nothing is kept,
    so loading it reports the missing file)."""
    out: dict[str, None] = {}
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p]
        for h in hits:
            out.setdefault(h, None)
    return list(out)


def simulate_report(path: str) -> tuple[dict[str, Any], float]:
    """Run one scenario (timing-only unless it reads a case directory) -> its report."""
    from npusim.report.build import jsonable
    from npusim.run_report import report_with_fidelity
    from npusim.scenario import load_scenario
    from npusim.sim import simulate

    t0 = time.perf_counter()
    scenario = load_scenario(path)
    original = scenario.to_dict()
    if scenario.data.case_dir is None and not scenario.workload.timing_only:
        scenario = dataclasses.replace(
            scenario, workload=dataclasses.replace(scenario.workload, timing_only=True))
    report = report_with_fidelity(simulate(scenario))
    report["scenario"] = jsonable(original)
    return report, time.perf_counter() - t0


def _ops_text(cmp: Comparison | None, report: dict[str, Any]) -> str:
    parts = []
    for i, op in enumerate(report["ops"]):
        text = f"{op['op']} {op['latency_us']:.3f} us"
        if cmp is not None:
            row = next(r for r in cmp.rows if r.op_index == i and r.metric == "latency")
            text += f" ({100 * row.rel:+.1f}%)" if row.rel is not None else ""
        parts.append(text)
    return ", ".join(parts)


def check_one(path: str, baselines: Path, tolerance: float, update: bool) -> Outcome:
    """Simulate one scenario and judge it against (or, with update, write) its baseline."""
    try:
        report, wall = simulate_report(path)
    except InputError as exc:
        return Outcome(path, Path(path).stem, "unusable", " ".join(str(exc).split()))
    except NpusimError as exc:
        return Outcome(path, Path(path).stem, "FAILED", " ".join(str(exc).split())[:300])
    name = report["scenario"]["name"]
    base_path = baselines / f"{name}.json"
    cmp = None
    note = ""
    if base_path.exists():
        try:
            base = load_profile(base_path)
            cmp = compare_profiles(base, profile_of(report, path), tolerance)
        except UnusableInput as exc:
            if not update:
                return Outcome(path, name, "unusable", " ".join(str(exc).split()), wall)
        else:
            fresh = profile_of(report, path)
            changed = [w for w, x, y in (
                ("scenario", base.scenario_sha256, fresh.scenario_sha256),
                ("hardware preset", base.hardware_sha256, fresh.hardware_sha256)) if x != y]
            if changed:
                note = f" ({' and '.join(changed)} changed since the baseline)"
    if update:
        try:
            write_json_atomic(base_path, baseline_of(report), inline_leaves=True)
        except InputError as exc:  # not a regular file
            return Outcome(path, name, "unusable", " ".join(str(exc).split()), wall)
        was = "new" if cmp is None else _status(cmp)
        return Outcome(path, name, "updated", f"{_ops_text(cmp, report)}; was {was}", wall)
    if cmp is None:
        return Outcome(path, name, "missing baseline",
                       f"{_ops_text(None, report)}; no {base_path} (run with --update)", wall)
    text = _ops_text(cmp, report)
    row = cmp.worst() if cmp.slower else cmp.largest()
    if cmp.changed and row is not None and row.rel is not None:
        text += f"; {'worst' if cmp.slower else 'most'} {row.op} {row.metric} " \
            f"{100 * row.rel:+.1f}%"
    if cmp.missing:  # a phase on one side only: never a pass
        text += "; phases on one side only: " + ", ".join(
            f"{r.op} {r.metric.removesuffix(' duration')} ({r.status})" for r in cmp.missing)
    return Outcome(path, name, _status(cmp), text + note, wall)


def _status(cmp: Comparison) -> str:
    if cmp.regressed:
        return "REGRESSED"
    return "changed (faster)" if cmp.changed else "ok"  # a missing phase: REGRESSED


def _job(args: tuple[str, str, float, bool]) -> Outcome:
    path, baselines, tolerance, update = args
    return check_one(path, Path(baselines), tolerance, update)


def run_check(paths: Sequence[str], baselines: Path, tolerance: float, update: bool = False,
              strict: bool = False, workers: int = 1,
              emit: Callable[[str], None] = print) -> int:
    """Check every scenario, one line each, in order; returns the exit code."""
    if not paths:
        emit("npusim check: no scenarios given or matched")
        return EXIT_INPUT
    jobs = [(p, str(baselines), tolerance, update) for p in paths]
    width = max(len(Path(p).stem) for p in paths)
    outcomes: list[Outcome] = []

    def show(o: Outcome) -> None:
        outcomes.append(o)
        emit(f"{o.status:<17}{o.name:<{width + 2}}{o.text}  [{o.wall_s:.1f} s]")

    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            for o in pool.map(_job, jobs):
                show(o)
    else:
        for j in jobs:
            show(_job(j))
    names = [o.name for o in outcomes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        emit(f"npusim check: scenario names must be unique (baselines are named by them): {dup}")
        return EXIT_INPUT
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    emit(f"{len(outcomes)} scenario(s): " + ", ".join(f"{n} {s}" for s, n in counts.items())
         + f" (tolerance {100 * tolerance:g}%, baselines in {baselines})")
    statuses = set(counts)
    if "unusable" in statuses:
        return EXIT_INPUT
    if statuses & {"REGRESSED", "missing baseline", "FAILED"}:
        return EXIT_FAIL
    if strict and "changed (faster)" in statuses:
        return EXIT_FAIL
    return EXIT_OK
