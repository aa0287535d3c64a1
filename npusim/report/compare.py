"""Two runs side by side: per op its latency and each phase's end and duration, with
deltas and a verdict against a tolerance.

Either side may be a full report (npusim.report/1) or a compact baseline
(npusim.baseline/1, what `npusim check` stores): both reduce to a Profile.

Verdict (docs/report.md): the judged metrics are each op's latency and each phase's
duration (op-level end - start). B is *slower* on a metric when B - A > tolerance x A,
*faster* when A - B > tolerance x A. B regressed when any judged metric is slower, or a
phase is on one side only (a check never passes on missing data; a number that is not
finite, or an op on one side only, makes the input unusable). Phase ends are shown but
not judged (they follow from the durations before them).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npusim.errors import InputError, excerpt

REPORT_SCHEMA = "npusim.report/1"
BASELINE_SCHEMA = "npusim.baseline/1"
_EPS = 1e-9  # us; reports are rounded to 1e-4 us, so this only absorbs float noise
INT_DIGITS = 30  # the longest integer a report holds has 20 digits (int64); str() stops at 4300


class UnusableInput(InputError):
    """A file compare or check cannot use: missing, not JSON, wrong schema, other ops."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(source, None, message)


@dataclass
class OpProfile:
    op: str
    latency_us: float
    phases: dict[str, tuple[float, float]]  # name -> (start_us, end_us), kernel order


@dataclass
class Profile:
    source: str
    schema: str
    scenario: str | None
    ops: list[OpProfile]
    scenario_sha256: str | None = None
    hardware_sha256: str | None = None


def digest(obj: Any) -> str:
    """sha256 of canonical JSON: tells whether a scenario or preset changed."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def scenario_digest(scenario: Mapping[str, Any]) -> str:
    """The resolved scenario without where it was read from and how fast it was run."""
    sc = {k: v for k, v in scenario.items() if k != "source"}
    wl = dict(sc.get("workload", {}))
    wl.pop("timing_only", None)
    sc["workload"] = wl
    return digest(sc)


def baseline_of(report: Mapping[str, Any]) -> dict[str, Any]:
    """The compact baseline of a report: op latencies and op-level phase spans."""
    prof = profile_of(report, "report")
    return {
        "schema": BASELINE_SCHEMA,
        "scenario": prof.scenario,
        "scenario_sha256": prof.scenario_sha256,
        "hardware": report.get("hardware", {}).get("name"),
        "hardware_sha256": prof.hardware_sha256,
        "ops": [{"op": o.op, "latency_us": o.latency_us,
                 "phases": {n: {"start_us": s, "end_us": e} for n, (s, e) in o.phases.items()}}
                for o in prof.ops],
    }


def _num(x: Any, source: str, what: str) -> float:
    """A time of a report: a finite number >= 0 (times count from the op's start)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise UnusableInput(source, f"{what} is {'missing' if x is None else 'not a number'}"
                            "; allowed: a finite number >= 0")
    try:
        usable = math.isfinite(x) and x >= 0
    except OverflowError:  # an int past float range, from a document not read by read_json
        usable = False
    if not usable:
        shown = excerpt(x) if isinstance(x, int) else x  # str() refuses 4300 digits
        raise UnusableInput(source, f"{what} is {shown}; allowed: a finite number >= 0 "
                            "(a check never passes on non-finite or negative times)")
    return float(x)


def _span(ph: Any, source: str, what: str) -> tuple[float, float]:
    """A phase's (start_us, end_us): both times, the end not before the start."""
    if not isinstance(ph, Mapping):
        raise UnusableInput(source, f"{what} is not an object")
    start = _num(ph.get("start_us"), source, f"{what}.start_us")
    end = _num(ph.get("end_us"), source, f"{what}.end_us")
    if end < start:
        raise UnusableInput(source, f"{what} ends at {end} us before it starts at {start} us; "
                            "allowed: end_us >= start_us")
    return start, end


