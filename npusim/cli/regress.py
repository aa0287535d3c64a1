"""`npusim compare` and `npusim check`: latency regressions, report against report and
scenario against baseline."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from npusim.cli.common import EXIT_FAIL, EXIT_OK, tolerance, workers
from npusim.errors import InputError


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    cmp = add(
        "compare",
        help="compare two reports (or baselines) op by op and "
        "phase by phase; exit 1 if B is slower than A beyond the tolerance",
    )
    cmp.add_argument("a", metavar="A.json", help="the reference report")
    cmp.add_argument("b", metavar="B.json", help="the report judged against A")
    cmp.add_argument(
        "--tolerance",
        default="5%",
        help="allowed slow-down of a latency or phase duration (default 5%%)",
    )
    cmp.add_argument(
        "--strict", action="store_true", help="also exit 1 when B is faster beyond the tolerance"
    )
    cmp.set_defaults(func=cmd_compare)

    chk = add(
        "check", help="run scenarios and compare each with its baseline (latency regression check)"
    )
    chk.add_argument(
        "--baselines",
        default="reports/baselines",
        metavar="DIR",
        help="baseline folder (default reports/baselines)",
    )
    chk.add_argument(
        "--scenarios",
        nargs="+",
        metavar="SCENARIO.yaml",
        help="scenario files or glob patterns (default scenarios/*.yaml)",
    )
    chk.add_argument(
        "--tolerance",
        default="2%",
        help="allowed slow-down of a latency or phase duration (default 2%%)",
    )
    chk.add_argument(
        "--update",
        action="store_true",
        help="rewrite the baselines from this run (on purpose: see docs/report.md)",
    )
    chk.add_argument(
        "--strict",
        action="store_true",
        help="also fail when a scenario got faster beyond the tolerance",
    )
    chk.add_argument("--workers", default=None, help="parallel processes (default 1)")
    chk.set_defaults(func=cmd_check)


def cmd_compare(args: argparse.Namespace) -> int:
    from npusim.report.compare import compare_profiles, format_comparison, load_profile

    tol = tolerance(args.tolerance, "--tolerance")
    a, b = load_profile(args.a), load_profile(args.b)
    cmp = compare_profiles(a, b, tol)
    print(format_comparison(cmp), end="")
    if cmp.regressed or (args.strict and cmp.changed):
        return EXIT_FAIL
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from npusim.check import expand, run_check

    tol = tolerance(args.tolerance, "--tolerance")
    n_workers = workers(args.workers) or 1
    if args.update:
        from npusim.outputs import output_folder

        output_folder(args.baselines, "--baselines")
    elif not Path(args.baselines).is_dir():
        raise InputError(
            "command line",
            "--baselines",
            f"no baseline folder {args.baselines} "
            "here; npusim check compares a clone's scenarios/ with its "
            "reports/baselines/: run it at the top of a clone of npusim, or pass "
            "--baselines DIR and --scenarios FILE...",
        )
    patterns = args.scenarios or ["scenarios/*.yaml"]
    paths = expand(patterns)
    if not paths:
        raise InputError(
            "command line", "--scenarios", f"no scenario file matches {' '.join(patterns)}"
        )
    return run_check(
        paths,
        Path(args.baselines),
        tol,
        update=args.update,
        strict=args.strict,
        workers=n_workers,
        emit=lambda line: print(line, flush=True),
    )
