"""Sweeps: a base scenario plus axes, run as a cartesian product in parallel processes
(or as Ray tasks on a cluster).

A sweep file:

    name: bs_sweep
    description: BS 1..256 and the die egress    # optional, listed by npusim scenarios
    base: ../scenarios/dispatch_bs8_mxfp8.yaml    # relative to the sweep file
    axes:
      workload.bs: [1, 8, 64, 256]                 # a list of values
      hardware_overrides.fabric.egress_gbps: {start: 100, stop: 400, step: 100}  # a range
      quant:                                       # a zipped axis: each value sets keys
        - {workload.dispatch_quant: none, workload.combine_quant: none}
        - {workload.dispatch_quant: mxfp8, workload.combine_quant: int8}

Every point is a full scenario (validated like a scenario file; errors name the sweep
file and the axis key). A sweep of more than --max-points points (default 10,000) is
refused before any is built. A point's relative paths resolve against the base
scenario's folder, as `npusim run` of the base resolves them. Each finished point leaves
OUT/points/<point>/report.json (its folder appears whole); a rerun skips points whose
report is one `npusim compare` accepts, for the same scenario, so an interrupted sweep
resumes, and runs again a point whose report is not.
OUT/results.csv has one row per point and op: the axis values, latency and phase spans.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import itertools
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim.dotted import set_dotted
from npusim.errors import InputError
from npusim.paths import resolved
from npusim.report.compare import (
    REPORT_SCHEMA,
    OpProfile,
    Profile,
    UnusableInput,
    load_profile,
    read_json,
)
from npusim.report.io import blocked_list_in
from npusim.values import is_finite

SWEEP_KEYS = ("name", "description", "base", "axes")
REQUIRED_KEYS = ("name", "base", "axes")


@dataclass(frozen=True)
class Point:
    name: str
    values: dict[str, Any]  # axis key -> value
    doc: dict[str, Any]  # the point's scenario document
    digest: str


MAX_POINTS = 10_000  # npusim sweep --max-points: a sweep's points are built in memory


def _range(src: str, key: str, spec: Any) -> tuple[Any, Any, Any, int] | None:
    """A range axis's (start, stop, step, number of points), counted without building it;
    None if spec is not a range."""
    if not (
        isinstance(spec, dict)
        and set(spec) <= {"start", "stop", "step"}
        and {"start", "stop"} <= set(spec)
    ):
        return None
    start, stop, step = spec["start"], spec["stop"], spec.get("step", 1)
    nums = (start, stop, step)
    if (
        not all(is_finite(v) for v in nums)
        or step <= 0
        or stop < start
    ):
        raise InputError(
            src, f"axes.{key}", "a range needs finite numbers start <= stop and step > 0"
        )
    span = (stop - start) / step  # float: may be inf for a huge range
    count = int(span + 1e-9) + 1 if math.isfinite(span) and span < 2**62 else 2**62
    return start, stop, step, count


def _axis_count(src: str, key: str, spec: Any) -> int:
    """How many values an axis has; InputError if it is not an axis."""
    if isinstance(spec, list):
        if not spec:
            raise InputError(src, f"axes.{key}", "empty list; give at least one value")
        return len(spec)
    rng = _range(src, key, spec)
    if rng is None:
        raise InputError(
            src, f"axes.{key}", "allowed: a list of values or {start: A, stop: B, step: C}"
        )
    return rng[3]


def _axis_values(src: str, key: str, spec: Any) -> list[Any]:
    rng = _range(src, key, spec)
    if rng is None:
        return spec
    start, stop, step, count = rng
    vals = [start + i * step for i in range(count)]
    return [int(v) if all(isinstance(x, int) for x in (start, stop, step)) else v for v in vals]


def _read_sweep(p: Path) -> dict[str, Any]:
    """A sweep file's mapping, its keys checked (the axes' values are checked later)."""
    from npusim.hw.config import read_yaml_mapping

    src = str(p)
    doc = read_yaml_mapping(p)
    for k in doc:
        if k not in SWEEP_KEYS:
            raise InputError(src, str(k), f"unknown key; allowed: {', '.join(SWEEP_KEYS)}")
    for k in REQUIRED_KEYS:
        if k not in doc:
            raise InputError(src, k, "missing")
    name, axes = doc["name"], doc["axes"]
    if not isinstance(name, str) or not name:
        raise InputError(src, "name", "must be a non-empty string")
    if not isinstance(doc.get("description", ""), str):
        raise InputError(src, "description", "must be a string")
    if not isinstance(axes, dict) or not axes:
        raise InputError(src, "axes", "must map dotted scenario keys to values")
    return doc


def _set_axes(pdoc: dict[str, Any], keys: list[str], combo: tuple, src: str) -> dict[str, Any]:
    """Set one combination of axis values on a point's document; returns each axis's
    label (a zipped axis: its `label`, else its values joined by '/')."""
    labels = {}
    for k, v in zip(keys, combo, strict=True):
        # a mapping sets several keys together (a zipped axis named freely)
        sets = {kk: vv for kk, vv in v.items() if kk != "label"} if isinstance(v, dict) else {k: v}
        labels[k] = (
            (v.get("label") or "/".join(str(x) for x in sets.values()))
            if isinstance(v, dict)
            else v
        )
        for kk, vv in sets.items():
            try:
                set_dotted(pdoc, kk, vv)
            except ValueError:
                raise InputError(src, f"axes.{k}", f"{kk!r} names no scenario key") from None
    return labels


def load_sweep(
    path: str | Path, max_points: int = MAX_POINTS, import_kernels: bool = True
) -> tuple[str, list[Point]]:
    """Expand a sweep file into validated points; InputError, before any point is built,
    if there are more than max_points. import_kernels=False (`npusim lint`) validates the
    points without importing a user's kernel file."""
    name, points, _ = _expand(path, max_points, import_kernels)
    return name, points


