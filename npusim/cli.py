"""The `npusim` command.

Exit codes (docs/report.md): 0 ok; 1 a check failed (compare, check, validate) or the
environment did; 2 bad input (scenario, preset, case directory, kernel file, command
line, output path) reported as one line, no traceback, no output files; 3 the simulated
kernel failed (sanitiser error, an exception in its program, deadlock, simulated-time or
wall-clock limit); 130 interrupted, saying what it left. --debug adds the traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npusim import __version__, advise_cmd
from npusim.errors import BlockedError, InputError, KernelError, NpusimError

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_KERNEL = 0, 1, 2, 3


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _err(text: str) -> None:
    print(text, file=sys.stderr)


RUN_FILES = ("report.json", "report.md", "trace.json", "blocked.txt")


def _out_dir(arg: str | None, scenario_name: str) -> Path:
    from npusim.outputs import output_folder

    return output_folder(Path("out") / scenario_name if arg is None else arg, "--out",
                         RUN_FILES)


def cmd_run(args: argparse.Namespace) -> int:
    from npusim import api
    from npusim.dotted import load_scenario_set
    from npusim.progress import RunProgress, watching
    from npusim.report.io import blocked_list_in
    from npusim.report.summary import format_summary
    from npusim.shipped import resolve

    scenario = load_scenario_set(resolve(args.scenario), args.set, case_dir_override=args.case_dir)
    out_dir = _out_dir(args.out, scenario.name)
    tensors = _tensors_dir(args.tensors)
    harness_csv = _harness_csv(args.harness_csv, scenario)
    try:
        from npusim.sim import default_workers
    except ModuleNotFoundError as exc:
        if exc.name not in ("npusim.sim",):
            raise
        _err("npusim: error: the simulator (npusim.sim) is not installed in this build")
        return EXIT_FAIL
    from npusim.footprint import limit_bytes, too_big

    workers = _workers(args.workers) or default_workers()
    limit, how = limit_bytes(args.memory)
    problem = too_big(scenario, limit, how, workers)
    if problem:  # before anything is allocated
        _err(f"npusim: error: {problem}")
        return EXIT_FAIL
    watch = None if args.quiet else RunProgress(len(scenario.workload.ops))
    with blocked_list_in(out_dir), watching(watch):
        done = api.run(scenario, trace=bool(args.trace), workers=workers,
                       progress=watch.begin_op if watch else None,
                       keep_inputs=tensors is not None)
    result, report = done.result, done.report
    written = done.write(out_dir, trace=bool(args.trace), tensors=tensors,
                         harness_csv=harness_csv)  # every output at once, or none
    lines = [f"{what}: {path}" + (f" {note}" if note else "") for what, path, note in written]
    if result.combine_ahead.startswith("redone"):
        print(f"npusim: note: combine was {result.combine_ahead}", file=sys.stderr)
    print(format_summary(report), end="")
    print("\n".join(lines))
    return EXIT_OK


def _harness_csv(arg: str | None, scenario: object) -> Path | None:
    """--harness-csv FILE: a file path whose folder exists, for a family that profiles
    its kernels' frames (Kernel.profiles), checked before the run."""
    if arg is None:
        return None
    from npusim.outputs import output_file, refuse_special
    from npusim.report.harness_csv import csv_paths

    p = output_file(arg, "--harness-csv")
    if not p.parent.is_dir():
        raise InputError("command line", "--harness-csv", f"folder {p.parent} does not exist")
    w = scenario.workload  # type: ignore[attr-defined]
    fam = w.family
    ops = [k.name for k in (fam.kernels_of(w.op) if fam is not None else ())
           if k.profiles]
    if not ops:
        raise InputError("command line", "--harness-csv", f"kernel family {w.kernel!r} "
                         "records no harness frames; allowed with shmem_classic (the SHMEM "
                         "examples' --perf CSV)")
    for q in csv_paths(p, ops):
        refuse_special(q, "command line", "--harness-csv")
    return p


