"""The shipped sweep of hicann/hixl's benchmark tables (scenarios/sweeps/hixl_table.yaml)
and the published points `npusim plot --published` draws from the calibration table: both
checked against the table's rows, read here as plain CSV."""

from __future__ import annotations

import csv
from pathlib import Path

from npusim.cli.sweeps import _published_points
from npusim.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "configs" / "targets" / "atlas_a3_hixl.csv"
SWEEP = ROOT / "scenarios" / "sweeps" / "hixl_table.yaml"
KEYS = ("op", "path", "transport", "expansion", "servers", "block_bytes")
BLOCKS = 8  # 16 KiB to 2 MiB
# the published series: FabricMem (AICPU, host) x 8 directions and HCCS's 12 supported
# (table, direction) pairs, on one server and two; RoCE's 2 tables x 8 on each
SERIES = 2 * (2 * 8 + 6) + 2 * 2 * 8


def _rows() -> list[dict[str, str]]:
    with TABLE.open(newline="") as f:
        return list(csv.DictReader(f))


def _series(label: str) -> str:
    """A row's series: its label without the block size (hixl_..._D2rD_16K)."""
    return label.rsplit("_", 1)[0]


def test_the_sweep_has_one_valid_point_per_row_of_the_table():
    """load_sweep builds and validates every point (nothing runs); the points are the
    table's rows one for one: same series label, op, path, transport, expansion, servers
    and block, 128 MiB in one transfer, timing-only."""
    _, points = load_sweep(SWEEP)
    rows = _rows()
    assert len(points) == len(rows) == SERIES * BLOCKS
    got = []
    for p in points:
        w = p.doc["workload"]
        assert (w["total_bytes"], w["transfers"], w["timing_only"]) == (128 << 20, 1, True)
        got.append((p.values["table"], *(str(w[k]) for k in KEYS)))
    want = [(_series(r["label"]), *(r[k] for k in KEYS)) for r in rows]
    assert sorted(got) == sorted(want)


def test_published_points_are_the_tables_figures_as_times_of_128_mib():
    """Each series' marks: the row's block against 128 MiB over its published GB/s, in us
    (bytes / (GB/s) is ns)."""
    marks = _published_points(TABLE, "workload.block_bytes")
    want: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in _rows():
        us = int(r["total_bytes"]) / float(r["measured_gbps"]) / 1000.0
        want.setdefault((r["op"], _series(r["label"])), []).append((float(r["block_bytes"]), us))
    assert set(marks) == set(want) and len(marks) == SERIES
    for key, pts in want.items():
        assert sorted(marks[key]) == sorted(pts)
    # a figure from the table by hand: one server D2rD at 16 KiB, 16.113 GB/s
    assert (16384.0, 134217728 / 16.113 / 1000) in marks[("put", "hixl_1server_fabric_aicpu_D2rD")]


def test_every_series_of_the_sweep_has_its_published_points():
    """The sweep's labels are the table's series, so `--group table` finds every panel's
    marks."""
    _, points = load_sweep(SWEEP)
    marks = _published_points(TABLE, "workload.block_bytes")
    assert {(p.doc["workload"]["op"], p.values["table"]) for p in points} == set(marks)
