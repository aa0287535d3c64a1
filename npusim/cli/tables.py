"""`npusim validate`, and the measurement table both it and `npusim calibrate` read."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from npusim.cli.common import EXIT_FAIL, EXIT_OK, tolerance, workers
from npusim.errors import InputError

if TYPE_CHECKING:
    from npusim.calibrate import Comparison


def add_table_options(p: argparse.ArgumentParser) -> None:
    """--hardware, --table and --map: the preset and the measurements it is held to."""
    p.add_argument("--hardware", default="ascend950", help="preset name or YAML path")
    p.add_argument(
        "--table",
        metavar="CSV",
        action="append",
        help="measurements: a CSV file, or the name of a shipped table (atlas_a3_normal); "
        "repeatable, the rows of all together (default configs/targets/<preset>.csv)",
    )
    p.add_argument(
        "--map",
        metavar="MAPPING.yaml",
        help="--table is an msprof op_summary CSV; this file maps its op names to scenarios",
    )


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    val = add(
        "validate",
        help="simulate a table of measured latencies (default: "
        "the published rows of the preset) and report the error per row",
    )
    add_table_options(val)
    val.add_argument(
        "--tolerance",
        default="5%",
        help="allowed error per row without its own tolerance_pct in the table (default 5%%)",
    )
    val.add_argument(
        "--speedup-tolerance",
        default="0.05",
        help="allowed error of each quantisation speed-up (default 0.05)",
    )
    val.add_argument("--json", action="store_true", help="machine-readable output")
    val.add_argument("--workers", default=None, help="parallel processes")
    val.add_argument(
        "--record",
        action="store_true",
        help="also write the shipped table's validation record (configs/targets/"
        "<table>.record.json, read by the fidelity ledger); only a shipped table at its "
        "own preset",
    )
    val.add_argument(
        "--rows",
        metavar="LABEL[,LABEL]",
        help="with --record: simulate only these rows and merge them into the record",
    )
    val.set_defaults(func=cmd_validate)


def table_args(args: argparse.Namespace) -> tuple[str, str, list]:
    """The preset, the tables' names (joined by " + ") and their rows, in order (each
    --table, or the preset's published table; an msprof op_summary through --map)."""
    from npusim.calibrate import default_table, read_table
    from npusim.hw.config import load_hardware
    from npusim.msprof import is_op_summary, read_measurements

    name = load_hardware(args.hardware).name  # a fitted copy keeps its preset's name
    tables = [_table_path(t) for t in args.table] if args.table else [default_table(name)]
    if not args.table and not tables[0].exists():
        raise InputError(
            "command line", "--table", f"no published table for {name} ({tables[0]}); "
            "pass --table CSV"
        )
    if args.map:
        if len(tables) > 1:
            raise InputError("command line", "--table", "one op_summary with --map; allowed: "
                             "a single --table")
        return args.hardware, str(tables[0]), read_measurements(tables[0], Path(args.map))
    rows = []
    for table in tables:
        if is_op_summary(table):
            raise InputError(
                str(table),
                None,
                "is an msprof op_summary: pass --map MAPPING.yaml "
                "(its op names to scenarios; docs/calibration.md)",
            )
        rows += read_table(table)
    return args.hardware, " + ".join(map(str, tables)), rows


def _table_path(given: str) -> Path:
    """--table's file; a name that is no file but a shipped table's is that table."""
    from npusim.calibrate import TARGETS_DIR

    p = Path(given)
    shipped = TARGETS_DIR / f"{given}.csv"
    if not p.exists() and "/" not in given and shipped.is_file():
        return shipped
    return p


def cmd_validate(args: argparse.Namespace) -> int:
    from npusim.calibrate import compare, simulate_table

    tol = tolerance(args.tolerance, "--tolerance")
    sp_tol = tolerance(args.speedup_tolerance, "--speedup-tolerance")
    n_workers = workers(args.workers)
    record = _record_target(args)
    hardware, table, rows = table_args(args)
    if record is not None:
        rows = _chosen_rows(rows, args.rows, table)
    sim = simulate_table(rows, hardware, {}, str(table), n_workers)
    written = _write_record(record, hardware, rows, sim) if record is not None else ""
    cmp = compare(rows, sim)
    errs = cmp.errors()
    tols = [tol if m.tolerance is None else m.tolerance for m in rows]
    bad_rows = [m.name for m, e, t in zip(rows, errs, tols, strict=True) if not abs(e) <= t]
    bad_sp = [sp for sp in cmp.speedups if abs(sp["simulated"] - sp["measured"]) > sp_tol]
    show = _print_json if args.json else _print_text
    show(Validation(hardware, table, tol, sp_tol, cmp, tols, not bad_rows and not bad_sp))
    if written:  # with --json, stdout holds the JSON alone
        print(written, file=sys.stderr if args.json else sys.stdout)
    return EXIT_FAIL if bad_rows or bad_sp else EXIT_OK


class Validation(NamedTuple):
    """What `npusim validate` found, for either way of printing it."""

    hardware: str
    table: str
    tol: float  # per row, unless the row has its own (tols)
    sp_tol: float  # per quantisation speed-up
    cmp: Comparison
    tols: list[float]
    ok: bool