def profile_of(doc: Any, source: str) -> Profile:
    """A report or baseline document -> Profile (UnusableInput naming `source` if not)."""
    if not isinstance(doc, Mapping):
        raise UnusableInput(source, "not an npusim report (the top level is not an object)")
    schema = doc.get("schema")
    if schema not in (REPORT_SCHEMA, BASELINE_SCHEMA):
        raise UnusableInput(source, f"not an npusim report or baseline (schema {schema!r}; "
                            f"expected {REPORT_SCHEMA!r} or {BASELINE_SCHEMA!r})")
    ops_doc = doc.get("ops")
    if not isinstance(ops_doc, list) or not ops_doc:
        raise UnusableInput(source, "has no ops; allowed: a non-empty list of ops (a check "
                            "never passes on missing data)")
    ops = []
    for i, op in enumerate(ops_doc):
        if not isinstance(op, Mapping) or not isinstance(op.get("op"), str):
            raise UnusableInput(source, f"ops[{i}] has no op name")
        latency = _num(op.get("latency_us"), source, f"ops[{i}].latency_us")
        if not isinstance(op.get("phases"), Mapping):
            raise UnusableInput(source, f"ops[{i}] has no phases object")
        phases = {str(name): _span(ph, source, f"ops[{i}].phases.{name}")
                  for name, ph in op["phases"].items()}
        ops.append(OpProfile(op["op"], latency, phases))
    if schema == REPORT_SCHEMA:
        sc = doc.get("scenario") if isinstance(doc.get("scenario"), Mapping) else {}
        hw = doc.get("hardware") if isinstance(doc.get("hardware"), Mapping) else {}
        try:
            digests = (scenario_digest(sc) if sc else None, digest(hw) if hw else None)
        except (RecursionError, ValueError, TypeError):
            raise UnusableInput(source, "its scenario or hardware is not an npusim report's "
                                "(nested too deep, or holds non-finite numbers)") from None
        return Profile(source, schema, sc.get("name"), ops, *digests)
    return Profile(source, schema, doc.get("scenario"), ops, doc.get("scenario_sha256"),
                   doc.get("hardware_sha256"))


def load_profile(path: str | Path) -> Profile:
    """Read a report or baseline file; every failure is an UnusableInput naming it."""
    return profile_of(read_json(path), str(path))


def read_json(path: str | Path) -> Any:
    """The document of a JSON file npusim wrote (a report, a baseline), read by every
    command that reads one; a file that is not one is an UnusableInput naming it, never
    a traceback: a FIFO (not opened), a folder, bad UTF-8, not JSON, an integer too long
    to be a figure (Python's int() refuses 4300 digits, float() overflows), nesting
    deeper than Python's parser can follow."""
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO would block the read
        raise UnusableInput(str(p), "is a FIFO, device or socket, not a report file")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UnusableInput(str(p), "no such file") from None
    except IsADirectoryError:
        raise UnusableInput(str(p), "is a directory, not a report") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnusableInput(str(p), f"cannot read: {getattr(exc, 'strerror', None) or exc}"
                            ) from None
    try:
        return json.loads(text, parse_int=lambda digits: _integer(digits, str(p)))
    except json.JSONDecodeError as exc:
        raise UnusableInput(str(p), f"not JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise UnusableInput(str(p), "not a report: its JSON is nested deeper than Python "
                            "can read") from None


def _integer(digits: str, source: str) -> int:
    if len(digits.lstrip("-")) > INT_DIGITS:
        raise UnusableInput(source, f"holds an integer of {len(digits.lstrip('-'))} digits; "
                            f"allowed: at most {INT_DIGITS} (no report figure is longer)")
    return int(digits)


@dataclass
class Row:
    """One compared metric. status: "ok", "slower", "faster" (beyond tolerance, judged
    metrics only), "info" (phase ends), "only in A" / "only in B"."""

    op_index: int
    op: str
    metric: str  # "latency", "<phase> end", "<phase> duration"
    a: float | None
    b: float | None
    judged: bool
    status: str

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def rel(self) -> float | None:
        d = self.delta
        if d is None or self.a is None:
            return None
        return d / self.a if self.a else (0.0 if d == 0 else None)


@dataclass
class Comparison:
    a: Profile
    b: Profile
    tolerance: float
    rows: list[Row] = field(default_factory=list)

    @property
    def slower(self) -> list[Row]:
        return [r for r in self.rows if r.status == "slower"]

    @property
    def faster(self) -> list[Row]:
        return [r for r in self.rows if r.status == "faster"]

    @property
    def missing(self) -> list[Row]:
        """The durations of phases that are on one side only."""
        return [r for r in self.rows if r.status in ("only in A", "only in B")
                and r.metric.endswith(" duration")]

    @property
    def regressed(self) -> bool:
        return bool(self.slower or self.missing)

    @property
    def changed(self) -> bool:
        """Beyond tolerance in either direction, or phases that appear on one side only."""
        return any(r.status in ("slower", "faster", "only in A", "only in B")
                   for r in self.rows)

    def worst(self) -> Row | None:
        """The judged metric with the largest relative increase (regressed or not)."""
        judged = [r for r in self.rows if r.judged and r.delta is not None]
        return max(judged, key=lambda r: (r.rel if r.rel is not None else float("inf"),
                                          -r.op_index), default=None)

    def largest(self) -> Row | None:
        """The judged metric that moved most, in either direction."""
        return _largest(self.rows)


