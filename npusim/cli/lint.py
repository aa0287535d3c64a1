"""`npusim lint`: check scenario and sweep files without running them (and without
importing a user's kernel file)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from npusim.cli.common import EXIT_INPUT, EXIT_OK, err, one_line
from npusim.errors import InputError


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    lint = add("lint", help="check scenario and sweep files without running them")
    lint.add_argument(
        "scenarios",
        nargs="+",
        metavar="SCENARIO",
        help="scenario or sweep files, or names of shipped ones",
    )
    lint.add_argument("--case-dir", metavar="CASE", help="check against this case directory")
    lint.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a dotted scenario key in every scenario file (as npusim run "
        "--set; not with a sweep file)",
    )
    lint.set_defaults(func=cmd_lint)


def cmd_lint(args: argparse.Namespace) -> int:
    status = EXIT_OK
    for path in args.scenarios:
        try:
            sweep = sweep_path(path)
            line = _lint_scenario(path, args) if sweep is None else _lint_sweep(sweep, path, args)
        except InputError as exc:
            err(f"npusim: error: {one_line(str(exc))}")
            status = EXIT_INPUT
            continue
        print(line)
    return status


def sweep_path(arg: str) -> str | None:
    """The sweep file a SCENARIO argument names, None if it names none: an existing file
    whose mapping has a sweep's `base` or `axes`, or the name of a shipped sweep."""
    from npusim.hw.config import read_yaml_mapping
    from npusim.paths import user_path
    from npusim.shipped import resolve

    p = user_path(arg) if arg and "\x00" not in arg else None
    if p is not None and p.exists():
        try:
            doc = read_yaml_mapping(p) if p.is_file() else {}
        except InputError:
            return None  # the scenario loader says what is wrong with it
        return arg if "base" in doc or "axes" in doc else None
    try:
        return resolve(arg, sweep=True)
    except InputError:
        return None


def _lint_scenario(path: str, args: argparse.Namespace) -> str:
    from npusim.dotted import load_scenario_set
    from npusim.shipped import resolve

    sc = load_scenario_set(
        resolve(path), args.set, case_dir_override=args.case_dir, import_kernels=False
    )
    w = sc.workload
    unchecked = (
        ""
        if w.family is not None
        else (
            "; its own options, shape limits and window fit are checked when it runs (not imported)"
        )
    )
    return f"ok  {path}  ({w.kernel} {w.op}, {_runs(w)}on {sc.hardware.name}{unchecked})"


def _runs(w: Any) -> str:
    """What the scenario runs at: its MoE shape, or a family without one its own options."""
    from npusim.report.summary import family_options

    s = w.shape
    if s is not None:
        return f"W={s.W}, BS={s.BS}, H={s.H}, K={s.K}, L={s.L}, "
    own = family_options(w.to_dict())
    return f"{own}, " if own else ""


def _lint_sweep(sweep: str, path: str, args: argparse.Namespace) -> str:
    """A sweep file checked as `npusim sweep` checks it before running: its keys, its
    base scenario, its axes, and every point as a full scenario; nothing runs."""
    from npusim.sweep import MAX_POINTS, load_sweep

    for option, given in (("--set", args.set), ("--case-dir", args.case_dir)):
        if given:
            raise InputError(
                "command line",
                option,
                f"applies to scenario files; {path} is a "
                "sweep file (set the key in its base or as an axis)",
            )
    name, points = load_sweep(sweep, MAX_POINTS, import_kernels=False)
    axes = ", ".join(points[0].values) if points else ""
    return f"ok  {path}  (sweep {name}: {len(points)} point(s) over {axes})"
