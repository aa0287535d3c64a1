"""Where each preset value comes from, in a form a test can check.

A preset value is either a plain number (scenario overrides, a user's quick copy) or an
entry ``{value: V, <kind>: {...}}`` whose kind is one of

* ``sourced``: ``doc`` (document, URL or citation), ``figure`` (the figure as the source
  states it, number and unit first: "196 GB/s one way per die", "1.65-1.8 GHz"), ``conf``
  (H, M, L or a span such as M-H), optional ``scale`` (a factor the figure is multiplied
  by besides the unit conversion, e.g. 0.5 for a per-package figure of a two-die package)
  and ``note``;
* ``calibrated``: ``fit`` (the fit report, a path relative to the repository), ``date``
  (YYYY-MM-DD) and ``method``;
* ``assumed``: ``why``, ``range`` ([low, high], the plausible values, in the value's unit)
  and optional ``same_as`` (a preset whose value this one copies).

A name (chip.arch) is an entry too, always sourced: its figure starts with the name as
the source writes it.

Loading checks the shape (one-line errors naming file and key); the `*_problem` checks
the content: a sourced value must be what its figure gives after the unit conversion (a
name: what the figure names), a calibrated one must be in its fit report, an assumed
one inside its range (npusim.hw.config.preset_problems runs them over a whole preset).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.values import is_finite

KINDS = ("sourced", "calibrated", "assumed")
REQUIRED = {"sourced": ("doc", "figure", "conf"), "calibrated": ("fit", "date", "method"),
            "assumed": ("why", "range")}
OPTIONAL = {"sourced": ("scale", "note"), "calibrated": ("note",), "assumed": ("same_as", "note")}

# unit -> (dimension, factor to the dimension's base unit)
UNITS: dict[str, tuple[str, float]] = {
    "TB/s": ("bandwidth", 1000.0), "GB/s": ("bandwidth", 1.0), "MB/s": ("bandwidth", 1e-3),
    "GiB": ("size", float(1 << 30)), "MiB": ("size", float(1 << 20)),
    "KiB": ("size", 1024.0), "B": ("size", 1.0),
    "GHz": ("frequency", 1.0), "MHz": ("frequency", 1e-3),
    "s": ("time", 1e9), "ms": ("time", 1e6), "us": ("time", 1e3), "ns": ("time", 1.0),
    "B/repeat": ("bytes per repeat", 1.0), "cycles": ("cycles", 1.0),
    "cores": ("cores", 1.0), "dies": ("dies", 1.0), "engines": ("engines", 1.0),
    "sockets": ("sockets", 1.0),
    "instructions": ("instructions", 1.0),  # per cycle (the VF unit's issue and ports)
    "B/cycle": ("bytes per cycle", 1.0), "MACs/cycle": ("MACs per cycle", 1.0),
}
_FIGURE = re.compile(r"\s*(?:~|about\s+)?(\d+(?:\.\d+)?)(?:\s*[-\u2013]\s*(\d+(?:\.\d+)?))?"
                     r"\s*([A-Za-z]+(?:/[A-Za-z]+)?)(?:\s+per\s+([A-Za-z]+))?")
_CONF = re.compile(r"^[HML](-[HML])?$")
_DATE = re.compile(r"^\d{4}-\d\d-\d\d$")


@dataclass(frozen=True)
class Provenance:
    """One value's origin: its kind and the fields of that kind."""

    kind: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """A parsed source figure: low..high (equal for one number) in `unit`."""

    low: float
    high: float
    unit: str


def is_entry(raw: Any) -> bool:
    """A value with provenance (a mapping holding `value`), not a section."""
    return isinstance(raw, dict) and "value" in raw


