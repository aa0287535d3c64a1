"""`npusim sweep` and `npusim plot`: a base scenario over axes of values, and its figure."""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli.common import EXIT_OK, count, workers
from npusim.errors import InputError

if TYPE_CHECKING:
    from npusim.calibrate import Measurement


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
    plo.add_argument("--logx", action="store_true", help="a log2 x axis (sizes that double)")
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
        marks = _published_points(Path(args.published), args.axis) if args.published else None
        path = plot_sweep(src, args.axis, out, args.group, marks, args.logx)
    else:
        report = read_json(src)
        if not isinstance(report, dict) or "ops" not in report:
            raise InputError(str(src), None, "not a report.json (no ops)")
        path = plot_report(report, out)
    print(f"figure: {path}")
    return EXIT_OK


def _published_points(table: Path, axis: str | None = None
                      ) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """A calibration table's measured rows as (op, series) -> [(x, us)], for the plot.

    x is the row's value of the plot's axis (a workload key; default the batch size), so
    rows without it are left out. A latency row's y is its time; a bandwidth row's, the
    time its `total_bytes` take at the measured rate (the benchmark's GB/s is those bytes
    over that time; rows whose figure counts other bytes are left out). A row's series is
    its variant (cann_sample: the quantisation), or for a kernel without one its label up
    to the last `_` (a table's series: hixl_1server_fabric_aicpu_D2rD_16K and _2M)."""
    from npusim.calibrate import read_table

    key = axis.removeprefix("workload.") if axis else "bs"
    marks: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for m in read_table(table):
        y = _published_us(m)
        if key in m.workload and y is not None:
            marks[(m.op, _series(m))].append((float(m.workload[key]), y))
    return marks


def _published_us(m: Measurement) -> float | None:
    """The row's time in us (None: a bandwidth figure of no stated byte count)."""
    if not m.bandwidth:
        return m.measured
    nbytes = m.workload.get("total_bytes")
    return nbytes / m.measured / 1000.0 if nbytes else None


def _series(m: Measurement) -> str:
    """The series a row's point belongs to (see _published_points)."""
    if m.quant != "-" or not m.label:
        return m.quant
    return m.label.rpartition("_")[0] or m.label
