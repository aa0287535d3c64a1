"""Reading a measurement table: one Measurement per CSV row, every cell checked, errors
naming the file, the row and the column."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.kernels import registry
from npusim.kernels.family import Family, Option
from npusim.shipped import targets_dir

WORKLOAD_FIELDS = ("op", "bs", "h", "k", "ep_world_size", "experts_per_rank", "dtype")
INT_FIELDS = ("bs", "h", "k", "ep_world_size", "experts_per_rank")
# what a row measured: the op's latency, or the bandwidth its kernel's published tables
# quote (Kernel.bandwidth); a row fills exactly one
MEASURED = {"measured_us": "us", "measured_gbps": "gbps"}
OPTIONAL = ("source", "label", "routing", "kernel", "tolerance_pct", "use")
USES = ("fit", "predict")  # predict: validate reports the row, calibrate never fits it
# a column hw.<preset key> sets that key for the row alone (a window the shape needs), and
# run.<key> the row's run option (a wall-clock guard longer than the default hour)
HW_PREFIX, RUN_PREFIX = "hw.", "run."
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
    """One measured kernel call: its latency (unit "us") or its bandwidth ("gbps", the
    figure the row's kernel names as `Kernel.bandwidth`)."""

    workload: dict[str, Any]
    measured: float
    source: str = ""
    label: str = ""
    tolerance: float | None = None  # the row's allowed error (a fraction), None: the default
    unit: str = "us"
    use: str = "fit"  # "predict": never fitted, only reported (a prediction)
    hardware: dict[str, float] = field(default_factory=dict)  # the row's own preset keys
    run: dict[str, float] = field(default_factory=dict)  # the row's own run options

    @property
    def column(self) -> str:
        """The table column (and report key) of the measured value: measured_<unit>."""
        return f"measured_{self.unit}"

    @property
    def bandwidth(self) -> bool:
        return self.unit == "gbps"

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
    missing = [c for c in WORKLOAD_FIELDS if c not in cols]
    if not any(c in cols for c in MEASURED):
        missing.append(" or ".join(MEASURED))
    if missing:
        raise InputError(
            src,
            None,
            f"missing column(s) {', '.join(missing)}; needed: "
            f"{', '.join(WORKLOAD_FIELDS)} and {' or '.join(MEASURED)}",
        )
    known = (*WORKLOAD_FIELDS, *MEASURED, *OPTIONAL, *option_columns())
    extra = [c for c in cols if c not in known and not c.startswith((HW_PREFIX, RUN_PREFIX))]
    if extra:
        raise InputError(src, extra[0], f"unknown column; allowed: {', '.join(known)}")


def _measurement(rec: dict[str, Any], cols: list[str], src: str, where: str) -> Measurement:
    """One CSV record as a Measurement, checked against its family."""
    w = _workload(rec, cols, src, where)
    if rec.get("routing"):
        w["routing"] = {"kind": rec["routing"].strip(), "seed": 0}
    column, measured = _measured(rec, cols, src, where)
    if MEASURED[column] == "gbps" and _bandwidth_field(w) is None:
        raise InputError(src, f"{where}.{column}", f"op {w['op']!r} of family "
                         f"{family_of(w).name!r} names no bandwidth figure; allowed: "
                         "measured_us")
    use = (rec.get("use") or "").strip() or "fit"
    if use not in USES:
        raise InputError(src, f"{where}.use", f"{use!r}; allowed: {', '.join(USES)}, or blank "
                         "(fit)")
    return Measurement(
        w,
        measured,
        (rec.get("source") or "").strip(),
        (rec.get("label") or "").strip(),
        _row_tolerance(rec.get("tolerance_pct"), src, where),
        MEASURED[column],
        use,
        _prefixed(rec, cols, HW_PREFIX, src, where),
        _prefixed(rec, cols, RUN_PREFIX, src, where),
    )


def _prefixed(rec: dict[str, Any], cols: list[str], prefix: str, src: str, where: str
              ) -> dict[str, float]:
    """The row's <prefix><key> cells (blank: the default); the scenario built from the
    row checks each key and value as it checks hardware_overrides and run."""
    out: dict[str, float] = {}
    for c in (c for c in cols if c.startswith(prefix)):
        v = (rec.get(c) or "").strip()
        if not v:
            continue
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            raise InputError(src, f"{where}.{c}", f"{v!r}; allowed: a finite number")
        out[c[len(prefix):]] = int(x) if x.is_integer() else x
    return out


def _measured(rec: dict[str, Any], cols: list[str], src: str, where: str
              ) -> tuple[str, float]:
    """The row's one measured cell: its column and value (finite, > 0)."""
    filled = [c for c in MEASURED if c in cols and (rec.get(c) or "").strip()]
    if len(filled) != 1:
        named = [c for c in MEASURED if c in cols]
        raise InputError(src, f"{where}.{named[0]}", "fill exactly one of "
                         f"{' and '.join(named)}" if len(named) > 1 else "must be a number, "
                         "got ''")
    column = filled[0]
    try:
        value = float(rec[column])
    except (TypeError, ValueError):
        raise InputError(
            src, f"{where}.{column}", f"must be a number, got {rec[column]!r}"
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise InputError(src, f"{where}.{column}", f"{rec[column].strip()!r}; allowed: a "
                         "finite number > 0")
    return column, value


def bandwidth_field(m: Measurement) -> str:
    """The family_fields key a bandwidth row's simulated figure is read from."""
    name = _bandwidth_field(m.workload)
    assert name is not None  # read_table refuses such rows
    return name


def _bandwidth_field(w: Mapping[str, Any]) -> str | None:
    fam = family_of(w)
    run, i = timed_ops(fam, w)[w["op"]]
    return fam.kernel(fam.runs_of(w)[run][i]).bandwidth


def _workload(rec: dict[str, Any], cols: list[str], src: str, where: str) -> dict[str, Any]:
    """The record's workload fields and family options; its op must be one the family
    times (timed_ops)."""
    options = option_columns()
    w: dict[str, Any] = {}
    for c in WORKLOAD_FIELDS:
        v = (rec.get(c) or "").strip()
        if c != "op" and not v:  # left to the family (checked below)
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
    blank = [c for c in (*INT_FIELDS, "dtype") if c not in w]
    if blank and fam.uses_moe_shape:
        raise InputError(src, f"{where}.{blank[0]}", "must be an integer, got ''"
                         if blank[0] != "dtype" else "must name a dtype, got ''")
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