def _tensors_dir(arg: str | None) -> Path | None:
    if arg is None:
        return None
    from npusim.outputs import output_folder

    return output_folder(arg, "--tensors")


def cmd_lint(args: argparse.Namespace) -> int:
    from npusim.dotted import load_scenario_set
    from npusim.shipped import resolve

    status = EXIT_OK
    for path in args.scenarios:
        try:
            sc = load_scenario_set(resolve(path), args.set, case_dir_override=args.case_dir,
                                   import_kernels=False)
        except InputError as exc:
            _err(f"npusim: error: {_one_line(str(exc))}")
            status = EXIT_INPUT
            continue
        w = sc.workload
        unchecked = "" if w.family is not None else ("; its own options, shape limits and "
                                                     "window fit are checked when it runs "
                                                     "(not imported)")
        print(
            f"ok  {path}  ({w.kernel} {w.op}, W={w.ep_world_size}, BS={w.bs}, H={w.h}, "
            f"K={w.k}, L={w.experts_per_rank}, on {sc.hardware.name}{unchecked})"
        )
    return status


def _tolerance(text: str, option: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise InputError("command line", option, f"{text!r}: expected a number or a percentage"
                         ) from None
    if not math.isfinite(value) or value < 0:
        raise InputError("command line", option, f"{text[:40]!r}: allowed: a finite number "
                         ">= 0 or a percentage (5%)")
    return value


def _count(text: str, option: str) -> int:
    """A whole number >= 1 given on the command line."""
    try:
        value = int(text) if len(text) <= 18 else 0
    except ValueError:
        value = 0
    if value < 1:
        raise InputError("command line", option, f"{text[:40]!r}: allowed: a whole number "
                         ">= 1")
    return value


def _workers(text: str | None) -> int | None:
    """--workers N: a whole number >= 1 (None: the command's default)."""
    return None if text is None else _count(text, "--workers")


def _table_args(args: argparse.Namespace) -> tuple[str, Path, list]:
    from npusim.calibrate import default_table, read_table
    from npusim.hw.config import load_hardware
    from npusim.msprof import is_op_summary, read_measurements

    name = load_hardware(args.hardware).name  # a fitted copy keeps its preset's name
    table = Path(args.table) if args.table else default_table(name)
    if not args.table and not table.exists():
        raise InputError("command line", "--table",
                         f"no published table for {name} ({table}); pass --table CSV")
    if args.map:
        return args.hardware, table, read_measurements(table, Path(args.map))
    if is_op_summary(table):
        raise InputError(str(table), None, "is an msprof op_summary: pass --map MAPPING.yaml "
                         "(its op names to scenarios; docs/calibration.md)")
    return args.hardware, table, read_table(table)


def cmd_validate(args: argparse.Namespace) -> int:
    import json

    from npusim.calibrate import compare, simulate_table

    tol = _tolerance(args.tolerance, "--tolerance")
    sp_tol = _tolerance(args.speedup_tolerance, "--speedup-tolerance")
    workers = _workers(args.workers)
    hardware, table, rows = _table_args(args)
    sim = simulate_table(rows, hardware, {}, str(table), workers)
    cmp = compare(rows, sim)
    errs = cmp.errors()
    tols = [tol if m.tolerance is None else m.tolerance for m in rows]
    bad_rows = [m.name for m, e, t in zip(rows, errs, tols, strict=True) if abs(e) > t]
    bad_sp = [sp for sp in cmp.speedups if abs(sp["simulated"] - sp["measured"]) > sp_tol]
    if args.json:
        print(json.dumps({
            "hardware": hardware, "table": str(table), "tolerance": tol,
            "rows": [{"row": m.name, **m.workload, "measured_us": m.measured_us,
                      "simulated_us": round(s, 4), "error": round(e, 6), "tolerance": t}
                     for m, s, e, t in zip(rows, sim, errs, tols, strict=True)],
            "mape": round(cmp.mape(), 6),
            "speedups": [{**sp, "simulated": round(sp["simulated"], 4),
                          "measured": round(sp["measured"], 4)} for sp in cmp.speedups],
            "ok": not bad_rows and not bad_sp,
        }, indent=2))
    else:
        print(f"{hardware} against {table}")
        print(f"  {'row':<24}{'measured us':>12}{'simulated us':>14}{'error':>9}")
        for m, s, e, t in zip(rows, sim, errs, tols, strict=True):
            flag = "" if abs(e) <= t else f"  <- outside {100 * t:g}%"
            print(f"  {m.name:<24}{m.measured_us:>12.1f}{s:>14.2f}{100 * e:>8.1f}%{flag}")
        own = sorted({t for m, t in zip(rows, tols, strict=True) if m.tolerance is not None})
        print(f"  MAPE {100 * cmp.mape():.2f}% (tolerance per row {100 * tol:g}%"
              + "".join(f", {100 * t:g}% where the table says so" for t in own) + ")")
        for sp in cmp.speedups:
            d = sp["simulated"] - sp["measured"]
            flag = "" if abs(d) <= sp_tol else "  <- outside"
            print(f"  speed-up {sp['label']}: measured "
                  f"{sp['measured']:.2f}, simulated {sp['simulated']:.2f} ({d:+.2f}){flag}")
    return EXIT_FAIL if bad_rows or bad_sp else EXIT_OK


def _hold_out(rows: list, patterns: list[str]) -> tuple[list, list]:
    """Split the table: rows whose name matches a --hold-out pattern (fnmatch) are left
    out of the fit and predicted with its values; each pattern must match a row."""
    from fnmatch import fnmatchcase

    names = [m.name for m in rows]
    for pat in patterns:
        if not any(fnmatchcase(n, pat) for n in names):
            raise InputError("command line", "--hold-out",
                             f"{pat!r} matches no row; rows: {', '.join(names)}")
    held = [m for m in rows if any(fnmatchcase(m.name, p) for p in patterns)]
    kept = [m for m in rows if m not in held]
    if not kept:
        raise InputError("command line", "--hold-out", "leaves no row to fit")
    return kept, held


def cmd_calibrate(args: argparse.Namespace) -> int:
    from datetime import date

    from npusim.calibrate import (
        compare,
        current_values,
        fit,
        fit_provenance,
        leave_one_out,
        leave_one_out_linear,
        parse_param,
        rewrite_preset,
        simulate_table,
    )
    from npusim.hw.config import load_hardware, read_yaml_mapping, resolve_preset
    from npusim.outputs import OutputSet, output_file
    from npusim.report.io import write_json_atomic, write_text_atomic

    if not args.param:
        raise InputError("command line", "--param", "name at least one KEY=LOW:HIGH to fit")
    params = [parse_param(p) for p in args.param]
    workers = _workers(args.workers)
    hardware, table, rows = _table_args(args)
    rows, held = _hold_out(rows, args.hold_out or [])
    hw_path = resolve_preset(hardware)
    start = current_values(read_yaml_mapping(hw_path), params)
    out = output_file(args.out, "--out")
    report_path = output_file(args.report, "--report") if args.report is not None else \
        output_file(out.with_suffix(".fit.json"), "--out")

    def progress(n: int, sim: list[float], best: dict[str, float] | None) -> None:
        cmp = compare(rows, sim)
        mark = "  (best so far: " + ", ".join(f"{k}={v:.4g}" for k, v in best.items()) + ")" \
            if best else ""
        print(f"  evaluation {n}: MAPE {100 * cmp.mape():.2f}%{mark}", flush=True)

    print(f"fitting {len(params)} parameter(s) to {len(rows)} row(s) of {table}"
          + (f" ({len(held)} held out)" if held else ""))
    result = fit(rows, hardware, params, start, str(table), max_evals=args.max_evals,
                 workers=workers, progress=None if args.quiet else progress)
    if args.loo:
        how = ("refits, each without one row" if args.loo == "refit" else
               "first refit steps (linear, from the fit's Jacobian), each without one row")
        print(f"leave-one-out: {len(rows)} {how}")

        def held_out(e: dict) -> None:
            print(f"  {e['row']}: predicted {e['predicted_us']:.2f} us, measured "
                  f"{e['measured_us']:.2f} us ({100 * e['error']:+.1f}%), "
                  f"{e['evaluations']} evaluations", flush=True)

        loo = leave_one_out if args.loo == "refit" else leave_one_out_linear
        result.loo = loo(rows, hardware, params, result, str(table), workers=workers,
                         progress=None if args.quiet else held_out)
    held_sim = simulate_table(held, hardware, result.overrides(), str(table), workers) \
        if held else []
    provenance = fit_provenance(params, str(table), str(report_path), date.today().isoformat())
    text = rewrite_preset(hw_path.read_text(), result.overrides(), provenance)
    cmp = compare(rows, result.simulated)
    report = {
        "hardware": str(hw_path), "table": str(table), "evaluations": result.evaluations,
        "parameters": [{"keys": list(p.keys), "low": p.low, "high": p.high,
                        "start": result.start[p.name], "fitted": result.values[p.name]}
                       for p in params],
        "rows": [{"row": m.name, "measured_us": m.measured_us, "simulated_us": s,
                  "error": e} for m, s, e in zip(rows, result.simulated, cmp.errors(),
                                                  strict=True)],
        "mape": cmp.mape(),
        "speedups": cmp.speedups,
        "leave_one_out": result.loo,
        "held_out": [{"row": m.name, "measured_us": m.measured_us, "predicted_us": t,
                      "error": (t - m.measured_us) / m.measured_us}
                     for m, t in zip(held, held_sim, strict=True)],
        "pinned_by": result.pinned_by,
    }
    with OutputSet() as outs:  # the fit report and the preset appear together
        write_json_atomic(outs.file(report_path), report)
        write_text_atomic(outs.file(out), text)
        outs.commit()
    load_hardware(str(out))  # the written preset must load
    for p in params:
        print(f"  {p.name:<44} {result.start[p.name]:>10.4g} -> {result.values[p.name]:.4g}")
    for row in report["rows"]:
        print(f"  {row['row']:<24}{row['measured_us']:>10.1f}{row['simulated_us']:>10.2f}"
              f"{100 * row['error']:>8.1f}%")
    print(f"  MAPE {100 * cmp.mape():.2f}%")
    for r in result.loo:
        print(f"  leave-one-out {r['row']:<24} predicted {r['predicted_us']:.2f} "
              f"({100 * r['error']:+.1f}%)")
    for r in report["held_out"]:
        print(f"  held out (--hold-out) {r['row']:<24} predicted {r['predicted_us']:.2f}, "
              f"measured {r['measured_us']:.1f} ({100 * r['error']:+.1f}%)")
    print("which rows pin each parameter (share of its effect on the residuals):")
    for e in result.pinned_by:
        if e["total_elasticity"] < 0.01:
            note = "barely moved by any row: the prior holds it"
        else:
            note = f"{e['top_row']} {100 * e['top_share']:.0f}%"
            if e["top_share"] >= 0.8:
                note += "  <- one row alone"
        print(f"  {e['parameter']:<44} {note}")
    print(f"preset: {out}\nfit report: {report_path}")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from npusim.report.compare import compare_profiles, format_comparison, load_profile

    tol = _tolerance(args.tolerance, "--tolerance")
    a, b = load_profile(args.a), load_profile(args.b)
    cmp = compare_profiles(a, b, tol)
    print(format_comparison(cmp), end="")
    if cmp.regressed or (args.strict and cmp.changed):
        return EXIT_FAIL
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from npusim.check import expand, run_check

    tol = _tolerance(args.tolerance, "--tolerance")
    workers = _workers(args.workers) or 1
    if args.update:
        from npusim.outputs import output_folder

        output_folder(args.baselines, "--baselines")
    elif not Path(args.baselines).is_dir():
        raise InputError("command line", "--baselines", f"no baseline folder {args.baselines} "
                         "here; npusim check compares a clone's scenarios/ with its "
                         "reports/baselines/: run it at the top of a clone of npusim, or pass "
                         "--baselines DIR and --scenarios FILE...")
    patterns = args.scenarios or ["scenarios/*.yaml"]
    paths = expand(patterns)
    if not paths:
        raise InputError("command line", "--scenarios",
                         f"no scenario file matches {' '.join(patterns)}")
    return run_check(paths, Path(args.baselines), tol, update=args.update, strict=args.strict,
                     workers=workers, emit=lambda line: print(line, flush=True))


def cmd_sweep(args: argparse.Namespace) -> int:
    from npusim.outputs import output_folder
    from npusim.shipped import resolve
    from npusim.sweep import MAX_POINTS, run_sweep

    workers = _workers(args.workers)
    path = resolve(args.sweep, sweep=True)
    out = output_folder(Path("out") / "sweeps" / Path(path).stem if args.out is None
                        else args.out, "--out", ("results.csv",))
    csv_path = run_sweep(path, out, workers, args.backend, quiet=args.quiet,
                         max_points=MAX_POINTS if args.max_points is None else
                         _count(args.max_points, "--max-points"))
    print(f"results: {csv_path}")
    return EXIT_OK


def cmd_plot(args: argparse.Namespace) -> int:
    import json

    from npusim.outputs import output_file
    from npusim.report.plot import plot_report, plot_sweep

    src = Path(args.input)
    if not src.is_file():
        raise InputError(str(src), None, "file not found")
    out = output_file(src.with_suffix(".png") if args.out is None else args.out, "--out")
    if src.suffix == ".csv":
        table = Path(args.published) if args.published else None
        path = plot_sweep(src, args.axis, out, args.group, table)
    else:
        try:
            report = json.loads(src.read_text())
        except ValueError:
            raise InputError(str(src), None, "not JSON: expected results.csv or report.json"
                             ) from None
        if not isinstance(report, dict) or "ops" not in report:
            raise InputError(str(src), None, "not a report.json (no ops)")
        path = plot_report(report, out)
    print(f"figure: {path}")
    return EXIT_OK


def cmd_presets(args: argparse.Namespace) -> int:
    from npusim.hw.config import CONFIG_DIR, load_hardware, preset_names
    from npusim.hw.fabric import topology_text

    if args.explain:
        return _explain_preset(args.explain)
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
            f"{f'L2 {hw.l2.bytes >> 20} MiB, ' if hw.l2 and hw.l2.bytes else ''}"
            f"{topology_text(hw.fabric)}"
        )
    return EXIT_OK


