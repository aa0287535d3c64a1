"""The shipped validation records are current: rows simulated again give the recorded
values. A model or preset change that moves a row fails here, naming the command that
writes the record again (and docs/fidelity.md's matrix then wants rewriting too)."""

from __future__ import annotations

from functools import cache

import pytest

from npusim.calibrate import Measurement, read_table, simulate_table
from npusim.fidelity.record import read_record, record_command, record_path, row_digest
from npusim.fidelity.tables import preset_of_table
from npusim.shipped import targets_dir

EVERY_ROW = ("ascend950", "atlas_a3")
# one row per group of rows that share a path, transport, expansion and server count
GROUPED = {"atlas_a3_hixl": ("path", "transport", "expansion", "servers")}


@cache
def _rows(table: str) -> list[Measurement]:
    return read_table(targets_dir() / f"{table}.csv")


def _cases() -> list[tuple[str, str]]:
    cases = [(t, m.name) for t in EVERY_ROW for m in _rows(t)]
    for table, keys in GROUPED.items():
        cheapest: dict[tuple, Measurement] = {}
        for m in _rows(table):
            group = tuple(m.workload.get(k) for k in keys)
            if group not in cheapest or _blocks(m) < _blocks(cheapest[group]):
                cheapest[group] = m
        cases += [(table, m.name) for m in cheapest.values()]
    return cases


def _blocks(m: Measurement) -> float:
    """A transfer row's blocks moved, what its simulation's cost grows with."""
    w = m.workload
    return w["total_bytes"] / w["block_bytes"] * w.get("transfers", 1)


@pytest.mark.parametrize(("table", "label"), _cases())
def test_the_record_holds_what_the_row_simulates_to(table: str, label: str) -> None:
    path = targets_dir() / f"{table}.csv"
    preset = preset_of_table(table)
    assert preset is not None
    again = f"write it again with `{record_command(table, preset)}`"
    entry = read_record(record_path(path)).get(label)
    m = next(m for m in _rows(table) if m.name == label)
    assert entry is not None and entry[0] == row_digest(m), (
        f"{table}'s record has no entry for row {label} as the table has it now; {again}")
    (value,) = simulate_table([m], preset, {}, str(path), workers=1)
    assert value == pytest.approx(entry[1], rel=1e-9), (
        f"row {label} of {table} simulates to {value!r}, its record says {entry[1]!r}; "
        f"{again}, then `python -m npusim.fidelity.matrix docs/fidelity.md`")