def split_entry(raw: Any, source: str, key: str, text: bool = False
                ) -> tuple[Any, Provenance | None]:
    """A preset value -> (the plain value, its provenance or None for a plain number);
    text: the value is a name, sourced from a document that writes it."""
    if not is_entry(raw):
        return raw, None
    kinds = [k for k in raw if k in KINDS]
    extra = [k for k in raw if k not in (*KINDS, "value")]
    if extra:
        raise InputError(source, f"{key}.{extra[0]}", "unknown key; allowed: value and one "
                         f"of {', '.join(KINDS)}")
    if len(kinds) != 1:
        raise InputError(source, key, f"needs exactly one of {', '.join(KINDS)} beside value"
                         f"{'' if not kinds else ', got ' + ' and '.join(kinds)}")
    kind = kinds[0]
    body = raw[kind]
    where = f"{key}.{kind}"
    if text and kind != "sourced":
        raise InputError(source, where, "a name is sourced (doc, a figure that starts with "
                         "the name, conf); allowed: sourced")
    if not isinstance(body, dict):
        raise InputError(source, where, f"must be a mapping with {', '.join(REQUIRED[kind])}")
    for name in body:
        if name not in (*REQUIRED[kind], *OPTIONAL[kind]):
            raise InputError(source, f"{where}.{name}", "unknown key; allowed: "
                             f"{', '.join((*REQUIRED[kind], *OPTIONAL[kind]))}")
    for name in REQUIRED[kind]:
        if name not in body:
            raise InputError(source, f"{where}.{name}", "missing")
    _check_fields(kind, body, source, where, text)
    fields = dict(body)
    if "date" in fields:
        fields["date"] = str(fields["date"])  # YAML reads an unquoted date as a date
    return raw["value"], Provenance(kind, fields)


def _check_fields(kind: str, body: dict[str, Any], source: str, where: str,
                  text: bool = False) -> None:
    texts = [n for n in (*REQUIRED[kind], "note", "same_as")
             if n in body and n not in ("range", "date")]
    for name in texts:
        if not isinstance(body[name], str) or not body[name].strip():
            raise InputError(source, f"{where}.{name}", "must be a non-empty string")
    if kind == "sourced":
        if not _CONF.match(body["conf"]):
            raise InputError(source, f"{where}.conf", f"{body['conf']!r}; allowed: H, M, L "
                             "or a span such as M-H")
        try:
            if not text:
                parse_figure(body["figure"])
        except ValueError as exc:
            raise InputError(source, f"{where}.figure", str(exc)) from None
        if "scale" in body and not _positive(body["scale"]):
            raise InputError(source, f"{where}.scale", "must be a number > 0")
    elif kind == "calibrated":
        if not _DATE.match(str(body["date"])):
            raise InputError(source, f"{where}.date", f"{body['date']!r}; expected YYYY-MM-DD")
    else:
        rng = body["range"]
        if not (isinstance(rng, list) and len(rng) == 2 and all(is_finite(v) for v in rng)
                and rng[0] <= rng[1]):
            raise InputError(source, f"{where}.range", "must be [low, high], two numbers, "
                             "low <= high")


def _positive(v: Any) -> bool:
    return is_finite(v) and v > 0


def parse_figure(text: str) -> Figure:
    """'196 GB/s one way per die' -> 196..196 GB/s; '1.65-1.8 GHz' -> 1.65..1.8 GHz;
    '256 B per repeat' -> 256 B/repeat. The figure must start with its number and unit."""
    m = _FIGURE.match(str(text))
    if not m:
        raise ValueError(f"{text!r}: must start with a number (or a range a-b) and a unit")
    low = float(m.group(1))
    high = float(m.group(2)) if m.group(2) else low
    unit = m.group(3)
    if m.group(4) and f"{unit}/{m.group(4)}" in UNITS:
        unit = f"{unit}/{m.group(4)}"
    if unit not in UNITS:
        raise ValueError(f"{text!r}: unknown unit {unit!r}; allowed: {', '.join(UNITS)}")
    if high < low:
        raise ValueError(f"{text!r}: range high below low")
    return Figure(low, high, unit)


def convert(fig: Figure, unit: str, scale: float = 1.0) -> tuple[float, float]:
    """The figure in the value's unit (times scale); ValueError if the units do not match."""
    dim, f_from = UNITS[fig.unit]
    if unit not in UNITS or UNITS[unit][0] != dim:
        raise ValueError(f"figure unit {fig.unit} does not convert to {unit}")
    factor = f_from / UNITS[unit][1] * scale
    return fig.low * factor, fig.high * factor


