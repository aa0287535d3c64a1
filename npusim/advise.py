"""`npusim advise`: which kernel family, variant and quantisation runs a shape fastest,
as far as the model can tell.

A shape is a scenario's generic keys (preset, W, BS, H, K, experts per rank, dtype,
routing); its family and family options are ignored. Every registered family that reads
the MoE shape is a candidate once per variant (`Family.variants`) and per allowed
(dispatch, combine) quantisation it declares (`Family.dispatch_quants`, `combine_quants`),
so a new family joins by declaring them. A family that does not read the MoE shape
(`uses_moe_shape` False, e.g. kv_offload) has its own options as its shape: a scenario
of it is the shape (every option kept) and its variants are the candidates. Each
candidate is validated as a scenario: one that does not fit is listed with the loader's
own one-line reason, the text `npusim lint` prints. The rest run timing-only as the
points of a sweep (the same processes or Ray, resumable, progress on stderr), and are
ranked by their total latency.

Each candidate carries the band of its own ledger (npusim.advise_rank): a difference
within the larger band of two candidates is a tie, and the advice names the measurement
that would break it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from npusim.advise_rank import (
    Entry,
    Ranking,
    band_of,
    crossovers,
    rank,
    shape_words,
)
from npusim.dotted import set_dotted
from npusim.errors import InputError
from npusim.fidelity.run import run_ledgers
from npusim.kernels import registry
from npusim.kernels.exchange import QUANTS
from npusim.kernels.family import Family
from npusim.paths import resolved

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
        """'int8/none'; '' for a variant refused whatever its quantisation."""
        return f"{self.dispatch_quant}/{self.combine_quant}" if self.dispatch_quant else ""

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
    that reads the MoE shape."""
    known = registry.names()
    if not refs:
        return [(n, registry.get(n)) for n in known if registry.get(n).uses_moe_shape]
    return [_family(ref, known) for ref in refs]


def _family(ref: str, known: Sequence[str]) -> tuple[str, Family]:
    """One --family, or a one-line refusal naming what is allowed."""
    offered = [n for n in known if registry.get(n).variants]
    allowed = f"allowed: {', '.join(offered)}, a .py file or module:attr"
    if ref in known or not (registry.is_file_ref(ref) or registry.is_module_ref(ref)):
        if ref not in known:
            raise InputError("command line", "--family", f"unknown family {ref!r}; {allowed}")
        if ref not in offered:
            raise InputError("command line", "--family", f"{ref!r} is not a MoE dispatch / "
                             f"combine family and declares no variants to rank; {allowed}")
        return ref, registry.get(ref)
    kernel = (str(resolved(Path(ref), "command line", "--family"))
              if registry.is_file_ref(ref) else ref)
    try:
        fam = registry.get(kernel, Path.cwd())
    except registry.FamilyError as exc:
        raise InputError("command line", "--family", str(exc)) from None
    if not fam.variants:
        raise InputError("command line", "--family", f"{ref}: family {fam.name!r} declares "
                         "no variants (Family.variants) to rank")
    return kernel, fam


@dataclass(frozen=True)
class Missing:
    """A family with no candidate for the allowed quantisations: why, and one of its own
    candidates to ask the shape first (a family that cannot run the shape at all is
    refused for that, the more basic reason)."""

    family: str
    why: str
    probe: Candidate | None = None


def candidates(dispatch_quants: Sequence[str], combine_quants: Sequence[str],
               families: Sequence[str] = ()) -> tuple[list[Candidate], list[Missing]]:
    """Every declared candidate for the allowed quantisations (of `families` only, if
    given), and the families with no candidate at all for them."""
    out: list[Candidate] = []
    missing: list[Missing] = []
    for kernel, fam in _families(families):
        dqs, cqs = _quants(fam)
        mine = [(dq, cq) for dq in dispatch_quants if dq in dqs
                for cq in combine_quants if cq in cqs]
        if not fam.variants or not mine:
            missing.append(_missing(kernel, fam, dispatch_quants, combine_quants))
        for v in fam.variants:
            out += [_candidate(kernel, fam, v, dq, cq) for dq, cq in mine]
    return out, missing