def _explain_preset(name: str) -> int:
    """Every value of a preset with its unit and provenance, one wrapped row each."""
    import textwrap

    from npusim.hw.config import load_provenance, resolve_preset
    from npusim.hw.provenance import describe, number, sourced_problem

    path = resolve_preset(name)
    entries = load_provenance(name)
    kw = max(len(k) for k in entries)
    vw = max(len(number(v)) for v, _, _ in entries.values())
    uw = max(len(u) for _, u, _ in entries.values())
    lead = kw + vw + uw + 6
    print(f"{path}: {len(entries)} values")
    print(f"{'key':<{kw}}  {'value':>{vw}}  {'unit':<{uw}}  provenance")
    for key, (value, unit, prov) in entries.items():
        text = describe(value, unit, prov)
        if prov is not None and prov.kind == "sourced" and sourced_problem(value, unit, prov):
            text = f"(!) {sourced_problem(value, unit, prov)}. {text}"
        body = textwrap.wrap(text, width=max(40, 118 - lead)) or [""]
        print(f"{key:<{kw}}  {number(value):>{vw}}  {unit:<{uw}}  {body[0]}")
        for more in body[1:]:
            print(" " * lead + more)
    return EXIT_OK


def cmd_scenarios(args: argparse.Namespace) -> int:
    from npusim import shipped

    groups = (("scenarios (npusim run NAME)", shipped.scenarios()),
              ("sweeps (npusim sweep NAME)", shipped.sweeps()))
    width = max(len(n) for _, table in groups for n in table)
    print(f"shipped with npusim, in {shipped.scenarios_dir()}")
    for title, table in groups:
        print(f"{title}:")
        for name, path in table.items():
            print(f"  {name:<{width}}  {shipped.description(path)}".rstrip())
    return EXIT_OK