def _expand(
    path: str | Path, max_points: int, import_kernels: bool
) -> tuple[str, list[Point], Path]:
    """The sweep's name, its points, and the folder their relative paths resolve against:
    the base scenario's own, as `npusim run` and `npusim lint` of the base resolve them
    (a point is the base with axis values set, not a file of the sweep's folder)."""
    from npusim.scenario import scenario_from_doc
    from npusim.scenario.yaml import read_scenario_file

    p = Path(path)
    src = str(p)
    doc = _read_sweep(p)
    name, axes = doc["name"], doc["axes"]
    base_path = resolved(p.parent / str(doc["base"]), src, "base")
    if not base_path.is_file():
        raise InputError(src, "base", f"scenario file {base_path} not found")
    base, _, base_dir = read_scenario_file(base_path)
    keys = list(axes)
    total = math.prod(_axis_count(src, k, axes[k]) for k in keys)
    if total > max_points:
        raise InputError(
            src,
            "axes",
            f"{total} points (the product of the axes' sizes); "
            f"allowed: at most {max_points} (npusim sweep --max-points)",
        )
    values = [_axis_values(src, k, axes[k]) for k in keys]
    points = []
    for i, combo in enumerate(itertools.product(*values)):
        pdoc = copy.deepcopy(base)
        pname = f"{name}-{i:04d}"
        pdoc["name"] = pname
        labels = _set_axes(pdoc, keys, combo, src)
        try:
            scenario_from_doc(
                pdoc, f"{src} (point {pname})", base_dir, import_kernels=import_kernels
            )
        except InputError as exc:
            raise InputError(exc.source, exc.key, exc.message) from None
        digest = hashlib.sha256(json.dumps(pdoc, sort_keys=True).encode()).hexdigest()[:16]
        points.append(Point(pname, labels, pdoc, digest))
    return name, points, base_dir


def _run_point(args: tuple[dict[str, Any], str, str]) -> dict[str, Any]:
    """Worker (a local process or a Ray task): simulate one point, return its report.
    The driver writes the files, so workers need no shared file system."""
    from npusim.run_report import report_with_fidelity
    from npusim.scenario import scenario_from_doc
    from npusim.sim import simulate

    doc, src, base_dir = args
    sc = scenario_from_doc(doc, src, Path(base_dir))
    return report_with_fidelity(simulate(sc))


