"""`npusim advise`: which kernel family, variant and quantisation is fastest for a shape.

A shape is a scenario's generic keys (preset, W, BS, H, K, experts per rank, dtype,
routing); its family and family options are ignored. Every registered family that
declares variants (`Family.variants`) and reads the MoE shape is a candidate once per
variant and per allowed (dispatch, combine) quantisation it declares
(`Family.dispatch_quants`, `combine_quants`), so a new family joins by declaring them.
A family that does not read the MoE shape (`uses_moe_shape` False, e.g. kv_offload) has
its own options as its shape: a scenario of it is the shape (every option kept) and its
variants are the candidates, compared at that shape. Each candidate is validated
as a scenario: one that does not fit is listed with the loader's own one-line reason,
the text `npusim lint` prints. The rest run timing-only as the points of a sweep (the
same processes or Ray, resumable, progress on stderr), and are ranked by their total
latency.

A difference smaller than the preset's validation error is a tie, not a win: the model
cannot tell them apart. That error is the MAPE of `npusim validate` on the preset's
calibration table (configs/targets/<preset>.csv), computed by each advice: the table's
rows run as points of its sweep (resumed like the others), so the figure is the model's
as it is now, never one copied into a file. A preset without a table, one whose values
the point overrides (`hardware_overrides`, also along `--over`) and one given as a file
are uncalibrated and use UNCALIBRATED_TIE.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from npusim.dotted import set_dotted
from npusim.errors import InputError
from npusim.kernels import registry
from npusim.kernels.family import QUANTS, Family
from npusim.paths import resolved

UNCALIBRATED_TIE = 0.10  # the calibration tables' acceptance bound: no finer claim holds
# the shape keys an advice reads of a scenario's workload; the family and its options
# are what it chooses
SHAPE_KEYS = ("op", "bs", "h", "k", "ep_world_size", "experts_per_rank", "dtype",
              "shared_experts", "shared_expert_ranks", "routing")
DEFAULT_SHAPE: dict[str, Any] = {  # the CANN sample's published shape
    "name": "advise", "hardware": "ascend950",
    "workload": {"op": "dispatch_combine", "bs": 8, "h": 7168, "k": 8, "ep_world_size": 8,
                 "experts_per_rank": 4},
}
SHORT_AXES = {k: f"workload.{k}" for k in ("bs", "h", "k", "ep_world_size",
                                           "experts_per_rank", "dtype")}
MAX_CANDIDATES = 512  # points of one advice (candidates x axis values)


@dataclass(frozen=True)
class Candidate:
    """One family / variant / quantisation to try."""

    family: str  # the family's name
    variant: str
    dispatch_quant: str
    combine_quant: str
    options: Mapping[str, Any] = field(default_factory=dict)
    kernel: str = ""  # workload.kernel when it is not the name: a user's file or module

    @property
    def label(self) -> str:
        v = f"/{self.variant}" if self.variant else ""
        return f"{self.family}{v}"

    @property
    def quant(self) -> str:
        return f"{self.dispatch_quant}/{self.combine_quant}"

    @property
    def key(self) -> str:
        """A folder-safe name for the candidate's sweep point."""
        return "-".join(x for x in (self.family, self.variant, self.dispatch_quant,
                                    self.combine_quant) if x)


def own_family(doc: Mapping[str, Any]) -> str | None:
    """The built-in family a shape scenario names if its options are its shape (it does not
    read the MoE shape and declares variants), else None."""
    w = doc.get("workload")
    name = w.get("kernel") if isinstance(w, Mapping) else None
    if not isinstance(name, str) or name not in registry.names():
        return None
    fam = registry.get(name)
    return name if fam.variants and not fam.uses_moe_shape else None


def own_keys(family: str) -> tuple[str, ...]:
    """The workload keys a --set may name in a shape of `family` (own_family): its op and
    its options (the kernel is the shape's)."""
    return ("op", *(o.name for o in registry.get(family).options))


