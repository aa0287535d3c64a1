"""Reading a measurement table: one Measurement per CSV row, every cell checked, errors
naming the file, the row and the column."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.kernels import registry
from npusim.kernels.family import Family, Option
from npusim.shipped import targets_dir

WORKLOAD_FIELDS = ("op", "bs", "h", "k", "ep_world_size", "experts_per_rank", "dtype")
INT_FIELDS = ("bs", "h", "k", "ep_world_size", "experts_per_rank")
OPTIONAL = ("source", "label", "routing", "kernel", "tolerance_pct")
TARGETS_DIR = targets_dir()  # package data (npusim._data.configs/targets)


def family_of(w: Mapping[str, Any]) -> Family:
    """The kernel family a row's workload names (the default family if none)."""
    return registry.get(w.get("kernel", registry.DEFAULT))


def option_columns() -> dict[str, Option]:
    """Every built-in family's options, allowed as columns."""
    return {o.name: o for n in registry.names() for o in registry.get(n).options}


def timed_ops(fam: Family, workload: Mapping[str, Any] | None = None) -> dict[str, tuple[str, int]]:
    """What a row's `op` may name, and how it is timed: (the `workload.op` run, the op's
    place in it). An op the family runs alone is its own run; an op it runs only inside
    a fused one (mc2's combine, after dispatch, which leaves it its inputs and window
    state) is timed inside the shortest such run. The runs are those of the row's options
    (a mode that launches kernels of its own, such as deepep's low latency)."""
    runs = fam.runs_of(workload)
    out = {op: (op, 0) for op, kernels in runs.items() if len(kernels) == 1}
    for run, kernels in sorted(runs.items(), key=lambda kv: len(kv[1])):
        for i, k in enumerate(kernels):
            out.setdefault(k, (run, i))
    return out


def variant_option(w: dict[str, Any]) -> Option | None:
    """The option the row's kernel declares as its variant (None: it declares none)."""
    fam = family_of(w)
    run, i = timed_ops(fam, w)[w["op"]]
    name = fam.kernel(fam.runs_of(w)[run][i]).variant
    return next((o for o in fam.options if o.name == name), None)


@dataclass(frozen=True)
class Measurement:
    """One measured kernel call."""

    workload: dict[str, Any]
    measured_us: float
    source: str = ""
    label: str = ""
    tolerance: float | None = None  # the row's allowed error (a fraction), None: the default

    @property
    def op(self) -> str:
        return self.workload["op"]

    @property
    def quant(self) -> str:
        """The row's variant (cann_sample: the op's quantisation), "-" if none."""
        o = variant_option(self.workload)
        return "-" if o is None else str(self.workload.get(o.name, o.default))

    @property
    def base_quant(self) -> str:
        """The variant of the row's twin in a speed-up: the option's default."""
        o = variant_option(self.workload)
        return "-" if o is None else str(o.default)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        w = self.workload
        if "bs" not in w:
            return f"{w['op']}_{self.quant}"
        return f"{w['op']}_bs{w['bs']}_{self.quant}"


def default_table(hardware: str) -> Path:
    return TARGETS_DIR / f"{hardware}.csv"


def read_table(path: str | Path) -> list[Measurement]:
    """Parse a measurement CSV; errors name the file, the row and the column."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(str(p), None, f"cannot read: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    _check_columns(str(p), cols)
    rows = [_measurement(rec, cols, str(p), f"row {i}") for i, rec in enumerate(reader, start=2)]
    if not rows:
        raise InputError(str(p), None, "no measurement rows")
    return rows


def _check_columns(src: str, cols: list[str]) -> None:
    """Every needed column present, none unknown."""
    missing = [c for c in (*WORKLOAD_FIELDS, "measured_us") if c not in cols]
    if missing:
        raise InputError(
            src,
            None,
            f"missing column(s) {', '.join(missing)}; needed: "
            f"{', '.join((*WORKLOAD_FIELDS, 'measured_us'))}",
        )
    known = (*WORKLOAD_FIELDS, "measured_us", *OPTIONAL, *option_columns())
    extra = [c for c in cols if c not in known]
    if extra:
        raise InputError(src, extra[0], f"unknown column; allowed: {', '.join(known)}")


def _measurement(rec: dict[str, Any], cols: list[str], src: str, where: str) -> Measurement:
    """One CSV record as a Measurement, checked against its family."""
    w = _workload(rec, cols, src, where)
    if rec.get("routing"):
        w["routing"] = {"kind": rec["routing"].strip(), "seed": 0}
    try:
        measured = float(rec["measured_us"])
    except (TypeError, ValueError):
        raise InputError(
            src, f"{where}.measured_us", f"must be a number, got {rec['measured_us']!r}"
        ) from None
    if not measured > 0:
        raise InputError(src, f"{where}.measured_us", "must be > 0")
    return Measurement(
        w,
        measured,
        (rec.get("source") or "").strip(),
        (rec.get("label") or "").strip(),
        _row_tolerance(rec.get("tolerance_pct"), src, where),
    )


def _workload(rec: dict[str, Any], cols: list[str], src: str, where: str) -> dict[str, Any]:
    """The record's workload fields and family options; its op must be one the family
    times (timed_ops)."""
    options = option_columns()
    w: dict[str, Any] = {}
    for c in WORKLOAD_FIELDS:
        v = (rec.get(c) or "").strip()
        if c in INT_FIELDS and not v:  # left to the family (checked below)
            continue
        if c in INT_FIELDS:
            try:
                w[c] = int(v)
            except ValueError:
                raise InputError(src, f"{where}.{c}", f"must be an integer, got {v!r}") from None
        else:
            w[c] = v
    for c in (c for c in cols if c in options or c == "kernel"):
        v = (rec.get(c) or "").strip()
        if v:
            w[c] = _option_value(v, options.get(c), src, f"{where}.{c}")
    try:
        fam = family_of(w)
    except registry.FamilyError as exc:
        raise InputError(src, f"{where}.kernel", str(exc)) from None
    blank = [c for c in INT_FIELDS if c not in w]
    if blank and fam.uses_moe_shape:
        raise InputError(src, f"{where}.{blank[0]}", "must be an integer, got ''")
    timed = timed_ops(fam, w)
    if w["op"] not in timed:
        raise InputError(src, f"{where}.op", f"{w['op']!r}; allowed: {', '.join(timed)}")
    return w


def _row_tolerance(cell: str | None, src: str, where: str) -> float | None:
    """A `tolerance_pct` cell: a percentage in (0, 100], blank for the default."""
    v = (cell or "").strip()
    if not v:
        return None
    try:
        pct = float(v)
    except ValueError:
        pct = math.nan
    if not 0 < pct <= 100:
        raise InputError(
            src,
            f"{where}.tolerance_pct",
            f"{v!r}; allowed: a percentage in (0, 100], or blank for validate's --tolerance",
        )
    return pct / 100


def _option_value(v: str, o: Option | None, src: str, key: str) -> Any:
    """A CSV cell as the option's type (the scenario loader checks its range)."""
    if o is None or o.kind == "choice":
        return v
    if o.kind == "bool":
        return {"true": True, "false": False}.get(v, v)
    try:
        return int(v) if o.kind == "int" else float(v)
    except ValueError:
        raise InputError(
            src, key, f"must be {'an integer' if o.kind == 'int' else 'a number'}, got {v!r}"
        ) from None
