"""Which assumed preset values an op's time depends on most, found by perturbing them.

A scenario runs timing-only once as it is (reading which hardware keys the run uses,
npusim.sensitivity.reads), then once per assumed value of its preset that the run read,
with that value raised by STEP through `hardware_overrides`. An op's effect of a key is
t_perturbed / t_base - 1 (signed). The keys with a nonzero effect are ranked by |effect|;
the TOP_SPAN first of each op run again at the two ends of the key's declared plausible
range (the span). The perturbed runs are points of a sweep (npusim.sweep.run_points): in
parallel processes, resumable from their folder.

Not perturbed, each with its reason: a value the scenario overrides (no longer the
preset's assumption), a boolean or a name, a zero (no relative step exists, and the
presets' assumed zeros stand for a unit the chip lacks: range [0, 0]), a range of one
value (the value is pinned, not uncertain), and a value the preset's bounds refuse.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npusim.dotted import set_dotted
from npusim.errors import InputError
from npusim.fidelity.assumed import STEP, assumed_doc, stepped
from npusim.fidelity.ledger import Assumed

TOP_SPAN = 3  # keys per op also run at their range's two ends
DIGITS = 6  # significant digits an effect keeps (a record's bytes stay put)
READS_FILE = "reads.json"  # OUT/<it>: the base run's times and the keys it read


@dataclass(frozen=True)
class Probe:
    """An assumed value of the run's preset, and where its perturbed runs go."""

    key: str
    value: float
    unit: str
    lo: float
    hi: float

    def cast(self, x: float) -> float:
        """A value of the key's type (an integer key stays an integer)."""
        return int(round(x)) if isinstance(self.value, int) else float(x)


@dataclass(frozen=True)
class Sensitivity:
    """One scenario's sensitivity: per op, the ranked assumed values."""

    at: str  # the scenario's name
    base: dict[str, float]  # op -> latency_us of the unperturbed run
    ranked: dict[str, tuple[Assumed, ...]]  # op -> largest |effect| first
    skipped: tuple[tuple[str, str], ...] = ()  # (key, why not perturbed)
    probed: tuple[str, ...] = field(default=())  # the keys perturbed

    def as_doc(self, top: int | None = None) -> dict[str, Any]:
        """The JSON form (sensitivity.json, a shipped record's ops)."""
        return {
            "at": self.at,
            "step": STEP,
            "base_us": dict(sorted(self.base.items())),
            "ops": {op: [assumed_doc(a) for a in ranked[:top]]
                    for op, ranked in sorted(self.ranked.items())},
            "probed": sorted(self.probed),
            "skipped": [{"key": k, "why": why} for k, why in sorted(self.skipped)],
        }