def _families(refs: Sequence[str]) -> list[tuple[str, Family]]:
    """(workload.kernel, family) of each --family: a built-in name, a user's .py file
    (relative to the working directory) or module:attr; by default every built-in family
    with variants that reads the MoE shape."""
    known = registry.names()
    if not refs:
        return [(n, registry.get(n)) for n in known
                if registry.get(n).variants and registry.get(n).uses_moe_shape]
    out = []
    for ref in refs:
        offered = [n for n in known if registry.get(n).variants]
        allowed = f"allowed: {', '.join(offered)}, a .py file or module:attr"
        if ref in known or not (registry.is_file_ref(ref) or registry.is_module_ref(ref)):
            if ref not in offered:
                raise InputError("command line", "--family", f"{ref!r} offers no variants "
                                 f"to rank; {allowed}" if ref in known else
                                 f"unknown family {ref!r}; {allowed}")
            out.append((ref, registry.get(ref)))
            continue
        kernel = (str(resolved(Path(ref), "command line", "--family"))
                  if registry.is_file_ref(ref) else ref)
        try:
            fam = registry.get(kernel, Path.cwd())
        except registry.FamilyError as exc:
            raise InputError("command line", "--family", str(exc)) from None
        if not fam.variants:
            raise InputError("command line", "--family", f"{ref}: family {fam.name!r} declares "
                             "no variants (Family.variants) to rank")
        out.append((kernel, fam))
    return out


def candidates(dispatch_quants: Sequence[str], combine_quants: Sequence[str],
               families: Sequence[str] = ()) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Every declared candidate for the allowed quantisations (of `families` only, if
    given), and the families with no candidate at all for them (name, reason)."""
    out: list[Candidate] = []
    missing: list[tuple[str, str]] = []
    for kernel, fam in _families(families):
        name = fam.name
        mine = [(dq, cq) for dq in dispatch_quants if dq in fam.dispatch_quants
                for cq in combine_quants if cq in fam.combine_quants]
        if not mine:
            missing.append((name, "no variant with dispatch quantisation "
                            f"{'/'.join(dispatch_quants)} and combine quantisation "
                            f"{'/'.join(combine_quants)} (it offers dispatch "
                            f"{'/'.join(fam.dispatch_quants)}, combine "
                            f"{'/'.join(fam.combine_quants)})"))
        for v in fam.variants:
            for dq, cq in mine:
                opts = {**v.options, **fam.dispatch_quants[dq], **fam.combine_quants[cq]}
                out.append(Candidate(name, v.name, dq, cq, opts,
                                     "" if kernel == name else kernel))
    return out, missing


def quant_list(text: str | None, option: str) -> tuple[str, ...]:
    """--dispatch-quant none,int8 -> ("none", "int8"); default ("none",)."""
    if text is None:
        return ("none",)
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",")))
    bad = [n for n in names if n not in QUANTS]
    if not names or bad:
        raise InputError("command line", option, f"{text!r}; allowed: a comma-separated "
                         f"list of {', '.join(QUANTS)}")
    return names


def axis_of(spec: str) -> tuple[str, list[Any]]:
    """--over bs=8,32,128 -> ("workload.bs", [8, 32, 128]) (values read as YAML)."""
    key, eq, text = spec.partition("=")
    key = key.strip()
    key = SHORT_AXES.get(key, key)
    values = [yaml.safe_load(v) for v in text.split(",") if v.strip()] if eq else []
    if not key or any(not p for p in key.split(".")) or not values:
        raise InputError("command line", "--over", f"{spec!r}; allowed: AXIS=v1,v2,... with "
                         f"AXIS a dotted scenario key or one of {', '.join(SHORT_AXES)} "
                         "(e.g. bs=8,32,128)")
    if len(set(map(repr, values))) != len(values):
        raise InputError("command line", "--over", f"{spec!r}: a value is given twice")
    return key, values


def shape_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The generic part of a scenario document: the shape an advice ranks kernels for (a
    family whose options are its shape keeps them all, own_family)."""
    out = {k: copy.deepcopy(v) for k, v in doc.items()
           if k in ("name", "hardware", "hardware_overrides", "run")}
    w = doc.get("workload")
    w = w if isinstance(w, Mapping) else {}
    keep = w if own_family(doc) else SHAPE_KEYS
    out["workload"] = {k: copy.deepcopy(w[k]) for k in keep if k in w}
    out.setdefault("name", "advise")
    return out


