"""Validation records: a shipped table's simulated values, kept beside the table.

`npusim validate --record` simulates a shipped table at its shipped preset and writes
`configs/targets/<table>.record.json`: per row its label, a digest of what the row's
simulation is made of (its workload, its own preset keys and run options, its unit) and
the simulated value. The ledger reads the record instead of simulating the table on every
run; a row whose digest no longer matches (an edited row) counts as not simulated. The
freshness test re-simulates the recorded rows, so a model change that moves a value fails
there with the command that writes the record again.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from npusim.calibrate.table import Measurement
from npusim.errors import InputError

RECORD_SUFFIX = ".record.json"


def row_digest(m: Measurement) -> str:
    """sha256 of what the row's simulation is made of; its measured value, source and
    tolerance are not part of it (editing them leaves the simulated value as it is)."""
    content = {"workload": m.workload, "hardware": m.hardware, "run": m.run, "unit": m.unit}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def record_path(table: Path) -> Path:
    """The record beside a table: <table>.record.json."""
    return table.with_name(table.stem + RECORD_SUFFIX)


def record_command(table: str, preset: str, labels: list[str] | None = None) -> str:
    """The command that writes (some rows of) a shipped table's record."""
    rows = f" --rows {','.join(labels)}" if labels else ""
    return (f"python -m npusim validate --hardware {preset} --table {table} --record{rows} "
            "--workers 1")


def read_record(path: Path) -> dict[str, tuple[str, float]]:
    """label -> (digest, simulated value); {} when there is no record."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(str(path), None, f"unreadable validation record: {exc}") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise InputError(str(path), "rows", "a validation record needs a list of rows")
    out: dict[str, tuple[str, float]] = {}
    for r in rows:
        value = r.get("simulated")
        out[str(r["row"])] = (str(r["digest"]), math.nan if value is None else float(value))
    return out


def recorded(rows: list[Measurement], record: dict[str, tuple[str, float]]
             ) -> list[float | None]:
    """Each row's recorded simulated value, None where the record has none for the row as
    it is now (no entry, or a digest of other content)."""
    out: list[float | None] = []
    for m in rows:
        entry = record.get(m.name)
        out.append(entry[1] if entry is not None and entry[0] == row_digest(m) else None)
    return out


def record_doc(table: str, preset: str, names: set[str], rows: list[Measurement],
               simulated: list[float], kept: dict[str, tuple[str, float]]) -> dict[str, Any]:
    """The record's document: the rows just simulated over the `kept` entries of an
    earlier record whose labels are still rows of the table (`names`), sorted by label."""
    entries = {label: e for label, e in kept.items() if label in names}
    for m, s in zip(rows, simulated, strict=True):
        entries[m.name] = (row_digest(m), s)
    return {
        "table": table,
        "preset": preset,
        "rows": [{"row": label, "digest": d, "simulated": s if math.isfinite(s) else None}
                 for label, (d, s) in sorted(entries.items())],
    }