def build_parser(prog: str = "npusim") -> argparse.ArgumentParser:
    from npusim.oneline import OneLineParser

    parser = OneLineParser(
        prog=prog,
        description="Discrete-event simulator of Ascend NPUs running MoE dispatch/combine.",
    )
    parser.add_argument("--version", action="version", version=f"npusim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="on an error, print the Python traceback before the one-line "
                        "message (a kernel error: the traceback of the kernel's exception)")

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    run = add("run", help="run a scenario, print a summary, write DIR/report.json "
                         "and DIR/report.md")
    run.add_argument("scenario", metavar="SCENARIO", help="a scenario file, or the name of a "
                     "shipped one (npusim scenarios lists them)")
    run.add_argument("--out", metavar="DIR", help="output folder (default: out/<scenario name>)")
    run.add_argument("--case-dir", metavar="CASE", help="CANN-sample case directory to use")
    run.add_argument("--trace", action="store_true",
                     help="record pipe-level activity and write DIR/trace.json (Chrome trace)")
    run.add_argument("--memory", metavar="GIB|auto", default=None,
                     help="memory a functional run may use: GiB (default 24) or auto (this "
                     "machine's MemAvailable); a larger estimate stops before allocating")
    run.add_argument("--tensors", metavar="DIR",
                     help="write every op's GM inputs and outputs as DIR/<op>/rank_<r>/"
                     "in|out/<name>.npy")
    run.add_argument("--harness-csv", metavar="FILE",
                     help="write the SHMEM examples' --perf CSV rows (moe_perf_host.h columns) "
                     "of each op: FILE, or FILE_<op> when the run has several ops")
    run.add_argument("--workers", default=None,
                     help="processes for this run: with 2, a dispatch_combine run simulates "
                     "combine alongside dispatch (same result; default 2 when 2 CPUs are free)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="set a dotted scenario key (workload.bs=64, hardware_overrides."
                     "fabric.egress_gbps=50); VALUE is YAML; repeatable")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.set_defaults(func=cmd_run)

    lint = add("lint", help="check scenario files without running them")
    lint.add_argument("scenarios", nargs="+", metavar="SCENARIO",
                      help="scenario files or names of shipped ones")
    lint.add_argument("--case-dir", metavar="CASE", help="check against this case directory")
    lint.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="set a dotted scenario key in every file (as npusim run --set)")
    lint.set_defaults(func=cmd_lint)

    val = add("validate", help="simulate a table of measured latencies (default: "
                         "the published rows of the preset) and report the error per row")
    val.add_argument("--hardware", default="ascend950", help="preset name or YAML path")
    val.add_argument("--table", metavar="CSV", help="measurements (default configs/targets/"
                     "<preset>.csv)")
    val.add_argument("--map", metavar="MAPPING.yaml", help="--table is an msprof "
                     "op_summary CSV; this file maps its op names to scenarios")
    val.add_argument("--tolerance", default="5%", help="allowed error per row without its own "
                     "tolerance_pct in the table (default 5%%)")
    val.add_argument("--speedup-tolerance", default="0.05",
                     help="allowed error of each quantisation speed-up (default 0.05)")
    val.add_argument("--json", action="store_true", help="machine-readable output")
    val.add_argument("--workers", default=None, help="parallel processes")
    val.set_defaults(func=cmd_validate)

    cal = add("calibrate", help="fit free preset parameters to measured latencies")
    cal.add_argument("--hardware", default="ascend950", help="preset name or YAML path")
    cal.add_argument("--table", metavar="CSV", help="measurements (default configs/targets/"
                     "<preset>.csv)")
    cal.add_argument("--map", metavar="MAPPING.yaml", help="--table is an msprof "
                     "op_summary CSV; this file maps its op names to scenarios")
    cal.add_argument("--param", action="append", metavar="KEY[,KEY]=LOW:HIGH",
                     help="a parameter to fit within bounds; keys joined by ',' share a value")
    cal.add_argument("--out", required=True, metavar="PRESET.yaml", help="the fitted preset")
    cal.add_argument("--report", metavar="FIT.json", help="fit report (default beside --out)")
    cal.add_argument("--max-evals", type=int, default=200,
                     help="trial points of the fit (scipy's max_nfev); each accepted point "
                          "also simulates the table once per parameter for its Jacobian")
    cal.add_argument("--hold-out", action="append", metavar="ROW",
                     help="leave rows out of the fit (name or fnmatch pattern, e.g. "
                          "'rms_norm_quant_step[2-6]'; repeatable) and report their "
                          "predictions at the fitted values")
    cal.add_argument("--loo", nargs="?", const="refit", choices=("refit", "linear"),
                     help="also leave-one-out errors: each row predicted by a refit to the "
                          "others (refit, the default), or by that refit's first step from "
                          "the fit's own Jacobian (linear: one simulation per row)")
    cal.add_argument("--workers", default=None, help="parallel processes")
    cal.add_argument("--quiet", action="store_true",
                     help="no line per evaluation or leave-one-out refit while fitting")
    cal.set_defaults(func=cmd_calibrate)

    cmp = add("compare", help="compare two reports (or baselines) op by op and "
                         "phase by phase; exit 1 if B is slower than A beyond the tolerance")
    cmp.add_argument("a", metavar="A.json", help="the reference report")
    cmp.add_argument("b", metavar="B.json", help="the report judged against A")
    cmp.add_argument("--tolerance", default="5%",
                     help="allowed slow-down of a latency or phase duration (default 5%%)")
    cmp.add_argument("--strict", action="store_true",
                     help="also exit 1 when B is faster beyond the tolerance")
    cmp.set_defaults(func=cmd_compare)

    chk = add("check", help="run scenarios and compare each with its baseline "
                         "(latency regression check)")
    chk.add_argument("--baselines", default="reports/baselines", metavar="DIR",
                     help="baseline folder (default reports/baselines)")
    chk.add_argument("--scenarios", nargs="+", metavar="SCENARIO.yaml",
                     help="scenario files or glob patterns (default scenarios/*.yaml)")
    chk.add_argument("--tolerance", default="2%",
                     help="allowed slow-down of a latency or phase duration (default 2%%)")
    chk.add_argument("--update", action="store_true",
                     help="rewrite the baselines from this run (on purpose: see docs/report.md)")
    chk.add_argument("--strict", action="store_true",
                     help="also fail when a scenario got faster beyond the tolerance")
    chk.add_argument("--workers", default=None, help="parallel processes (default 1)")
    chk.set_defaults(func=cmd_check)

    swp = add("sweep", help="run a base scenario over axes of values in parallel; "
                         "resumes, writes one report per point and results.csv")
    swp.add_argument("sweep", metavar="SWEEP", help="a sweep file, or the name of a shipped one")
    swp.add_argument("--out", metavar="DIR", help="output folder (default out/sweeps/<file>)")
    swp.add_argument("--workers", default=None, help="parallel processes")
    swp.add_argument("--backend", default="processes", help="processes (default) or ray "
                     "(the cluster in RAY_ADDRESS, else a local Ray instance)")
    swp.add_argument("--quiet", action="store_true",
                     help="no progress on stderr (finished points, points done of total)")
    swp.add_argument("--max-points", metavar="N",
                     help="refuse a sweep of more points, counted before any is built "
                     "(default 10,000: npusim.sweep.MAX_POINTS)")
    swp.set_defaults(func=cmd_sweep)

    plo = add("plot", help="figure from a sweep results.csv (latency vs an axis, "
                         "phases stacked) or a report.json (per-rank phase bars)")
    plo.add_argument("input", metavar="results.csv|report.json")
    plo.add_argument("--axis", help="sweep axis for the x axis (default: the first)")
    plo.add_argument("--group", help="sweep axis that splits the panels")
    plo.add_argument("--published", metavar="CSV", help="measured points to overlay")
    plo.add_argument("--out", metavar="PNG", help="output file (default beside the input)")
    plo.set_defaults(func=cmd_plot)

    pre = add("presets", help="list the hardware presets in configs/, or explain "
                         "one: every value with its unit and provenance")
    pre.add_argument("--explain", metavar="NAME", help="a preset name or YAML path: print "
                     "every value with its unit and provenance (docs/presets.md)")
    pre.set_defaults(func=cmd_presets)

    scn = add("scenarios", help="list the shipped scenarios and sweeps (name and "
                         "description), to run by name")
    scn.set_defaults(func=cmd_scenarios)
    advise_cmd.add_parser(sub)
    return parser


