"""`npusim validate`, and the measurement table both it and `npusim calibrate` read."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli.common import EXIT_FAIL, EXIT_OK, tolerance, workers
from npusim.errors import InputError

if TYPE_CHECKING:
    from npusim.calibrate import Comparison


def add_table_options(p: argparse.ArgumentParser) -> None:
    """--hardware, --table and --map: the preset and the measurements it is held to."""
    p.add_argument("--hardware", default="ascend950", help="preset name or YAML path")
    p.add_argument(
        "--table", metavar="CSV", help="measurements (default configs/targets/<preset>.csv)"
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
    val.set_defaults(func=cmd_validate)


def table_args(args: argparse.Namespace) -> tuple[str, Path, list]:
    """The preset, the table's path and its rows (--table, or the preset's published
    table; an msprof op_summary through --map)."""
    from npusim.calibrate import default_table, read_table
    from npusim.hw.config import load_hardware
    from npusim.msprof import is_op_summary, read_measurements

    name = load_hardware(args.hardware).name  # a fitted copy keeps its preset's name
    table = Path(args.table) if args.table else default_table(name)
    if not args.table and not table.exists():
        raise InputError(
            "command line", "--table", f"no published table for {name} ({table}); pass --table CSV"
        )
    if args.map:
        return args.hardware, table, read_measurements(table, Path(args.map))
    if is_op_summary(table):
        raise InputError(
            str(table),
            None,
            "is an msprof op_summary: pass --map MAPPING.yaml "
            "(its op names to scenarios; docs/calibration.md)",
        )
    return args.hardware, table, read_table(table)


def cmd_validate(args: argparse.Namespace) -> int:
    from npusim.calibrate import compare, simulate_table

    tol = tolerance(args.tolerance, "--tolerance")
    sp_tol = tolerance(args.speedup_tolerance, "--speedup-tolerance")
    n_workers = workers(args.workers)
    hardware, table, rows = table_args(args)
    sim = simulate_table(rows, hardware, {}, str(table), n_workers)
    cmp = compare(rows, sim)
    errs = cmp.errors()
    tols = [tol if m.tolerance is None else m.tolerance for m in rows]
    bad_rows = [m.name for m, e, t in zip(rows, errs, tols, strict=True) if abs(e) > t]
    bad_sp = [sp for sp in cmp.speedups if abs(sp["simulated"] - sp["measured"]) > sp_tol]
    show = _print_json if args.json else _print_text
    show(hardware, table, tol, sp_tol, cmp, tols, not bad_rows and not bad_sp)
    return EXIT_FAIL if bad_rows or bad_sp else EXIT_OK


def _print_json(
    hardware: str,
    table: Path,
    tol: float,
    sp_tol: float,
    cmp: Comparison,
    tols: list[float],
    ok: bool,
) -> None:
    import json

    rows, sim, errs = cmp.rows, cmp.simulated, cmp.errors()
    print(
        json.dumps(
            {
                "hardware": hardware,
                "table": str(table),
                "tolerance": tol,
                "rows": [
                    {
                        "row": m.name,
                        **m.workload,
                        "measured_us": m.measured_us,
                        "simulated_us": round(s, 4),
                        "error": round(e, 6),
                        "tolerance": t,
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


def _print_text(
    hardware: str,
    table: Path,
    tol: float,
    sp_tol: float,
    cmp: Comparison,
    tols: list[float],
    ok: bool,
) -> None:
    rows, sim, errs = cmp.rows, cmp.simulated, cmp.errors()
    print(f"{hardware} against {table}")
    print(f"  {'row':<24}{'measured us':>12}{'simulated us':>14}{'error':>9}")
    for m, s, e, t in zip(rows, sim, errs, tols, strict=True):
        flag = "" if abs(e) <= t else f"  <- outside {100 * t:g}%"
        print(f"  {m.name:<24}{m.measured_us:>12.1f}{s:>14.2f}{100 * e:>8.1f}%{flag}")
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