@dataclass
class Plan:
    """The validated points of an advice and the candidates that cannot run."""

    points: list[Any]  # sweep.Point, one per runnable (candidate, axis value)
    refused: list[tuple[Candidate | None, str, Any, str]]  # (cand, family, axis value, why)
    candidate_of: dict[str, Candidate]  # point name -> candidate
    axis: str | None
    values: list[Any]
    preset: str = ""  # the hardware preset's name, from the first runnable point
    # per axis value (repr): its points' preset, and why it is not the validated one ("")
    settings: dict[str, tuple[str, str]] = field(default_factory=dict)


def plan(shape: dict[str, Any], src: str, base: Path, cands: Sequence[Candidate],
         missing: Sequence[tuple[str, str]], axis: str | None = None,
         values: Sequence[Any] = (None,)) -> Plan:
    """One scenario per (candidate, axis value), validated; a misfit is refused with its
    message."""
    from npusim.scenario import scenario_from_doc
    from npusim.sweep import Point

    if len(cands) * len(values) > MAX_CANDIDATES:
        raise InputError("command line", "--over", f"{len(cands)} candidates x {len(values)} "
                         f"values is over {MAX_CANDIDATES} runs; narrow the quantisations "
                         "or the axis")
    points, refused, cand_of, preset = [], [], {}, ""
    settings: dict[str, tuple[str, str]] = {}
    refused += [(None, fam, v, why) for v in values for fam, why in missing]
    for value in values:
        for c in cands:
            doc = copy.deepcopy(shape)
            if axis is not None:
                try:
                    set_dotted(doc, axis, value)
                except ValueError:
                    raise InputError("command line", f"--over {axis}",
                                     "names no scenario key") from None
            w = doc["workload"]
            w["kernel"] = c.kernel or c.family
            w.update(c.options)
            w["timing_only"] = True
            doc["name"] = point_name(c.key, axis, value)
            try:
                sc = scenario_from_doc(doc, f"{src} ({c.label} {c.quant})", base)
            except InputError as exc:
                refused.append((c, c.family, value, _reason(exc)))
                continue
            preset = preset or sc.hardware.name
            settings.setdefault(repr(value), (sc.hardware.name, _off_preset(sc, doc)))
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()
                                    ).hexdigest()[:16]
            vals = {"family": c.family, "variant": c.variant, "quant": c.quant}
            if axis is not None:
                vals[axis] = value
            points.append(Point(doc["name"], vals, doc, digest))
            cand_of[doc["name"]] = c
    return Plan(points, refused, cand_of, axis, list(values), preset, settings)


