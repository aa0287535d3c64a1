"""`npusim sweep` and `npusim plot`: a base scenario over axes of values, and its figure."""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from npusim.cli.common import EXIT_OK, count, workers
from npusim.errors import InputError


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    swp = add(
        "sweep",
        help="run a base scenario over axes of values in parallel; "
        "resumes, writes one report per point and results.csv",
    )
    swp.add_argument("sweep", metavar="SWEEP", help="a sweep file, or the name of a shipped one")
    swp.add_argument("--out", metavar="DIR", help="output folder (default out/sweeps/<file>)")
    swp.add_argument("--workers", default=None, help="parallel processes")
    swp.add_argument(
        "--backend",
        default="processes",
        help="processes (default) or ray (the cluster in RAY_ADDRESS, else a local Ray instance)",
    )
    swp.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (finished points, points done of total)",
    )
    swp.add_argument(
        "--max-points",
        metavar="N",
        help="refuse a sweep of more points, counted before any is built "
        "(default 10,000: npusim.sweep.MAX_POINTS)",
    )
    swp.set_defaults(func=cmd_sweep)

    plo = add(
        "plot",
        help="figure from a sweep results.csv (latency vs an axis, "
        "phases stacked) or a report.json (per-rank phase bars)",
    )
    plo.add_argument("input", metavar="results.csv|report.json")
    plo.add_argument("--axis", help="sweep axis for the x axis (default: the first)")
    plo.add_argument("--group", help="sweep axis that splits the panels")
    plo.add_argument("--published", metavar="CSV", help="measured points to overlay")
    plo.add_argument("--out", metavar="PNG", help="output file (default beside the input)")
    plo.set_defaults(func=cmd_plot)


def cmd_sweep(args: argparse.Namespace) -> int:
    from npusim.outputs import check_writable, output_folder
    from npusim.shipped import resolve
    from npusim.sweep import MAX_POINTS, run_sweep

    n_workers = workers(args.workers)
    path = resolve(args.sweep, sweep=True)
    out = output_folder(
        Path("out") / "sweeps" / Path(path).stem if args.out is None else args.out,
        "--out",
        ("results.csv",),
    )
    check_writable(out, folder=True)  # before any point runs
    csv_path = run_sweep(
        path,
        out,
        n_workers,
        args.backend,
        quiet=args.quiet,
        max_points=MAX_POINTS
        if args.max_points is None
        else count(args.max_points, "--max-points"),
    )
    print(f"results: {csv_path}")
    return EXIT_OK


def cmd_plot(args: argparse.Namespace) -> int:
    from npusim.outputs import output_file
    from npusim.report.compare import read_json
    from npusim.report.plot import plot_report, plot_sweep

    src = Path(args.input)
    if not src.is_file():
        raise InputError(str(src), None, "file not found")
    out = output_file(src.with_suffix(".png") if args.out is None else args.out, "--out")
    if src.suffix == ".csv":
        marks = _published_points(Path(args.published)) if args.published else None
        path = plot_sweep(src, args.axis, out, args.group, marks)
    else:
        report = read_json(src)
        if not isinstance(report, dict) or "ops" not in report:
            raise InputError(str(src), None, "not a report.json (no ops)")
        path = plot_report(report, out)
    print(f"figure: {path}")
    return EXIT_OK


def _published_points(table: Path) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """A calibration table's measured rows as (op, quant) -> [(BS, us)], for the plot."""
    from npusim.calibrate import read_table

    marks: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for m in read_table(table):
        # rows of families without a batch size have no BS axis; the plot's is latency
        if "bs" in m.workload and not m.bandwidth:
            marks[(m.op, m.quant)].append((float(m.workload["bs"]), m.measured))
    return marks