def sourced_problem(value: float | str, unit: str, prov: Provenance) -> str | None:
    """Why a sourced value is not what its figure gives, or None if it is."""
    if isinstance(value, str):  # a name: the figure starts with it as the source writes it
        named = str(prov.fields["figure"]).split()[0].lower()
        return None if named == value.lower() else \
            f"value {value!r} but the figure {prov.fields['figure']!r} names {named!r}"
    try:
        lo, hi = convert(parse_figure(prov.fields["figure"]), unit,
                         float(prov.fields.get("scale", 1.0)))
    except ValueError as exc:
        return str(exc)
    if lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9):
        return None
    given = f"{_g(lo)}" if lo == hi else f"{_g(lo)}-{_g(hi)}"
    scale = f" (x {_g(float(prov.fields['scale']))})" if "scale" in prov.fields else ""
    return f"value {_g(value)} {unit} but the figure {prov.fields['figure']!r}{scale} gives " \
           f"{given} {unit}"


def calibrated_problem(key: str, value: float, prov: Provenance, root: Path) -> str | None:
    """Why a calibrated value is not backed by its fit report, or None if it is: the report
    must exist, fit this key and give this value (to the 4 digits a preset keeps)."""
    path = root / prov.fields["fit"]
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"fit report {prov.fields['fit']} is not readable JSON ({exc})"
    for p in report.get("parameters", []):
        if key in p.get("keys", []):
            fitted = float(p["fitted"])
            if math.isclose(value, fitted, rel_tol=5e-4, abs_tol=1e-12):
                return None
            return f"value {_g(value)} but {prov.fields['fit']} fitted {_g(fitted)}"
    return f"{prov.fields['fit']} did not fit {key}"


def assumed_problem(value: float, prov: Provenance, same: float | None) -> str | None:
    """Why an assumed value is outside its range or differs from the value it copies."""
    lo, hi = prov.fields["range"]
    if not lo <= value <= hi:
        return f"value {_g(value)} outside its plausible range [{_g(lo)}, {_g(hi)}]"
    if same is not None and not math.isclose(value, same, rel_tol=1e-12):
        return f"value {_g(value)} but {prov.fields['same_as']} has {_g(same)}"
    return None


def describe(value: float | str, unit: str, prov: Provenance | None) -> str:
    """One line of provenance for `npusim presets --explain`."""
    if prov is None:
        return "none (a plain value)"
    f = prov.fields
    if isinstance(value, str):
        note = f"; {f['note']}" if "note" in f else ""
        return f"sourced ({f['conf']}): \"{f['figure']}\"; {f['doc']}{note}"
    if prov.kind == "sourced":
        lo, hi = convert(parse_figure(f["figure"]), unit, float(f.get("scale", 1.0)))
        given = _g(lo) if lo == hi else f"{_g(lo)}-{_g(hi)}"
        scale = f" x {_g(float(f['scale']))}" if "scale" in f else ""
        note = f"; {f['note']}" if "note" in f else ""
        return f"sourced ({f['conf']}): \"{f['figure']}\"{scale} = {given} {unit}; " \
               f"{f['doc']}{note}"
    if prov.kind == "calibrated":
        note = f"; {f['note']}" if "note" in f else ""
        return f"calibrated {f['date']}: {f['method']} (fit report {f['fit']}){note}"
    lo, hi = f["range"]
    same = f" (same as {f['same_as']})" if "same_as" in f else ""
    note = f"; {f['note']}" if "note" in f else ""
    return f"assumed{same}, plausible {_g(lo)}-{_g(hi)} {unit}: {f['why']}{note}"


def number(v: float | str) -> str:
    """A value as a person writes it: whole numbers in full, others to 6 digits (a name
    as it is)."""
    if isinstance(v, str):
        return v
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:.6g}"


_g = number