def point_name(key: str, axis: str | None, value: Any) -> str:
    """The candidate's point name at an axis value: the value itself where that makes a
    plain file name, else a digest of it (a preset file's path, a text with a space), so
    no point is refused for a name the advice made up."""
    from npusim.scenario.load import folder_name_ok

    name = key if axis is None else f"{key}-{axis.rsplit('.', 1)[-1]}{value}"
    if folder_name_ok(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{key[:100]}-{digest}" if folder_name_ok(key[:100]) else f"point-{digest}"


def _off_preset(sc: Any, doc: Mapping[str, Any]) -> str:
    """Why a point's hardware is not the shipped preset its table validates ("": it is)."""
    from npusim.hw.config import preset_names

    if doc.get("hardware_overrides"):
        return OVERRIDDEN
    return "" if sc.hardware_ref in preset_names() else OWN_FILE


def _reason(exc: InputError) -> str:
    """The loader's one line without the candidate's own scenario name in front."""
    key = f"{exc.key}: " if exc.key else ""
    return f"{key}{exc.message}"


# ---------------------------------------------------------------- calibration status

@dataclass(frozen=True)
class Calibration:
    """How far a preset's timing is known: its table's MAPE and the shapes it covers."""

    preset: str
    mape: float | None  # None: uncalibrated
    ranges: Mapping[str, Mapping[str, tuple[float, float]]]  # family -> key -> (lo, hi)
    why_not: str = ""  # what makes a calibrated preset uncalibrated here
    basis: str = ""  # where the MAPE comes from

    @property
    def tie(self) -> float:
        return self.mape if self.mape is not None else UNCALIBRATED_TIE

    @property
    def status(self) -> str:
        if self.mape is None:
            return f"uncalibrated ({self.why_not})" if self.why_not else "uncalibrated"
        return f"calibrated (MAPE {self.mape:.1%})"

    def as_doc(self) -> dict[str, Any]:
        return {"status": self.status, "mape": self.mape, "tie": self.tie, "basis": self.basis}

    def outside(self, family: str, workload: Mapping[str, Any]) -> str | None:
        """Why a run is outside the table's shapes for its family (None: inside)."""
        if self.mape is None:
            return None
        got = self.ranges.get(family)
        if got is None:
            return f"{family} has no row in {self.preset}'s table"
        for key, (lo, hi) in got.items():
            v = workload.get(key)
            if isinstance(v, (int, float)) and not lo <= v <= hi:
                lo_, hi_ = _num(lo), _num(hi)
                span = lo_ if lo == hi else f"{lo_}..{hi_}"
                return f"{key} {v} is outside the table's {span} for {family}"
        return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


RANGE_KEYS = ("bs", "h", "k", "ep_world_size")
OVERRIDDEN = "hardware_overrides: not the preset its table validates"
OWN_FILE = "a preset file: not the shipped preset its table validates"
NOTHING_RAN = "no candidate runs at this value"  # its hardware is unknown: no table vouches


def table_of(preset: str) -> Path | None:
    """The preset's calibration table (configs/targets/<preset>.csv), None if it has none."""
    from npusim.shipped import targets_dir

    table = targets_dir() / f"{preset}.csv"
    return table if table.is_file() else None


def calibration_of(preset: str, off_preset: str = "", mape: float | None = None,
                   basis: str = "") -> Calibration:
    """The preset's calibration: its table gives the shapes, `mape` is validate's error on
    it computed by this advice (validation_of, mape_of). Hardware that is not the shipped
    preset (off_preset says why: hardware_overrides, a file) is uncalibrated."""
    from npusim.calibrate import read_table

    if off_preset:
        return Calibration(preset, None, {}, off_preset)
    table = table_of(preset)
    if table is None or mape is None:
        return Calibration(preset, None, {})
    ranges: dict[str, dict[str, tuple[float, float]]] = {}
    for m in read_table(table):
        fam = m.workload.get("kernel", registry.DEFAULT)
        r = ranges.setdefault(fam, {})
        for key in RANGE_KEYS:
            v = m.workload.get(key)
            if isinstance(v, (int, float)):
                lo, hi = r.get(key, (v, v))
                r[key] = (min(lo, v), max(hi, v))
    return Calibration(preset, mape, ranges, basis=basis)


@dataclass
class Validation:
    """A preset's table as sweep points: `npusim validate`'s runs, timing only."""

    preset: str
    table: Path
    rows: list[Any]  # calibrate.Measurement
    points: list[Any]  # sweep.Point, one per distinct run
    where: list[tuple[str, int]]  # per row: its point's name, its op's place in the run


def validation_of(preset: str) -> Validation | None:
    """The runs that give the preset's MAPE now (None: the preset has no table)."""
    from npusim.calibrate import read_table
    from npusim.calibrate.simulate import table_runs
    from npusim.sweep import Point

    table = table_of(preset)
    if table is None:
        return None
    rows = read_table(table)
    runs, where = table_runs(rows, preset, {})
    points = []
    for doc, first in runs:
        doc["name"] = f"validate-{preset}-{rows[first].name}"
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()
                                ).hexdigest()[:16]
        points.append(Point(doc["name"], {"row": rows[first].name}, doc, digest))
    return Validation(preset, table, rows, points,
                      [(points[j].name, k) for j, k in where])