def _quants(fam: Family) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The quantisations a family offers on the dispatch and the combine side (an
    ExchangeFamily's declarations; none for any other family)."""
    return getattr(fam, "dispatch_quants", {}), getattr(fam, "combine_quants", {})


def _candidate(kernel: str, fam: Family, v: Any, dq: str, cq: str) -> Candidate:
    dqs, cqs = _quants(fam)
    opts = {**v.options, **dqs[dq], **cqs[cq]}
    return Candidate(fam.name, v.name, dq, cq, opts, "" if kernel == fam.name else kernel)


def _missing(kernel: str, fam: Family, dispatch_quants: Sequence[str],
             combine_quants: Sequence[str]) -> Missing:
    if not fam.variants:
        return Missing(fam.name, "declares no variants (Family.variants) to rank")
    dqs, cqs = _quants(fam)
    why = (f"no variant with dispatch quantisation {'/'.join(dispatch_quants)} and combine "
           f"quantisation {'/'.join(combine_quants)} (it offers dispatch "
           f"{'/'.join(dqs)}, combine {'/'.join(cqs)})")
    probe = (_candidate(kernel, fam, fam.variants[0], next(iter(dqs)), next(iter(cqs)))
             if dqs and cqs else None)
    return Missing(fam.name, why, probe)


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
    # per axis value (repr): its points' preset
    settings: dict[str, str] = field(default_factory=dict)


def plan(shape: dict[str, Any], src: str, base: Path, cands: Sequence[Candidate],
         missing: Sequence[Missing], axis: str | None = None,
         values: Sequence[Any] = (None,)) -> Plan:
    """One scenario per (candidate, axis value), validated; a misfit is refused with its
    message, once for the family when all its candidates are refused for the same one."""
    from npusim.sweep import Point

    if len(cands) * len(values) > MAX_CANDIDATES:
        raise InputError("command line", "--over", f"{len(cands)} candidates x {len(values)} "
                         f"values is over {MAX_CANDIDATES} runs; narrow the quantisations "
                         "or the axis")
    points, refused, cand_of, preset = [], [], {}, ""
    settings: dict[str, str] = {}
    for value in values:
        now = [(None, m.family, value, _missing_reason(m, shape, src, base, axis, value))
               for m in missing]
        mine: list[tuple[Candidate | None, str, Any, str]] = []
        for c in cands:
            doc = _point_doc(shape, c, axis, value)
            sc = _validated(doc, c, src, base)
            if isinstance(sc, str):
                mine.append((c, c.family, value, sc))
                continue
            preset = preset or sc.hardware.name
            settings.setdefault(repr(value), sc.hardware.name)
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()
                                    ).hexdigest()[:16]
            vals = {"family": c.family, "variant": c.variant, "quant": c.quant}
            if axis is not None:
                vals[axis] = value
            points.append(Point(doc["name"], vals, doc, digest))
            cand_of[doc["name"]] = c
        now += _by_family(mine, cands)
        refused += sorted(now, key=lambda r: r[1])  # by family, as the registry lists them
    return Plan(points, refused, cand_of, axis, list(values), preset, settings)


def _point_doc(shape: Mapping[str, Any], c: Candidate, axis: str | None,
               value: Any) -> dict[str, Any]:
    """The candidate's scenario at an axis value, timing only."""
    doc = copy.deepcopy(dict(shape))
    if axis is not None:
        try:
            set_dotted(doc, axis, value)
        except ValueError:
            raise InputError("command line", f"--over {axis}", "names no scenario key") from None
    w = doc["workload"]
    w["kernel"] = c.kernel or c.family
    w.update(c.options)
    w["timing_only"] = True
    doc["name"] = point_name(c.key, axis, value)
    return doc


def _validated(doc: dict[str, Any], c: Candidate, src: str, base: Path) -> Any:
    """The scenario, or the loader's one line when it does not fit."""
    from npusim.scenario import scenario_from_doc

    try:
        return scenario_from_doc(doc, f"{src} ({c.label} {c.quant})", base)
    except InputError as exc:
        return _reason(exc)


def _missing_reason(m: Missing, shape: Mapping[str, Any], src: str, base: Path,
                    axis: str | None, value: Any) -> str:
    """Why a family has no candidate: the shape's own refusal first, else the quantisation."""
    if m.probe is None:
        return m.why
    got = _validated(_point_doc(shape, m.probe, axis, value), m.probe, src, base)
    return got if isinstance(got, str) else m.why


def _by_family(refused: list[tuple[Candidate | None, str, Any, str]],
               cands: Sequence[Candidate]) -> list[tuple[Candidate | None, str, Any, str]]:
    """One refusal for a family, or for a variant, all of whose candidates give the same
    reason (the quantisation is then not what refuses it)."""
    out: list[tuple[Candidate | None, str, Any, str]] = []
    for fam in dict.fromkeys(f for _, f, _, _ in refused):
        mine = [r for r in refused if r[1] == fam]
        if _all_alike(mine, [c for c in cands if c.family == fam]):
            out.append((None, fam, mine[0][2], mine[0][3]))
            continue
        for variant in dict.fromkeys(r[0].variant for r in mine if r[0] is not None):
            theirs = [r for r in mine if r[0] is not None and r[0].variant == variant]
            if _all_alike(theirs, [c for c in cands if c.family == fam
                                   and c.variant == variant]):
                c = theirs[0][0]
                out.append((replace(c, dispatch_quant="", combine_quant=""), fam,
                            theirs[0][2], theirs[0][3]))
            else:
                out += theirs
    return out


def _all_alike(refused: list[tuple[Candidate | None, str, Any, str]],
               cands: Sequence[Candidate]) -> bool:
    return len(refused) == len(cands) and len({r[3] for r in refused}) == 1


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