def _point_profile(report_path: Path) -> Profile:
    """A point's report read as `npusim compare` reads it; UnusableInput unless compare
    would accept it as a report (a baseline is not a point's report)."""
    prof = load_profile(report_path)
    if prof.schema != REPORT_SCHEMA:
        raise UnusableInput(str(report_path), f"schema {prof.schema!r}; allowed: "
                            f"{REPORT_SCHEMA!r}")
    return prof


def _state(report_path: Path, digest: str, name: str) -> str:
    """A point's folder: "done" (its report is one compare accepts, for this scenario),
    "new" (no report, or one for another scenario) or "broken: <why>" (any other
    report, another point's included: the point runs again, so results.csv never takes a
    row from it)."""
    marker = report_path.with_name("point.json")
    if not (report_path.is_file() and marker.is_file()):
        return "new"
    try:
        if read_json(marker).get("digest") != digest:
            return "new"
    except (UnusableInput, AttributeError):
        return "broken: its point.json is unreadable"
    try:
        prof = _point_profile(report_path)
    except UnusableInput as exc:
        return f"broken: its report.json is not a whole report: {exc.message}"
    if prof.scenario != name:
        return f"broken: its report.json is not a whole report: it is point {prof.scenario}'s"
    return "done"


BACKENDS = ("processes", "ray")


def run_sweep(
    path: str | Path,
    out: Path,
    workers: int | None = None,
    backend: str = "processes",
    quiet: bool = False,
    max_points: int = MAX_POINTS,
) -> Path:
    """Run every point not already done; write results.csv; return its path.

    backend "processes": a local process pool. "ray": Ray tasks on the cluster named by
    RAY_ADDRESS, or on a local Ray instance (`npusim[ray]`). Unless quiet, stderr gets a
    line per finished point and a status line (points done of total) while they run."""
    if backend not in BACKENDS:
        raise InputError(
            "command line", "--backend", f"{backend!r}; allowed: {', '.join(BACKENDS)}"
        )
    src = str(path)
    name, points, base_dir = _expand(path, max_points, True)
    try:
        run_points(points, out, src, str(base_dir), workers, backend, quiet,
                   title=f"sweep {name}")
    except KeyboardInterrupt as exc:
        from npusim.outputs import Interrupted

        raise Interrupted(f"{exc}; results.csv not updated") from None
    from npusim.report.io import write_text_atomic

    return write_text_atomic(out / "results.csv", _csv(points, out))


def run_points(
    points: list[Point],
    out: Path,
    src: str,
    base_dir: str,
    workers: int | None = None,
    backend: str = "processes",
    quiet: bool = False,
    title: str = "sweep",
) -> dict[str, dict[str, Any]]:
    """Run the points not already done under out/points/<point>/ (the resumable core of
    a sweep, also `npusim advise`'s); returns every point's report by point name."""
    if backend not in BACKENDS:
        raise InputError(
            "command line", "--backend", f"{backend!r}; allowed: {', '.join(BACKENDS)}"
        )
    from npusim.progress import Progress

    todo = []
    shown = None if quiet else Progress()
    for pt in points:
        rp = out / "points" / pt.name / "report.json"
        state = _state(rp, pt.digest, pt.name)
        if state.startswith("broken"):  # said even when quiet: results change
            text = f"npusim: note: sweep point {pt.name}: {state[8:]}; running it again"
            shown.note(text) if shown else print(text, file=sys.stderr)
        if state != "done":
            todo.append((pt, rp))
    n = len(points)
    if shown:
        shown.note(f"{title} ({src}): {n} point(s), {n - len(todo)} already done")
    counter = [n - len(todo)]
    jobs = [((pt.doc, f"{src} (point {pt.name})", base_dir), pt, rp) for pt, rp in todo]

    def status() -> str:
        return f"{title}: {counter[0]}/{n} points done, {shown.elapsed():.0f} s"

    try:
        if jobs:
            runner = _run_ray if backend == "ray" else _run_processes
            results = runner(jobs, workers, lambda: shown.update(status) if shown else None)
            try:
                for report, pt, rp in results:
                    _record(report, pt, rp, counter, n, shown)
            finally:
                results.close()  # stops the workers now if a point failed or Ctrl-C came
                if shown:
                    shown.clear()
    except KeyboardInterrupt:
        from npusim.outputs import Interrupted

        raise Interrupted(
            f"{counter[0]} of {n} point folders complete in {out / 'points'} "
            f"(npusim {title.split()[0]} resumes from them)"
        ) from None
    return {
        pt.name: read_json(out / "points" / pt.name / "report.json") for pt in points
    }