def validations(p: Plan) -> dict[str, Validation]:
    """The table runs of every preset the plan's points use without overriding it."""
    presets = dict.fromkeys(name for name, off in p.settings.values() if not off)
    found = {name: validation_of(name) for name in presets}
    return {name: v for name, v in found.items() if v is not None}


def mape_of(v: Validation, reports: Mapping[str, Mapping[str, Any]]) -> float:
    """validate's MAPE: each row's op duration in its run's report against the row."""
    from npusim.calibrate import compare
    from npusim.calibrate.simulate import row_value

    ops = [reports[name]["ops"][k] for name, k in v.where]
    simulated = [row_value(m, (float(op["duration_us"]), op.get("family_fields", {})))
                 for m, op in zip(v.rows, ops, strict=True)]
    return compare(v.rows, simulated).mape()


def calibrations(p: Plan, found: Mapping[str, Validation],
                 reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Calibration]:
    """Per axis value (repr) the calibration of its points' preset, as they run it."""
    computed = {name: (mape_of(v, reports), f"MAPE of the {len(v.rows)} rows of "
                       f"{v.table.name} (npusim validate), simulated by this advice")
                for name, v in found.items()}
    out = {}
    for value in p.values:
        preset, off = p.settings.get(repr(value), (p.preset, NOTHING_RAN))
        mape, basis = computed.get(preset, (None, ""))
        out[repr(value)] = calibration_of(preset, off, mape, basis)
    return out


# ---------------------------------------------------------------- ranking

@dataclass(frozen=True)
class Entry:
    """One candidate's result at one point."""

    candidate: Candidate
    ops: Mapping[str, float]  # op -> latency us
    total_us: float
    critical: str  # "op.phase" of the op that takes longest
    phases: Mapping[str, Mapping[str, tuple[float, float]]]  # op -> phase -> (start, end) us
    wire_bytes: int
    outside: str | None


def entry_of(c: Candidate, report: Mapping[str, Any], cal: Calibration) -> Entry:
    ops = {o["op"]: float(o["latency_us"]) for o in report["ops"]}
    longest = max(report["ops"], key=lambda o: o["latency_us"])
    crit = (longest.get("critical") or {}).get("phase") or "-"
    phases = {o["op"]: {n: (p["start_us"], p["end_us"]) for n, p in o["phases"].items()}
              for o in report["ops"]}
    wire = sum(int(o.get("bytes_sent_total", 0)) for o in report["ops"])
    return Entry(c, ops, round(sum(ops.values()), 4), f"{longest['op']}.{crit}", phases, wire,
                 cal.outside(c.family, report["scenario"]["workload"]))