def _reason(exc: InputError) -> str:
    """The loader's one line without the candidate's own scenario name in front."""
    key = f"{exc.key}: " if exc.key else ""
    return f"{key}{exc.message}"


# ---------------------------------------------------------------- bands and ranking



def band(text: str) -> float:
    """--band 25% or 0.25 -> 0.25: a finite positive error below 100%."""
    raw = text.strip()
    try:
        value = float(raw.removesuffix("%")) / (100 if raw.endswith("%") else 1)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 < value < 1):
        raise InputError("command line", "--band", f"{text!r}; allowed: a relative error "
                         "above 0 and below 100%, as 25% or 0.25")
    return value


def entry_of(c: Candidate, report: Mapping[str, Any], preset: str,
             uncalibrated: float, asked: Mapping[str, Any]) -> Entry:
    """A run's entry: its ops' latencies and phases, and its band from its ops' ledgers
    (`asked`: the point's workload as advise wrote it, which a measurement names)."""
    ops = {o["op"]: float(o["latency_us"]) for o in report["ops"]}
    longest = max(report["ops"], key=lambda o: o["latency_us"])
    crit = (longest.get("critical") or {}).get("phase") or "-"
    phases = {o["op"]: {n: (p["start_us"], p["end_us"]) for n, p in o["phases"].items()}
              for o in report["ops"]}
    wire = sum(int(o.get("bytes_sent_total", 0)) for o in report["ops"])
    workload = report["scenario"]["workload"]
    fields = {o["op"]: o.get("family_fields") or {} for o in report["ops"]}
    ledgers = list(run_ledgers(report["scenario"], fields, c.family).values())
    return Entry(c, ops, round(sum(ops.values()), 4), f"{longest['op']}.{crit}", phases, wire,
                 band_of(ledgers, uncalibrated), str(workload.get("op", "")),
                 f"{preset} at {shape_words(_shape_of(asked, c))}")


def _shape_of(workload: Mapping[str, Any], c: Candidate) -> dict[str, Any]:
    """The run's workload without what the candidate chose (its variant and quantisation)."""
    return {k: v for k, v in workload.items() if k not in c.options}


def run_plan(p: Plan, out: Path, src: str, base: Path, workers: int | None, backend: str,
             quiet: bool) -> dict[str, dict[str, Any]]:
    """Run the plan's points as a sweep under `out` (resumable); point name -> report."""
    from npusim.sweep import run_points

    return run_points(p.points, out, src, str(base), workers, backend, quiet,
                      title=f"advise {p.points[0].doc['name'] if p.points else ''}")


def rankings(p: Plan, reports: Mapping[str, Mapping[str, Any]],
             uncalibrated: float) -> list[tuple[Any, Ranking]]:
    """Per axis value its ranking, each candidate with the band of its own ledger."""
    by_value: dict[str, list[Entry]] = {repr(v): [] for v in p.values}
    for pt in p.points:
        v = pt.values.get(p.axis) if p.axis else None
        preset = p.settings.get(repr(v), p.preset)
        by_value[repr(v)].append(entry_of(p.candidate_of[pt.name], reports[pt.name], preset,
                                          uncalibrated, pt.doc["workload"]))
    return [(v, rank(by_value[repr(v)])) for v in p.values]


SCHEMA = "npusim.advice/2"


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




def _row(e: Entry, place: tuple[int, bool], preset: str) -> dict[str, Any]:
    c = e.candidate
    return {"family": c.family, "variant": c.variant, "dispatch_quant": c.dispatch_quant,
            "combine_quant": c.combine_quant, "ops_us": dict(e.ops),
            "total_us": e.total_us, "critical": e.critical, "wire_bytes": e.wire_bytes,
            "band": e.band.value, "band_source": e.band.source,
            "uncalibrated_ops": list(e.band.unvouched), "place": place[0], "tie": place[1],
            "rests_on": rests_on(c, preset),
            "phases_us": {op: {n: list(span) for n, span in ph.items()}
                          for op, ph in e.phases.items()}}


def document(shape: Mapping[str, Any], p: Plan, ranked: Sequence[tuple[Any, Ranking]],
             uncalibrated: float) -> dict[str, Any]:
    """The advice as plain data (`--json`, and what the text and figures are drawn from)."""
    points = []
    for value, r in ranked:
        preset = p.settings.get(repr(value), p.preset)
        points.append({"value": value, "preset": preset, "why": r.why(),
                       "ranking": [_row(e, pl, preset)
                                   for e, pl in zip(r.entries, r.places(), strict=True)]})
    refused = [{"family": fam, "variant": c.variant if c else None,
                "quant": (c.quant or None) if c else None, "value": value, "reason": why}
               for c, fam, value, why in p.refused]
    return {"schema": SCHEMA, "preset": p.preset, "uncalibrated_band": uncalibrated,
            "shape": dict(shape.get("workload", {})), "axis": p.axis, "points": points,
            "crossovers": crossovers(ranked, p.axis, p.preset) if p.axis else [],
            "refused": refused}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
