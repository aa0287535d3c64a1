"""`npusim calibrate`: fit free preset parameters to a measurement table and write the
fitted preset with its fit report (npusim.calibrate does the fit)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npusim.cli.common import EXIT_OK, count, workers
from npusim.cli.tables import add_table_options, table_args
from npusim.errors import InputError

if TYPE_CHECKING:
    from npusim.calibrate import FitResult, FreeParameter, Measurement


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    cal = add("calibrate", help="fit free preset parameters to measured latencies")
    add_table_options(cal)
    cal.add_argument(
        "--param",
        action="append",
        metavar="KEY[,KEY]=LOW:HIGH",
        help="a parameter to fit within bounds; keys joined by ',' share a value",
    )
    cal.add_argument("--out", required=True, metavar="PRESET.yaml", help="the fitted preset")
    cal.add_argument("--report", metavar="FIT.json", help="fit report (default beside --out)")
    cal.add_argument(
        "--max-evals",
        default="200",
        help="trial points of the fit (scipy's max_nfev); each accepted point "
        "also simulates the table once per parameter for its Jacobian",
    )
    cal.add_argument(
        "--hold-out",
        action="append",
        metavar="ROW",
        help="leave rows out of the fit (name or fnmatch pattern, e.g. "
        "'rms_norm_quant_step[2-6]'; repeatable) and report their "
        "predictions at the fitted values",
    )
    cal.add_argument(
        "--loo",
        nargs="?",
        const="refit",
        choices=("refit", "linear"),
        help="also leave-one-out errors: each row predicted by a refit to the "
        "others (refit, the default), or by that refit's first step from "
        "the fit's own Jacobian (linear: one simulation per row)",
    )
    cal.add_argument("--workers", default=None, help="parallel processes")
    cal.add_argument(
        "--quiet",
        action="store_true",
        help="no line per evaluation or leave-one-out refit while fitting",
    )
    cal.set_defaults(func=cmd_calibrate)


@dataclass
class _Job:
    """A calibration's inputs, every one checked before the first simulation."""

    params: list[FreeParameter]
    max_evals: int
    workers: int | None
    hardware: str
    table: str
    rows: list[Measurement]  # fitted
    held: list[Measurement]  # --hold-out: predicted at the fitted values
    hw_path: Path
    start: dict[str, float]
    out: Path
    report_path: Path


def _job(args: argparse.Namespace) -> _Job:
    from npusim.calibrate import check_params, current_values, parse_param
    from npusim.hw.config import read_yaml_mapping, resolve_preset
    from npusim.outputs import output_file

    if not args.param:
        raise InputError("command line", "--param", "name at least one KEY=LOW:HIGH to fit")
    params = [parse_param(p) for p in args.param]
    max_evals = count(str(args.max_evals), "--max-evals")
    n_workers = workers(args.workers)
    hardware, table, rows = table_args(args)
    check_params(params, hardware)
    rows, held = _hold_out(rows, args.hold_out or [])
    hw_path = resolve_preset(hardware)
    start = current_values(read_yaml_mapping(hw_path), params)
    out = output_file(args.out, "--out")
    report_path = (
        output_file(args.report, "--report")
        if args.report is not None
        else output_file(out.with_suffix(".fit.json"), "--out")
    )
    return _Job(params, max_evals, n_workers, hardware, table, rows, held, hw_path, start, out,
                report_path)


def _hold_out(rows: list, patterns: list[str]) -> tuple[list, list]:
    """Split the table: rows whose name matches a --hold-out pattern (fnmatch) are left
    out of the fit and predicted with its values; each pattern must match a row."""
    from fnmatch import fnmatchcase

    names = [m.name for m in rows]
    for pat in patterns:
        if not any(fnmatchcase(n, pat) for n in names):
            raise InputError(
                "command line", "--hold-out", f"{pat!r} matches no row; rows: {', '.join(names)}"
            )
    held = [m for m in rows
            if m.use == "predict" or any(fnmatchcase(m.name, p) for p in patterns)]
    kept = [m for m in rows if m not in held]
    if not kept:
        raise InputError("command line", "--hold-out", "leaves no row to fit (rows whose use "
                         "is predict are never fitted)")
    return kept, held