def _print_json(v: Validation) -> None:
    import json

    from npusim.calibrate.comparison import row_entry

    hardware, table, tol, _, cmp, tols, ok = v
    rows, sim, errs = cmp.rows, cmp.simulated, cmp.errors()
    print(
        json.dumps(
            {
                "hardware": hardware,
                "table": str(table),
                "tolerance": tol,
                "rows": [
                    {
                        **m.workload,
                        **row_entry(m, round(s, 4)),
                        "error": round(e, 6),
                        "tolerance": t,
                        "use": m.use,
                    }
                    for m, s, e, t in zip(rows, sim, errs, tols, strict=True)
                ],
                "mape": round(cmp.mape(), 6),
                "speedups": [
                    {
                        **sp,
                        "simulated": round(sp["simulated"], 4),
                        "measured": round(sp["measured"], 4),
                    }
                    for sp in cmp.speedups
                ],
                "ok": ok,
            },
            indent=2,
        )
    )


def _print_text(v: Validation) -> None:
    from npusim.calibrate.comparison import unit_label

    hardware, table, tol, sp_tol, cmp, tols, _ = v
    rows, sim, errs = cmp.rows, cmp.simulated, cmp.errors()
    print(f"{hardware} against {table}")
    print(f"  {'row':<24}{'measured':>12}{'simulated':>12} {'unit':<5}{'error':>8}")
    for m, s, e, t in zip(rows, sim, errs, tols, strict=True):
        flag = "" if abs(e) <= t else f"  <- outside {100 * t:g}%"
        note = "  (a prediction: never fitted)" if m.use == "predict" else ""
        print(f"  {m.name:<24}{m.measured:>12.1f}{s:>12.2f} {unit_label(m):<5}"
              f"{100 * e:>7.1f}%{flag}{note}")
    own = sorted({t for m, t in zip(rows, tols, strict=True) if m.tolerance is not None})
    print(
        f"  MAPE {100 * cmp.mape():.2f}% (tolerance per row {100 * tol:g}%"
        + "".join(f", {100 * t:g}% where the table says so" for t in own)
        + ")"
    )
    for sp in cmp.speedups:
        d = sp["simulated"] - sp["measured"]
        flag = "" if abs(d) <= sp_tol else "  <- outside"
        print(
            f"  speed-up {sp['label']}: measured "
            f"{sp['measured']:.2f}, simulated {sp['simulated']:.2f} ({d:+.2f}){flag}"
        )


def _record_target(args: argparse.Namespace) -> Path | None:
    """The shipped table --record writes the record of (None without --record); one line
    and exit 2 for anything but one shipped table at its own, unchanged preset."""
    from npusim.calibrate import TARGETS_DIR, default_table
    from npusim.fidelity.tables import preset_of_table

    if not args.record:
        if args.rows:
            raise InputError("command line", "--rows", "needs --record (it picks the rows "
                             "recorded)")
        return None
    if args.map:
        raise InputError("command line", "--record", "records shipped tables only, not an "
                         "op_summary through --map")
    if args.table and len(args.table) > 1:
        raise InputError("command line", "--record", "one --table at a time")
    table = _table_path(args.table[0]) if args.table else default_table(args.hardware)
    if table.resolve().parent != TARGETS_DIR.resolve() or not table.is_file():
        raise InputError("command line", "--record", f"{table} is not a shipped table; "
                         f"allowed: {', '.join(p.stem for p in sorted(TARGETS_DIR.glob('*.csv')))}")
    preset = preset_of_table(table.stem)
    if args.hardware != preset:
        raise InputError("command line", "--hardware", f"{args.hardware!r}: a record is made "
                         f"at the table's shipped preset; allowed: --hardware {preset}")
    return table


def _chosen_rows(rows: list, labels: str | None, table: str) -> list:
    """--rows: the named rows, in table order (all rows without it)."""
    if not labels:
        return rows
    wanted = [x.strip() for x in labels.split(",") if x.strip()]
    names = {m.name for m in rows}
    missing = [x for x in wanted if x not in names]
    if missing or not wanted:
        raise InputError("command line", "--rows", f"{missing[0] if missing else labels!r}: no "
                         f"such row in {table} (`npusim validate --table {table}` lists them)")
    return [m for m in rows if m.name in wanted]


def _write_record(table: Path, preset: str, rows: list, sim: list[float]) -> str:
    """The record of the rows just simulated, merged into the table's earlier record;
    returns the line that says so."""
    from npusim.calibrate import read_table
    from npusim.fidelity.record import read_record, record_doc, record_path
    from npusim.report.io import write_json_atomic

    path = record_path(table)
    names = {m.name for m in read_table(table)}
    doc = record_doc(table.stem, preset, names, rows, sim, read_record(path))
    write_json_atomic(path, doc, inline_leaves=True)
    return (f"record: {path} ({len(rows)} row(s) simulated, {len(doc['rows'])} of "
            f"{len(names)} recorded)")
