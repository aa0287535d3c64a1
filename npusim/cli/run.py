"""`npusim run`: one scenario, its summary and its output files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from npusim.cli.common import EXIT_FAIL, EXIT_OK, err, workers
from npusim.report.io import RUN_FILES


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    run = add(
        "run", help="run a scenario, print a summary, write DIR/report.json and DIR/report.md"
    )
    run.add_argument(
        "scenario",
        metavar="SCENARIO",
        help="a scenario file, or the name of a shipped one (npusim scenarios lists them)",
    )
    run.add_argument("--out", metavar="DIR", help="output folder (default: out/<scenario name>)")
    run.add_argument("--case-dir", metavar="CASE", help="CANN-sample case directory to use")
    run.add_argument(
        "--trace",
        action="store_true",
        help="record pipe-level activity and write DIR/trace.json (Chrome trace)",
    )
    run.add_argument(
        "--memory",
        metavar="GIB|auto",
        default=None,
        help="memory a functional run may use: GiB (default 24) or auto (this "
        "machine's MemAvailable); a larger estimate stops before allocating",
    )
    run.add_argument(
        "--tensors",
        metavar="DIR",
        help="write every op's GM inputs and outputs as DIR/<op>/rank_<r>/in|out/<name>.npy",
    )
    run.add_argument(
        "--harness-csv",
        metavar="FILE",
        help="write the SHMEM examples' --perf CSV rows (moe_perf_host.h columns) "
        "of each op: FILE, or FILE_<op> when the run has several ops",
    )
    run.add_argument(
        "--workers",
        default=None,
        help="processes for this run: with 2, a dispatch_combine run simulates "
        "combine alongside dispatch (same result; default 2 when 2 CPUs are free)",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a dotted scenario key (workload.bs=64, hardware_overrides."
        "fabric.egress_gbps=50); VALUE is YAML; repeatable",
    )
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.add_argument(
        "--sensitivity",
        action="store_true",
        help="then rerun timing-only with each assumed preset value the run reads raised "
        "by 10%%: print each op's most sensitive ones, write DIR/sensitivity.json "
        "(docs/sensitivity.md)",
    )
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from npusim import api
    from npusim.cli.sensitivity import run_sensitivity, scenario_and_doc, stale_sensitivity
    from npusim.progress import RunProgress, watching
    from npusim.report.io import blocked_list_in
    from npusim.report.summary import format_summary
    from npusim.runfiles import check_run_writable, run_files
    from npusim.shipped import resolve

    scenario, source = scenario_and_doc(resolve(args.scenario), args.set, args.case_dir)
    files = run_files(scenario, Path("out") / scenario.name if args.out is None else args.out,
                      args.tensors, args.harness_csv)
    out_dir, tensors, harness_csv = files.out, files.tensors, files.harness_csv
    check_run_writable(files)
    n_workers = _run_workers(args, scenario)
    if n_workers is None:
        return EXIT_FAIL
    watch = None if args.quiet else RunProgress(len(scenario.workload.ops))
    with blocked_list_in(out_dir, RUN_FILES), watching(watch):
        done = api.run(
            scenario,
            trace=bool(args.trace),
            workers=n_workers,
            progress=watch.begin_op if watch else None,
            keep_inputs=tensors is not None,
        )
    result, report = done.result, done.report
    written = done.write(
        out_dir, trace=bool(args.trace), tensors=tensors, harness_csv=harness_csv
    )  # every output at once, or none
    stale_sensitivity(out_dir)
    lines = [f"{what}: {path}" + (f" {note}" if note else "") for what, path, note in written]
    if result.combine_ahead.startswith("redone"):
        print(f"npusim: note: combine was {result.combine_ahead}", file=sys.stderr)
    print(format_summary(report), end="")
    print("\n".join(lines))
    if args.sensitivity:
        print("\n".join(run_sensitivity(source, out_dir, n_workers, args.quiet)))
    return EXIT_OK


def _run_workers(args: argparse.Namespace, scenario: object) -> int | None:
    """The run's worker processes; None (said on stderr) when the simulator is missing
    or the run would not fit in the memory allowed (before anything is allocated)."""
    try:
        from npusim.sim import default_workers
    except ModuleNotFoundError as exc:
        if exc.name not in ("npusim.sim",):
            raise
        err("npusim: error: the simulator (npusim.sim) is not installed in this build")
        return None
    from npusim.footprint import limit_bytes, too_big

    n = workers(args.workers) or default_workers()
    limit, how = limit_bytes(args.memory)
    problem = too_big(scenario, limit, how, n)
    if problem:
        err(f"npusim: error: {problem}")
        return None
    return n
