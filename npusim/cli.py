"""The `npusim` command.

Exit codes: 0 ok; 1 internal or environment failure; 2 bad input (scenario, preset,
case directory, command line) reported as one line, no traceback, no output files;
3 the simulated kernel failed (sanitiser error, deadlock, simulated-time limit).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from npusim import __version__
from npusim.errors import DeadlockError, InputError, KernelError, NpusimError, SimTimeLimitError

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_KERNEL = 0, 1, 2, 3


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _out_dir(arg: str | None, scenario_name: str) -> Path:
    out = Path(arg) if arg else Path("out") / scenario_name
    if out.exists() and not out.is_dir():
        raise InputError("command line", "--out", f"{out} exists and is not a directory")
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from npusim.report.build import build_report
    from npusim.report.io import write_json_atomic
    from npusim.report.summary import format_summary
    from npusim.scenario import load_scenario

    scenario = load_scenario(args.scenario, case_dir_override=args.case_dir)
    out_dir = _out_dir(args.out, scenario.name)
    try:
        from npusim.sim import simulate
    except ModuleNotFoundError as exc:
        if exc.name not in ("npusim.sim",):
            raise
        _err("npusim: error: the simulator (npusim.sim) is not installed in this build")
        return EXIT_FAIL
    result = simulate(scenario, detailed_trace=bool(args.trace))
    report = build_report(result)
    path = write_json_atomic(out_dir / "report.json", report)
    print(format_summary(report), end="")
    print(f"report: {path}")
    return EXIT_OK


def cmd_lint(args: argparse.Namespace) -> int:
    from npusim.scenario import load_scenario

    status = EXIT_OK
    for path in args.scenarios:
        try:
            sc = load_scenario(path, case_dir_override=args.case_dir)
        except InputError as exc:
            _err(f"npusim: error: {_one_line(str(exc))}")
            status = EXIT_INPUT
            continue
        w = sc.workload
        print(
            f"ok  {path}  ({w.op}, W={w.ep_world_size}, BS={w.bs}, H={w.h}, K={w.k}, "
            f"L={w.experts_per_rank}, on {sc.hardware.name})"
        )
    return status


def cmd_presets(args: argparse.Namespace) -> int:
    from npusim.hw.config import CONFIG_DIR, load_hardware, preset_names

    names = preset_names()
    if not names:
        _err(f"npusim: error: no presets found in {CONFIG_DIR}")
        return EXIT_FAIL
    for name in names:
        try:
            hw = load_hardware(name)
        except InputError as exc:
            print(f"{name:<14} (invalid: {_one_line(str(exc))})")
            continue
        print(
            f"{name:<14} {hw.chip.aiv_cores} AIV cores, {hw.chip.clock_ghz:g} GHz, "
            f"UB {hw.ub.bytes // 1024} KiB, HBM {hw.hbm.bandwidth_gbps:g} GB/s, "
            f"fabric {hw.fabric.egress_gbps:g} GB/s out per die, "
            f"{hw.fabric.dies_per_package} die(s) per package"
        )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npusim",
        description="Discrete-event simulator of Ascend NPUs running MoE dispatch/combine.",
    )
    parser.add_argument("--version", action="version", version=f"npusim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run a scenario, print a summary, write DIR/report.json")
    run.add_argument("scenario", metavar="SCENARIO.yaml")
    run.add_argument("--out", metavar="DIR", help="output folder (default: out/<scenario name>)")
    run.add_argument("--case-dir", metavar="CASE", help="CANN-sample case directory to use")
    run.add_argument("--trace", action="store_true", help="record pipe-level activity too")
    run.set_defaults(func=cmd_run)

    lint = sub.add_parser("lint", help="check scenario files without running them")
    lint.add_argument("scenarios", nargs="+", metavar="SCENARIO.yaml")
    lint.add_argument("--case-dir", metavar="CASE", help="check against this case directory")
    lint.set_defaults(func=cmd_lint)

    pre = sub.add_parser("presets", help="list the hardware presets in configs/")
    pre.set_defaults(func=cmd_presets)
    return parser


def _guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Turn npusim's own errors into one stderr message and an exit code."""
    try:
        return func(args)
    except InputError as exc:
        _err(f"npusim: error: {_one_line(str(exc))}")
        return EXIT_INPUT
    except DeadlockError as exc:
        _err(f"npusim: deadlock: {str(exc).rstrip()}")  # the multi-line waiter listing
        return EXIT_KERNEL
    except KernelError as exc:
        _err(f"npusim: kernel error: {_one_line(str(exc))}")
        return EXIT_KERNEL
    except SimTimeLimitError as exc:
        _err(f"npusim: simulated-time limit: {_one_line(str(exc))}")
        return EXIT_KERNEL
    except NpusimError as exc:
        _err(f"npusim: error: {_one_line(str(exc))}")
        return EXIT_KERNEL
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        _err(f"npusim: error: cannot write or read{where}: {exc.strerror or exc}")
        return EXIT_FAIL
    except KeyboardInterrupt:
        _err("npusim: interrupted")
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2), --help / --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    try:
        return _guarded(args.func, args)
    except BrokenPipeError:  # e.g. `npusim presets | head -1`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