@dataclass
class Ranking:
    """Candidates fastest first; `tied` counts those within the tie of the winner.
    `unvouched`: the preset has a table but no row of it covers any of them."""

    entries: list[Entry]
    tie: float
    calibration: Calibration
    unvouched: bool = False

    @property
    def tied(self) -> int:
        if not self.entries:
            return 0
        best = self.entries[0].total_us
        return sum(1 for e in self.entries if e.total_us - best <= self.tie * best)

    def why(self) -> str:
        """One line: why the winner wins, or that the first ones tie."""
        if not self.entries:
            return "nothing could run this shape"
        first = self.entries[0]
        if len(self.entries) == 1:
            return f"{_name(first)} is the only candidate that runs this shape"
        if self.tied > 1:
            names = ", ".join(_name(e) for e in self.entries[:self.tied])
            what = ("assumed error (no row of its table covers them: uncalibrated)"
                    if self.unvouched
                    else "validation error" if self.calibration.mape is not None
                    else "assumed error (uncalibrated)")
            return f"tie: {names} are within {self.tie:.1%} of each other, the preset's {what}"
        second = self.entries[1]
        gain = second.total_us - first.total_us
        op, delta = max(((op, second.ops.get(op, 0.0) - first.ops.get(op, 0.0))
                         for op in first.ops), key=lambda x: x[1])
        ph_a, ph_b = _durations(first, op), _durations(second, op)
        ph = max(ph_b, key=lambda n: ph_b[n] - ph_a.get(n, 0.0)) if ph_b else "-"
        where = (f"{ph} {ph_a[ph]:.1f} vs {ph_b[ph]:.1f} us" if ph in ph_a
                 else f"the runner-up's {ph} ({ph_b.get(ph, 0.0):.1f} us)")
        return (f"{_name(first)} wins by {gain:.1f} us ({gain / second.total_us:.0%}) over "
                f"{_name(second)}: most of it in {op} ({delta:+.1f} us), {where}")


def _durations(e: Entry, op: str) -> dict[str, float]:
    return {n: round(end - start, 4) for n, (start, end) in e.phases.get(op, {}).items()}


def _name(e: Entry) -> str:
    return f"{e.candidate.label} ({e.candidate.quant})"


def rank(entries: Sequence[Entry], cal: Calibration) -> Ranking:
    """Fastest first. Where no row of the preset's table covers any candidate, its MAPE
    says nothing of them: the tie is then UNCALIBRATED_TIE, as for an uncalibrated one."""
    ordered = sorted(entries, key=lambda e: (e.total_us, e.candidate.label, e.candidate.quant))
    unvouched = cal.mape is not None and bool(entries) and all(e.outside for e in entries)
    tie = UNCALIBRATED_TIE if unvouched else cal.tie
    return Ranking(list(ordered), tie, cal, unvouched)


def winners(rankings: Sequence[tuple[Any, Ranking]]) -> list[tuple[Any, str]]:
    """Per axis value the winner's name, or 'tie: a, b' within the tie."""
    out = []
    for value, r in rankings:
        if not r.entries:
            out.append((value, "-"))
        elif r.tied > 1:  # the same tie whichever of them is a hair ahead
            out.append((value, "tie: " + ", ".join(sorted(_name(e) for e in r.entries[:r.tied]))))
        else:
            out.append((value, _name(r.entries[0])))
    return out


def crossovers(rankings: Sequence[tuple[Any, Ranking]], axis: str, preset: str) -> list[str]:
    """Where the winner changes along the axis, one line each."""
    short = axis.removeprefix("workload.")
    short = short.upper() if short in ("bs", "h", "k") else short
    won = winners(rankings)
    lines = []
    for (_, before), (value, now) in zip(won, won[1:], strict=False):
        if now == before:
            continue
        if now.startswith("tie") or before.startswith("tie"):
            lines.append(f"from {short} {value}, {now} (before: {before}) on {preset}")
        else:
            lines.append(f"from {short} {value}, {now} beats {before} on {preset}")
    return lines


def run_plan(p: Plan, out: Path, src: str, base: Path, workers: int | None, backend: str,
             quiet: bool, found: Mapping[str, Validation] | None = None
             ) -> dict[str, dict[str, Any]]:
    """Run the plan's points, and the table runs of its presets, as a sweep under `out`
    (resumable); point name -> report."""
    from npusim.sweep import run_points

    extra = [pt for v in (found or {}).values() for pt in v.points]
    return run_points(p.points + extra, out, src, str(base), workers, backend, quiet,
                      title=f"advise {p.points[0].doc['name'] if p.points else ''}")


