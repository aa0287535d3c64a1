"""`npusim run --harness-csv FILE`: the rows a family reports as its harness's CSV.

A family that mirrors a device harness's --perf CSV (the SHMEM examples' moe_perf_host.h)
reports it per op as `family_fields.harness_perf` = {columns, rows}, the cells already
formatted as the harness writes them. This module only writes them: FILE for a run of
one op; for several, FILE with the op's name before the suffix (out.csv ->
out_dispatch.csv, out_combine.csv), one file per op as the harness writes one per kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npusim.report.io import write_text_atomic

FIELD = "harness_perf"


def harness_tables(report: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(op, columns, rows) of every op that reports harness rows, in run order."""
    out = []
    for op in report.get("ops", []):
        table = (op.get("family_fields") or {}).get(FIELD)
        if table:
            out.append((str(op["op"]), list(table["columns"]), list(table["rows"])))
    return out


def csv_paths(path: Path, ops: list[str]) -> list[Path]:
    if len(ops) == 1:
        return [path]
    return [path.with_name(f"{path.stem}_{op}{path.suffix}") for op in ops]


def harness_files(path: Path, report: Mapping[str, Any]) -> list[tuple[Path, str]]:
    """(file, text) of each CSV file: the header once, then the rows (no quoting: the
    harness's cells hold no commas)."""
    tables = harness_tables(report)
    return [(p, "".join(",".join(r) + "\n" for r in [cols, *rows]))
            for p, (_op, cols, rows) in zip(csv_paths(path, [t[0] for t in tables]), tables,
                                            strict=True)]


def write_harness_csv(path: Path, report: Mapping[str, Any]) -> list[Path]:
    """Write the CSV file(s) in place (each atomically)."""
    return [write_text_atomic(p, text) for p, text in harness_files(path, report)]