def _guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Turn npusim's own errors into one stderr message and an exit code; with --debug,
    the traceback (and the exception a kernel error came from) first."""
    try:
        return func(args)
    except BrokenPipeError:
        raise  # a closed stdout (`| head`): main ends quietly
    except (Exception, KeyboardInterrupt) as exc:
        line, code = _one_line_of(exc)
        if code is None:
            raise
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exception(exc)
        _err(line)
        return code


def _one_line_of(exc: BaseException) -> tuple[str, int | None]:
    """The message and exit code for an exception npusim reports; code None: not one."""
    if isinstance(exc, InputError):
        return f"npusim: error: {_one_line(str(exc))}", EXIT_INPUT
    if isinstance(exc, BlockedError):  # the text starts with "deadlock" or "simulated-time"
        return f"npusim: {_one_line(str(exc))}", EXIT_KERNEL
    if isinstance(exc, KernelError):
        return f"npusim: kernel error: {_one_line(str(exc))}", EXIT_KERNEL
    if isinstance(exc, NpusimError):
        return f"npusim: error: {_one_line(str(exc))}", EXIT_KERNEL
    if isinstance(exc, MemoryError):
        why = _one_line(str(exc)) or "the run needs more memory"
        return (f"npusim: error: out of memory: {why}; allowed: a smaller workload (BS, W, H) "
                "on this machine", EXIT_FAIL)
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return f"npusim: error: cannot write or read{where}: {exc.strerror or exc}", EXIT_FAIL
    if isinstance(exc, KeyboardInterrupt):  # Interrupted says what the command left
        return f"npusim: interrupted{'; ' if str(exc) else ''}{exc}", 130
    return "", None


def _prog() -> str:
    """The name this was started as: npusim, or npusim-moe (the name CANN cannot shadow)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name in ("npusim", "npusim-moe") else "npusim"


BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _one_blas_thread() -> None:
    """One BLAS thread per process unless the user set one: the simulator is one thread,
    its parallelism is processes (--workers, sweeps), and numpy's idle BLAS threads only
    contend with them (a 256x128x256 matmul took 62 ms with two threads on a loaded
    2-core machine, 2.2 ms with one). Effective only before numpy is first imported."""
    if "numpy" in sys.modules:
        return
    for var in BLAS_THREAD_VARS:
        os.environ.setdefault(var, "1")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of the console scripts (npusim, npusim-moe) and of `python -m npusim`;
    returns the exit code."""
    from npusim.cann import SUBCOMMANDS, wrong_simulator

    _one_blas_thread()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:  # meant for CANN's NPU Simulator, also `npusim`
        _err(wrong_simulator(argv[0]))
        return EXIT_INPUT
    parser = build_parser(prog or _prog())
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