def rounded(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def probes(hardware_ref: str, overridden: Sequence[str], read: frozenset[str]
           ) -> tuple[list[Probe], list[tuple[str, str]]]:
    """The assumed values of the preset `hardware_ref` (a name or a resolved path) that
    the run read, and the assumed values left out with why."""
    from npusim.hw.config import load_provenance

    out: list[Probe] = []
    left: list[tuple[str, str]] = []
    for key, (value, unit, prov) in load_provenance(hardware_ref).items():
        if prov is None or prov.kind != "assumed" or key not in read:
            continue
        lo, hi = prov.fields["range"]
        why = _unprobed(key, value, lo, hi, overridden)
        if why:
            left.append((key, why))
        else:
            out.append(Probe(key, value, unit, lo, hi))
    return out, left


def _unprobed(key: str, value: Any, lo: float, hi: float, overridden: Sequence[str]) -> str:
    """Why an assumed value is not perturbed ("": it is)."""
    if key in overridden:
        return "the scenario overrides it"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    if value == 0:
        return "zero: no relative step"
    if lo == hi:
        return "its range is one value"
    return ""


def _point(doc: Mapping[str, Any], name: str, key: str, value: Any, src: str, base: Path
           ) -> Any:
    """A sweep point: the scenario with one hardware key set; the loader's message (a
    str) when the preset's bounds refuse the value."""
    from npusim.scenario import scenario_from_doc
    from npusim.sweep import Point

    pdoc = copy.deepcopy(dict(doc))
    pdoc["name"] = name
    set_dotted(pdoc, f"hardware_overrides.{key}", value)
    try:
        scenario_from_doc(pdoc, f"{src} ({name})", base)
    except InputError as exc:
        return exc.message
    digest = hashlib.sha256(json.dumps(pdoc, sort_keys=True, default=str).encode()
                            ).hexdigest()[:16]
    return Point(name, {"key": key, "value": value}, pdoc, digest)


def timing_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario document, timing-only (payload bytes skipped: times are the same),
    unless it reads a case directory (whose data a run must move)."""
    tdoc = copy.deepcopy(dict(doc))
    data = tdoc.get("data")
    if not (isinstance(data, dict) and data.get("case_dir")):
        tdoc.setdefault("workload", {})["timing_only"] = True
    return tdoc


def _base(doc: dict[str, Any], src: str, base: Path, out: Path
          ) -> tuple[str, dict[str, float], frozenset[str]]:
    """The scenario's name, its ops' times and the keys the run read; kept in
    OUT/reads.json for a rerun of the same document."""
    from npusim.report.compare import UnusableInput, read_json
    from npusim.report.io import write_json_atomic
    from npusim.scenario import scenario_from_doc
    from npusim.sensitivity.reads import run_reading

    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
    path = out / READS_FILE
    try:
        kept = read_json(path) if path.is_file() else None
    except UnusableInput:
        kept = None
    if isinstance(kept, dict) and kept.get("digest") == digest:
        return kept["name"], kept["base_us"], frozenset(kept["read"])
    sc = scenario_from_doc(copy.deepcopy(doc), src, base)
    report, read = run_reading(sc)
    times = _times(report)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"digest": digest, "name": sc.name, "base_us": times,
                             "read": sorted(read)}, sort_keys=True)
    return sc.name, times, read


def _times(report: Mapping[str, Any]) -> dict[str, float]:
    return {o["op"]: o["latency_us"] for o in report["ops"]}


def _effect(t: float | None, t0: float) -> float | None:
    return None if t is None or t0 <= 0 else rounded(t / t0 - 1.0)


def sensitivity(doc: Mapping[str, Any], src: str, base: Path, out: Path,
                workers: int | None = 1, quiet: bool = True, title: str = "sensitivity"
                ) -> Sensitivity:
    """Perturb the scenario `doc` (read from `src`, relative paths from `base`) as the
    module says; the runs' folders go under `out` (a rerun resumes from them); `title`
    names the command in progress lines (its first word: the command that resumes)."""
    from npusim.scenario import scenario_from_doc
    from npusim.scenario.load import _resolve_hardware_ref

    tdoc = timing_doc(doc)
    name, t0, read = _base(tdoc, src, base, out)
    sc = scenario_from_doc(copy.deepcopy(tdoc), src, base)
    found, skipped = probes(_resolve_hardware_ref(sc.hardware_ref, base),
                            tuple(sc.hardware_overrides), read)
    pts, refused = [], []
    for p in found:
        pt = _point(tdoc, f"up-{p.key}", p.key, p.cast(stepped(p.value)), src, base)
        if isinstance(pt, str):
            refused.append((p.key, pt))
        else:
            pts.append(pt)
    reports, failed = _run(pts, out, src, base, (workers, quiet, title))
    refused += [(pt.values["key"], f"the run fails at {pt.values['value']}: {why}")
                for pt, why in failed]
    by_key = {p.key: p for p in found}
    effects: dict[str, dict[str, float]] = {op: {} for op in t0}
    for pt in pts:
        if pt.name not in reports:
            continue
        times = _times(reports[pt.name])
        for op, base_t in t0.items():
            e = _effect(times.get(op), base_t)
            if e:
                effects[op][pt.values["key"]] = e
    ranked = {op: sorted(es, key=lambda k, es=es: (-abs(es[k]), k)) for op, es in effects.items()}
    spans = _spans(tdoc, src, base, out, (workers, quiet, title), by_key, ranked, t0)
    result = {op: tuple(_assumed(by_key[k], effects[op][k], spans.get((k, op)), name)
                        for k in keys) for op, keys in ranked.items()}
    return Sensitivity(name, dict(t0), result, tuple(skipped + refused),
                       tuple(pt.values["key"] for pt in pts if pt.name in reports))


def _failure(exc: BaseException) -> str | None:
    """Why a perturbed run failed in the model (a kernel's buffer overflows at the new
    value, the run deadlocks), in one line; None for any other exception."""
    from npusim.errors import BlockedError, KernelError

    if isinstance(exc, BlockedError):
        return " ".join(exc.summary.split())
    if isinstance(exc, KernelError):
        return " ".join(str(exc).split())
    return None


def _run(pts: list[Any], out: Path, src: str, base: Path, how: tuple[int | None, bool, str]
         ) -> tuple[dict[str, Any], list[tuple[Any, str]]]:
    """The points' reports by name, and the points whose run failed with why: all in
    parallel, and after a failure the rest one at a time (a sweep stops at its first
    failed point; its finished ones stay done)."""
    from npusim.sweep import run_points

    workers, quiet, title = how
    if not pts:
        return {}, []
    try:
        return run_points(pts, out, src, str(base), workers, quiet=quiet, title=title), []
    except Exception as exc:
        if _failure(exc) is None:
            raise
    reports: dict[str, Any] = {}
    failed: list[tuple[Any, str]] = []
    for pt in pts:
        try:
            reports.update(run_points([pt], out, src, str(base), 1, quiet=quiet, title=title))
        except Exception as exc:
            why = _failure(exc)
            if why is None:
                raise
            failed.append((pt, why))
    return reports, failed


def _assumed(p: Probe, effect: float, span: tuple[float, float] | None, at: str) -> Assumed:
    return Assumed(p.key, p.value, p.unit, p.lo, p.hi, effect, span, at)


def _spans(tdoc: dict[str, Any], src: str, base: Path, out: Path,
           how: tuple[int | None, bool, str], by_key: Mapping[str, Probe],
           ranked: Mapping[str, list[str]], t0: Mapping[str, float]
           ) -> dict[tuple[str, str], tuple[float, float]]:
    """(key, op) -> (effect at the range's low end, at its high end), for each op's
    TOP_SPAN keys; an end the preset's bounds refuse leaves the key without a span."""

    keys = sorted({k for ks in ranked.values() for k in ks[:TOP_SPAN]})
    ends: dict[tuple[str, str], Any] = {}
    for k in keys:
        p = by_key[k]
        for end, v in (("lo", p.lo), ("hi", p.hi)):
            v = p.cast(v)
            ends[(k, end)] = None if v == p.value else _point(tdoc, f"{end}-{k}", k, v, src,
                                                                base)
    pts = [pt for pt in ends.values() if pt is not None and not isinstance(pt, str)]
    reports, _ = _run(pts, out, src, base, how)
    spans: dict[tuple[str, str], tuple[float, float]] = {}
    for op, ks in ranked.items():
        for k in ks[:TOP_SPAN]:
            pair = [_end_effect(ends[(k, end)], reports, op, t0[op]) for end in ("lo", "hi")]
            if None not in pair:
                spans[(k, op)] = (pair[0], pair[1])
    return spans


def _end_effect(pt: Any, reports: Mapping[str, Any], op: str, t0: float) -> float | None:
    """The effect at one end of a range: 0 where the end is the value itself, None where
    the bounds refused it or its run failed."""
    if pt is None:
        return 0.0
    if isinstance(pt, str) or pt.name not in reports:
        return None
    return _effect(_times(reports[pt.name]).get(op), t0)