def rankings(p: Plan, reports: Mapping[str, Mapping[str, Any]],
             cals: Mapping[str, Calibration]) -> list[tuple[Any, Ranking]]:
    """Per axis value its ranking, against that value's calibration."""
    by_value: dict[Any, list[Entry]] = {repr(v): [] for v in p.values}
    for pt in p.points:
        v = pt.values.get(p.axis) if p.axis else None
        by_value[repr(v)].append(entry_of(p.candidate_of[pt.name], reports[pt.name],
                                          cals[repr(v)]))
    return [(v, rank(by_value[repr(v)], cals[repr(v)])) for v in p.values]


SCHEMA = "npusim.advice/1"


def rests_on(c: Candidate, preset: str) -> list[str]:
    """The preset keys that set the candidate's variant apart, each with its value and its
    provenance in a few words (assumed and its range, calibrated, sourced)."""
    from npusim.hw.config import load_provenance, preset_names

    fam = registry.get(c.kernel or c.family, Path.cwd())
    keys = next((v.rests_on for v in fam.variants if v.name == c.variant), ())
    if not keys or preset not in preset_names():
        return list(keys)
    known = load_provenance(preset)
    return [_provenance_words(k, known.get(k)) for k in keys]


def _provenance_words(key: str, entry: tuple[Any, str, Any] | None) -> str:
    if entry is None:
        return f"{key} (not in the preset)"
    value, unit, prov = entry
    kind = prov.kind if prov is not None else "plain"
    if kind == "assumed":
        lo, hi = prov.fields["range"]
        kind = f"assumed, plausible {_num(float(lo))}-{_num(float(hi))}"
    elif kind == "calibrated":
        kind = f"calibrated, {Path(prov.fields['fit']).name}"
    elif kind == "sourced":
        kind = f"sourced, confidence {prov.fields['conf']}"
    return f"{key} {_num(float(value))} {unit} ({kind})"


def document(shape: Mapping[str, Any], p: Plan,
             ranked: Sequence[tuple[Any, Ranking]]) -> dict[str, Any]:
    """The advice as plain data (`--json`, and what the text and figures are drawn from)."""
    def row(e: Entry, tie: bool, cal: Calibration) -> dict[str, Any]:
        c = e.candidate
        return {"family": c.family, "variant": c.variant, "dispatch_quant": c.dispatch_quant,
                "combine_quant": c.combine_quant, "ops_us": dict(e.ops),
                "total_us": e.total_us, "critical": e.critical, "wire_bytes": e.wire_bytes,
                "calibration": cal.status, "outside_calibration": e.outside, "tie": tie,
                "rests_on": rests_on(c, cal.preset),
                "phases_us": {op: {n: list(span) for n, span in ph.items()}
                              for op, ph in e.phases.items()}}

    points = []
    for value, r in ranked:
        points.append({"value": value, "why": r.why(), "calibration": r.calibration.as_doc(),
                       "ranking": [row(e, i < r.tied and r.tied > 1, r.calibration)
                                   for i, e in enumerate(r.entries)]})
    cals = list({json.dumps(pt["calibration"], sort_keys=True): pt["calibration"]
                 for pt in points}.values())
    cal = cals[0] if len(cals) == 1 else {"status": f"varies with {p.axis}", "mape": None,
                                          "tie": None, "basis": ""}
    refused = [{"family": fam, "variant": c.variant if c else None,
                "quant": c.quant if c else None, "value": value, "reason": why}
               for c, fam, value, why in p.refused]
    return {"schema": SCHEMA, "preset": p.preset, "calibration": cal,
            "shape": dict(shape.get("workload", {})), "axis": p.axis, "points": points,
            "crossovers": crossovers(ranked, p.axis, p.preset) if p.axis else [],
            "refused": refused}
