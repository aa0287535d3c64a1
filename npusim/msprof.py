"""Measurements from msprof: an `op_summary_*.csv` and a mapping from its op names to
scenarios, read into the rows `npusim validate --table` and `npusim calibrate` fit.

msprof writes one line per kernel launch, with (among many columns) `Op Name`, `OP Type`,
`Input Shapes` and `Task Duration(us)` (the task's time from the first core's start to the
last core's end, in us; hiascend "op_summary (Operator Details)"). The mapping file says
which lines measure which scenario:

    ops:
      - op_name: MoeDistributeDispatchV2   # matched against "Op Name" (exactly)
        input_shapes: "128,7168;128,8"     # optional: only the lines with this "Input Shapes"
        scenario: mc2/a3_bs128_ep8         # a scenario file (relative to this file) or a
                                           # shipped scenario's name
        op: dispatch                       # optional: the op of the scenario's run it times
        label: dispatch_ep8                # optional: the row's name
        tolerance_pct: 10                  # optional: the row's own validate target

A row's measured latency is the mean duration of its matching lines (every launch of a
profiled loop); its workload is the scenario's, its hardware the command's --hardware.
Lines that no entry matches (other kernels of the profile) are left out.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from npusim.errors import InputError

OP_NAME = "Op Name"
DURATION = "Task Duration(us)"
SHAPES = "Input Shapes"
ENTRY_KEYS = ("op_name", "input_shapes", "scenario", "op", "label", "tolerance_pct")


def is_op_summary(path: Path) -> bool:
    """Whether a CSV's header is msprof's (it names `Op Name`), not a table's."""
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return OP_NAME in (h.strip() for h in header)


def read_op_summary(path: Path) -> list[tuple[str, str, float]]:
    """(op name, input shapes, task duration in us) of every line; a bad cell is refused
    naming its line and column."""
    src = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(src, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}"
                         ) from None
    try:
        lines = list(csv.reader(text.splitlines()))
    except csv.Error as exc:
        raise InputError(src, None, f"malformed CSV: {exc}") from None
    if not lines:
        raise InputError(src, None, "empty; an msprof op_summary CSV has a header line")
    header = [h.strip() for h in lines[0]]
    missing = [c for c in (OP_NAME, DURATION) if c not in header]
    if missing:
        raise InputError(src, None, f"missing column(s) {', '.join(repr(c) for c in missing)}"
                         " (msprof op_summary columns)")
    name_at, dur_at = header.index(OP_NAME), header.index(DURATION)
    shape_at = header.index(SHAPES) if SHAPES in header else None
    out = []
    for n, cells in enumerate(lines[1:], start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise InputError(src, f"row {n}", f"has {len(cells)} cells, the header "
                             f"{len(header)}")
        name = cells[name_at].strip()
        if not name:
            raise InputError(src, f"row {n}.{OP_NAME}", "is empty")
        raw = cells[dur_at].strip()
        try:
            dur = float(raw)
        except ValueError:
            dur = math.nan
        if not (math.isfinite(dur) and dur > 0):
            raise InputError(src, f"row {n}.{DURATION}", f"{raw!r}; allowed: a finite "
                             "number of us > 0")
        shapes = cells[shape_at].strip() if shape_at is not None else ""
        out.append((name, shapes, dur))
    if not out:
        raise InputError(src, None, "no op lines")
    return out


def _entry_text(src: str, key: str, value: Any, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(src, key, f"{value!r}; allowed: a non-empty string")
    return value.strip()


def read_mapping(path: Path) -> list[dict[str, Any]]:
    """The mapping file's entries, checked (see the module docstring)."""
    from npusim.hw.config import read_yaml_mapping

    src = str(path)
    doc = read_yaml_mapping(path)
    extra = [k for k in doc if k != "ops"]
    if extra:
        raise InputError(src, str(extra[0]), "unknown key; allowed: ops")
    ops = doc.get("ops")
    if not isinstance(ops, list) or not ops:
        raise InputError(src, "ops", "must be a non-empty list of entries")
    entries = []
    for i, e in enumerate(ops, start=1):
        where = f"ops[{i}]"
        if not isinstance(e, dict):
            raise InputError(src, where, "must be a mapping (op_name, scenario, ...)")
        bad = [k for k in e if k not in ENTRY_KEYS]
        if bad:
            raise InputError(src, f"{where}.{bad[0]}", f"unknown key; allowed: "
                             f"{', '.join(ENTRY_KEYS)}")
        entry: dict[str, Any] = {k: _entry_text(src, f"{where}.{k}", e.get(k),
                                                k in ("op_name", "scenario"))
                                 for k in ("op_name", "input_shapes", "scenario", "op", "label")}
        tol = e.get("tolerance_pct")
        if tol is not None:
            ok = isinstance(tol, (int, float)) and not isinstance(tol, bool) \
                and math.isfinite(tol) and 0 < tol <= 100
            if not ok:
                raise InputError(src, f"{where}.tolerance_pct", f"{tol!r}; allowed: a "
                                 "percentage in (0, 100]")
        entry["tolerance"] = None if tol is None else float(tol) / 100
        entry["where"] = where
        entries.append(entry)
    return entries


def _scenario_path(entry: dict[str, Any], base: Path) -> str:
    from npusim.shipped import resolve

    own = base / entry["scenario"]
    return str(own) if own.exists() else resolve(entry["scenario"])


def read_measurements(summary: Path, mapping: Path) -> list[Any]:
    """The rows an op_summary and its mapping give (npusim.calibrate.Measurement)."""
    from npusim.calibrate import Measurement, timed_ops
    from npusim.kernels import registry
    from npusim.scenario import load_scenario, read_scenario_file
    from npusim.scenario.workload import anchored

    launches = read_op_summary(summary)
    rows = []
    for e in read_mapping(mapping):
        src, where = str(mapping), e["where"]
        path = _scenario_path(e, mapping.resolve().parent)
        sc = load_scenario(path)  # checked whole; the row takes its workload as written,
        doc, _, folder = read_scenario_file(path)  # its files found where `run` finds them
        w = anchored(doc["workload"], folder)
        run = sc.workload.op
        try:
            fam = registry.get(w.get("kernel", registry.DEFAULT))
        except registry.FamilyError as exc:
            raise InputError(src, f"{where}.scenario", f"{path}: {exc}") from None
        runs = fam.runs_of(w)
        op = e["op"] or runs[run][0]
        if op not in runs[run] or op not in timed_ops(fam, w):
            raise InputError(src, f"{where}.op", f"{op!r}; allowed: the ops of the "
                             f"scenario's run {run!r}: {', '.join(runs[run])}")
        w["op"] = op
        hits = [d for name, shapes, d in launches if name == e["op_name"]
                and (e["input_shapes"] is None or shapes == e["input_shapes"])]
        if not hits:
            shapes = f" with Input Shapes {e['input_shapes']!r}" if e["input_shapes"] else ""
            raise InputError(src, f"{where}.op_name", f"{e['op_name']!r}{shapes} matches no "
                             f"line of {summary}")
        rows.append(Measurement(w, sum(hits) / len(hits),
                                f"{summary}: {len(hits)} launch(es) of {e['op_name']}",
                                e["label"] or "", e["tolerance"]))
    return rows
