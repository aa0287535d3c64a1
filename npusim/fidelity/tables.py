"""Which shipped tables speak for a family on a preset, and which rows for which op.

A preset's tables are the shipped CSVs named `<preset>.csv` or `<preset>_<anything>.csv`
(the longest preset name that fits wins). A row measures the report op its kernel runs as
(`npusim validate` reads the same one: npusim.calibrate.table.timed_ops), so a deepep
low-latency "dispatch" row speaks for the run's `low_latency_dispatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from npusim.calibrate.table import Measurement, family_of, read_table, timed_ops
from npusim.fidelity.record import read_record, record_path, recorded
from npusim.hw.config import preset_names
from npusim.kernels import registry
from npusim.shipped import targets_dir


def preset_of_table(stem: str) -> str | None:
    """The shipped preset a table is named after (None: it names none)."""
    fits = [p for p in preset_names() if stem == p or stem.startswith(f"{p}_")]
    return max(fits, key=len) if fits else None


def tables_of(preset: str) -> list[Path]:
    """The shipped tables of a preset, in name order."""
    return [p for p in sorted(targets_dir().glob("*.csv")) if preset_of_table(p.stem) == preset]


@dataclass(frozen=True)
class Row:
    """A table row as the ledger reads it: the measurement, the report op it times, and
    its recorded simulated value (None: not simulated in the current record)."""

    m: Measurement
    family: str
    op: str
    simulated: float | None


def report_op(m: Measurement) -> str:
    """The report op a row measures: the kernel its timed run runs at the row's place."""
    fam = family_of(m.workload)
    run, i = timed_ops(fam, m.workload)[m.op]
    return fam.runs_of(m.workload)[run][i]


def table_rows(table: Path) -> tuple[Row, ...]:
    """Every row of a table with its op and recorded value (cached per file state)."""
    return _rows(table, *_stamp(table), *_stamp(record_path(table)))


def _stamp(p: Path) -> tuple[int, int]:
    try:
        st = p.stat()
    except FileNotFoundError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _rows(table: Path, *_stamps: Any) -> tuple[Row, ...]:
    rows = read_table(table)
    values = recorded(rows, read_record(record_path(table)))
    return tuple(Row(m, m.workload.get("kernel", registry.DEFAULT), report_op(m), v)
                 for m, v in zip(rows, values, strict=True))