def cmd_calibrate(args: argparse.Namespace) -> int:
    from npusim.calibrate import compare, fit, simulate_table
    from npusim.calibrate.report import fit_report, fit_summary

    job = _job(args)
    print(
        f"fitting {len(job.params)} parameter(s) to {len(job.rows)} row(s) of {job.table}"
        + (f" ({len(job.held)} held out)" if job.held else "")
    )
    result = fit(
        job.rows,
        job.hardware,
        job.params,
        job.start,
        str(job.table),
        max_evals=job.max_evals,
        workers=job.workers,
        progress=None if args.quiet else _evaluation_line(job.rows),
    )
    if args.loo:
        result.loo = _leave_one_out(args.loo, args.quiet, job, result)
    held_sim = (
        simulate_table(job.held, job.hardware, result.overrides(), str(job.table), job.workers)
        if job.held
        else []
    )
    report = fit_report(
        job.hw_path,
        job.table,
        job.params,
        result,
        compare(job.rows, result.simulated),
        job.held,
        held_sim,
    )
    _write(job, result, report)
    for line in fit_summary(report, job.params, result):
        print(line)
    print(f"preset: {job.out}\nfit report: {job.report_path}")
    return EXIT_OK


def _evaluation_line(rows: list[Measurement]) -> Callable[..., None]:
    """The fit's progress: a line per evaluation of the table, with the best values."""
    from npusim.calibrate import compare

    def progress(n: int, sim: list[float], best: dict[str, float] | None) -> None:
        cmp = compare(rows, sim)
        mark = (
            "  (best so far: " + ", ".join(f"{k}={v:.4g}" for k, v in best.items()) + ")"
            if best
            else ""
        )
        print(f"  evaluation {n}: MAPE {100 * cmp.mape():.2f}%{mark}", flush=True)

    return progress


def _leave_one_out(how: str, quiet: bool, job: _Job, result: FitResult) -> list[dict[str, Any]]:
    """--loo refit or linear, with a line per held-out row unless quiet."""
    from npusim.calibrate import leave_one_out, leave_one_out_linear

    what = (
        "refits, each without one row"
        if how == "refit"
        else "first refit steps (linear, from the fit's Jacobian), each without one row"
    )
    print(f"leave-one-out: {len(job.rows)} {what}")

    def held_out(e: dict) -> None:
        print(
            f"  {e['row']}: predicted {e['predicted']:.2f} {e['unit']}, measured "
            f"{e['measured']:.2f} {e['unit']} ({100 * e['error']:+.1f}%), "
            f"{e['evaluations']} evaluations",
            flush=True,
        )

    loo = leave_one_out if how == "refit" else leave_one_out_linear
    return loo(
        job.rows,
        job.hardware,
        job.params,
        result,
        str(job.table),
        workers=job.workers,
        progress=None if quiet else held_out,
    )


def _write(job: _Job, result: FitResult, report: dict[str, Any]) -> None:
    """The fitted preset and its fit report, together or neither; the preset must load."""
    from datetime import date

    from npusim.calibrate import fit_provenance, rewrite_preset
    from npusim.hw.config import load_hardware
    from npusim.outputs import OutputSet
    from npusim.report.io import dumps_json, write_text_atomic

    provenance = fit_provenance(
        job.params, str(job.table), str(job.report_path), date.today().isoformat()
    )
    text = rewrite_preset(job.hw_path.read_text(), result.overrides(), provenance)
    report_text = dumps_json(report)  # both texts whole before any folder is made
    made = _missing_folders((job.report_path, job.out))
    try:
        with OutputSet() as outs:  # the fit report and the preset appear together
            write_text_atomic(outs.file(job.report_path), report_text)
            staged = write_text_atomic(outs.file(job.out), text)
            try:  # the preset must load, before either is placed
                load_hardware(str(staged))
            except InputError as exc:
                raise InputError(str(job.out), exc.key, exc.message) from None
            outs.commit()
    except BaseException:
        for folder in made:  # made for outputs that never came: not left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _missing_folders(files: tuple[Path, ...]) -> list[Path]:
    """The folders the files need that do not exist yet, deepest first."""
    out: list[Path] = []
    for f in files:
        out += [d for d in f.absolute().parents if not d.exists() and d not in out]
    return sorted(out, key=lambda d: len(d.parts), reverse=True)