def _largest(rows: list[Row]) -> Row | None:
    judged = [r for r in rows if r.judged and r.rel is not None]
    return max(judged, key=lambda r: (abs(r.rel or 0.0), -r.op_index), default=None)


def _status(a: float, b: float, tol: float) -> str:
    if b - a > tol * a + _EPS:
        return "slower"
    if a - b > tol * a + _EPS:
        return "faster"
    return "ok"


def _dur(span: tuple[float, float]) -> float:
    """end - start at the reports' precision (0.1 ns), free of float noise."""
    return round(span[1] - span[0], 4)


def compare_profiles(a: Profile, b: Profile, tolerance: float) -> Comparison:
    """Compare B against A. Ops must match one to one (same count, same names, same
    order); otherwise UnusableInput naming B."""
    names_a = [o.op for o in a.ops]
    names_b = [o.op for o in b.ops]
    if names_a != names_b:
        raise UnusableInput(b.source, f"has ops {names_b}, but {a.source} has {names_a}: "
                            "not comparable")
    cmp = Comparison(a, b, tolerance)
    for i, (oa, ob) in enumerate(zip(a.ops, b.ops, strict=True)):
        cmp.rows.append(Row(i, oa.op, "latency", oa.latency_us, ob.latency_us, True,
                            _status(oa.latency_us, ob.latency_us, tolerance)))
        names = list(oa.phases) + [n for n in ob.phases if n not in oa.phases]
        for n in names:
            pa, pb = oa.phases.get(n), ob.phases.get(n)
            if pa is None or pb is None:
                side = "only in B" if pa is None else "only in A"
                for m, k in (("end", 1), ("duration", None)):
                    va = None if pa is None else (_dur(pa) if k is None else pa[k])
                    vb = None if pb is None else (_dur(pb) if k is None else pb[k])
                    cmp.rows.append(Row(i, oa.op, f"{n} {m}", va, vb, False, side))
                continue
            cmp.rows.append(Row(i, oa.op, f"{n} end", pa[1], pb[1], False, "info"))
            da, db = _dur(pa), _dur(pb)
            cmp.rows.append(Row(i, oa.op, f"{n} duration", da, db, True,
                                _status(da, db, tolerance)))
    return cmp


def _cell(x: float | None, fmt: str) -> str:
    """x in fmt, or '-' as wide (a phase on one side only keeps the columns)."""
    if x is not None:
        return format(x, fmt)
    return "-".rjust(int(fmt.lstrip("+").split(".")[0]))


def format_comparison(cmp: Comparison) -> str:
    """The side-by-side table and a verdict line."""
    a, b = cmp.a, cmp.b
    lines = [f"A: {a.source}" + (f"  (scenario {a.scenario})" if a.scenario else ""),
             f"B: {b.source}" + (f"  (scenario {b.scenario})" if b.scenario else "")]
    if a.hardware_sha256 and b.hardware_sha256 and a.hardware_sha256 != b.hardware_sha256:
        lines.append("note: the hardware configurations differ")
    width = max([len("metric")] + [len(r.metric) for r in cmp.rows])
    current = None
    for r in cmp.rows:
        if r.op_index != current:
            current = r.op_index
            lines += ["", f"{r.op} (op {r.op_index})",
                      f"  {'metric':<{width}}{'A us':>12}{'B us':>12}{'delta us':>12}"
                      f"{'delta':>10}"]
        rel = r.rel
        rel_text = f"{100 * rel:+.1f}%" if rel is not None else "-"
        flag = "" if r.status in ("ok", "info") else f"  {r.status}"
        delta = r.delta
        lines.append(f"  {r.metric:<{width}}{_cell(r.a, '12.3f')}{_cell(r.b, '12.3f')}"
                     f"{_cell(delta, '+12.3f')}{rel_text:>10}{flag}")
    lines += ["", verdict_line(cmp)]
    return "\n".join(lines) + "\n"


def verdict_line(cmp: Comparison) -> str:
    tol = f"{100 * cmp.tolerance:g}%"
    if cmp.regressed:
        worst = cmp.worst() if cmp.slower else None
        tail = ""
        if worst is not None and worst.rel is not None:
            tail = f"; worst: {worst.op} {worst.metric} {100 * worst.rel:+.1f}%"
        if cmp.missing:
            tail += "; phases on one side only: " + ", ".join(
                f"{r.op} {r.metric.removesuffix(' duration')} ({r.status})"
                for r in cmp.missing)
        return (f"verdict: REGRESSED: {len(cmp.slower)} metric(s) of B slower than A by more "
                f"than {tol}{tail}")
    if cmp.faster:
        return (f"verdict: within tolerance ({tol}); {len(cmp.faster)} metric(s) faster by "
                f"more than {tol}")
    return f"verdict: within tolerance ({tol})"