def _record(
    report: dict[str, Any], pt: Point, rp: Path, counter: list[int], n: int, shown: Any
) -> None:
    from npusim.outputs import OutputSet
    from npusim.report.io import BLOCKED_FILE, write_json_atomic

    with OutputSet() as outs:  # the point's folder is whole or absent, an old list gone
        stage = outs.folder(rp.parent, (BLOCKED_FILE,))
        write_json_atomic(stage / rp.name, report)
        write_json_atomic(stage / "point.json", {"digest": pt.digest, "values": pt.values})
        outs.commit()
    counter[0] += 1
    if shown:
        shown.note(f"  [{counter[0]}/{n}] {pt.name} {pt.values}")


WAIT_S = 1.0  # the status line's chance to redraw while points run


def _worker_start() -> None:
    """A worker leaves Ctrl-C to the parent, which stops the pool: a worker that took it
    too would end (or report) mid-point and could leave the pool's queues locked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_processes(jobs: list, workers: int | None, waiting: Callable[[], None]):
    # never more processes than points: a fork start launches every worker at once
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_start)
    try:
        futures = {pool.submit(_run_point, args): (pt, rp) for args, pt, rp in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=WAIT_S, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: futures[f][0].name):
                pt, rp = futures[fut]
                # an error in a point stops the sweep; finished points stay for a resume
                with blocked_list_in(rp.parent):
                    report = fut.result()
                yield report, pt, rp
            waiting()
    except BaseException:  # an error, Ctrl-C, or the caller closing the generator
        _stop(pool)
        raise
    pool.shutdown()


STOP_S = 5.0  # how long a terminated worker may take to exit before it is killed


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the pool now: cancel the points not started and terminate the workers, as
    `shutdown` would wait for every point still running or queued."""
    from npusim.outputs import interrupts_held

    with interrupts_held():  # a second Ctrl-C must not leave workers running
        procs = list((pool._processes or {}).values())  # no public way in Python < 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(STOP_S)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _run_ray(jobs: list, workers: int | None, waiting: Callable[[], None]):
    try:
        import ray
    except ModuleNotFoundError:
        raise InputError(
            "command line", "--backend", "ray needs the Ray package: pip install 'npusim[ray]'"
        ) from None
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": "ERROR",
        }
        if not address and workers:
            kwargs["num_cpus"] = workers
        ray.init(address=address or None, **kwargs)
        started = True
    try:
        task = ray.remote(_run_point)
        pending = {task.remote(args): (pt, rp) for args, pt, rp in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
            for ref in ready:
                pt, rp = pending.pop(ref)
                with blocked_list_in(rp.parent):
                    report = ray.get(ref)
                yield report, pt, rp
            waiting()
    finally:
        if started:
            ray.shutdown()


def _csv(points: list[Point], out: Path) -> str:
    keys = list(points[0].values) if points else []
    rows: list[tuple[Point, OpProfile]] = []
    phases: list[str] = []
    for pt in points:
        for op in _point_profile(out / "points" / pt.name / "report.json").ops:
            phases += [ph for ph in op.phases if ph not in phases]
            rows.append((pt, op))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "point",
            *keys,
            "op",
            "latency_us",
            *[f"{ph}_{e}" for ph in phases for e in ("start_us", "end_us")],
        ]
    )
    for pt, op in rows:
        spans: list[float | str] = []
        for ph in phases:
            spans += list(op.phases[ph]) if ph in op.phases else ["", ""]
        w.writerow([pt.name, *[pt.values[k] for k in keys], op.op, op.latency_us, *spans])
    return buf.getvalue()
