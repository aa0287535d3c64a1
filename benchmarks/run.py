"""npusim's own speed: wall time, CPU time, simulated events, events per second and peak
memory for fixed scenarios, each in a fresh process (so peak RSS belongs to that scenario alone).

Each case runs as `npusim run` would: with --workers processes (default 2 where 2 CPUs are
free), so a dispatch_combine case simulates combine in a forked process alongside dispatch.
Then "cpu s" is the time of both processes (user + system), "sys s" its system part and
"faults" their minor page faults (first touches of memory: what the system time mostly is),
events/s counts the events of both over the wall time, and "peak MiB" adds the two
processes' peaks (an upper bound: both are alive at once).
--workers 1 gives the single-process figures.

    python benchmarks/run.py                 # the standard set
    python benchmarks/run.py --workers 1     # one process per run
    python benchmarks/run.py --json out.json # also write the figures as JSON
    python benchmarks/run.py --only bs256     # scenarios whose name contains 'bs256'
    python benchmarks/run.py --check benchmarks/baseline.json   # compare with a baseline
    python benchmarks/run.py --instructions --only bs8           # exact cost, no noise
    python benchmarks/run.py --scale --workers 1 --only w256     # the large-EP W 256 case
                                             # (loop timed before and after; the faster counts)
    python benchmarks/run.py --supernode --only ep32 # DeepEP normal mode, A3, EP 32, 4096
                                             # tokens (EP 64, 128: --only ep64, ep128)

--instructions counts the instructions each case's simulate() executes (in one process), with
valgrind's cachegrind (no cache simulation; about 40x slower than a plain run, so pick small
cases with --only). Unlike wall time, the count is the same from run to run (to about 1e-6)
on one machine and Python build, so it shows a 1% change that wall time (5-15% run-to-run
noise on a shared machine) cannot. Compare two checkouts by running the script with PYTHONPATH set
to the other one.

A baseline is the JSON of an earlier run. --check compares each case's wall time scaled by
this machine's plain simpy rate (so machines of different speed compare), prints the ratio
and the wall-time targets, and exits 1 when a case is slower than the baseline by more than
--slack (default 25%: single runs vary by 5-15% on a shared 2-core machine).

Also times a plain simpy loop of a known number of events on the same machine, so the
figures can be compared across machines (ratio to that baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = resource.getpagesize()

W8 = dict(ep_world_size=8, experts_per_rank=4, k=8, h=7168, dtype="float16")
CASES = {
    "dc_bs8_fp16": dict(op="dispatch_combine", bs=8, dispatch_quant="none",
                        combine_quant="none", **W8),
    "dc_bs8_quant": dict(op="dispatch_combine", bs=8, dispatch_quant="mxfp8",
                         combine_quant="int8", **W8),
    "dc_bs256_fp16": dict(op="dispatch_combine", bs=256, dispatch_quant="none",
                          combine_quant="none", **W8),
    "dc_bs256_quant": dict(op="dispatch_combine", bs=256, dispatch_quant="mxfp8",
                           combine_quant="int8", **W8),
    "dc_w64_bs128_quant_timing": dict(op="dispatch_combine", bs=128, dispatch_quant="mxfp8",
                                      combine_quant="int8", timing_only=True,
                                      ep_world_size=64, experts_per_rank=4, k=8, h=7168,
                                      dtype="float16"),
}


def _a3_ep(w: int, bs: int = 128) -> dict:
    """The large-EP case: Atlas A3, one expert per rank, INT8 dispatch, bf16, timing
    only, BS 128, K 8."""
    return dict(hardware="atlas_a3", op="dispatch_combine", bs=bs, h=7168, k=8,
                ep_world_size=w, experts_per_rank=1, dtype="bfloat16", dispatch_quant="int8",
                combine_quant="none", timing_only=True)


# The scale group (--scale): minutes each, so not run by default.
# W 768 runs at BS 80: at BS 128 one data state of the sample's window layout would need
# 782 MiB (768 experts x 128 tokens x the 7.5 KiB dispatch slot, plus combine's area) and
# holds 512 MiB, so the scenario check refuses it (BS 83 is the largest that fits).
SCALE = {f"a3_w{w}_bs{bs}_int8_timing": _a3_ep(w, bs) for w, bs in ((64, 128), (256, 128),
                                                                     (768, 80))}
CASES.update(SCALE)

# The supernode group (--supernode): DeepEP normal mode on the A3 at 4096 tokens per rank,
# timing only, from the shipped scenarios (a quarter of an hour to over an hour each, so never
# by default; one by its full name with --only). EP 128 has four times EP 32's selections.
SUPERNODE = {f"deepep_a3_normal_ep{w}_bs4096": f"scenarios/deepep/a3_normal_ep{w}_bs4096.yaml"
             for w in (32, 64, 128)}
LONG = {**SCALE, **SUPERNODE}
"""The cases that run for minutes: a progress line every 30 s, the loop timed again after."""
DEFAULT = [n for n in CASES if n not in SCALE]


def run_one(name: str, simulate_it: bool = True, workers: int = 1) -> dict:
    """Child process: simulate one case and report its figures (without simulate_it, only
    the imports and the scenario: the part an instruction count subtracts)."""
    from npusim.formats import tables
    from npusim.scenario import load_scenario, scenario_from_doc
    from npusim.sim import simulate

    if name in SUPERNODE:
        sc = load_scenario(ROOT / SUPERNODE[name])
    else:
        workload = dict(CASES[name])
        doc = {"name": name, "hardware": workload.pop("hardware", "ascend950"),
               "workload": workload}
        sc = scenario_from_doc(doc, f"benchmark {name}", ROOT)
    tables()  # ml_dtypes, built on first use, imported before the timing as it used to be
    if not simulate_it:
        return {"name": name}
    if name in LONG:
        _show_progress(name)
    before = _usage()
    t0 = time.perf_counter()
    result = simulate(sc, workers=workers)
    wall = time.perf_counter() - t0
    user, system, faults = (b - a for a, b in zip(before, _usage(), strict=True))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    forked = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"name": name, "workers": workers, "wall_s": wall, "cpu_s": user + system,
            "sys_s": system, "minor_faults": int(faults),
            "events": result.events, "events_per_s": result.events / wall,
            "peak_rss_mib": own / 1024, "peak_rss_forked_mib": forked / 1024,
            "combine_ahead": result.combine_ahead,
            "latency_us": {op.op: round((op.end_ns - op.start_ns) / 1000, 3)
                           for op in result.ops}}


def _show_progress(name: str, every_s: float = 30.0) -> None:
    """A line on stderr every `every_s` seconds while a long case runs: time and memory."""
    import threading

    t0 = time.perf_counter()

    def tick() -> None:
        while True:
            time.sleep(every_s)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"  {name}: {time.perf_counter() - t0:.0f} s, peak RSS {rss:.0f} MiB",
                  file=sys.stderr, flush=True)

    threading.Thread(target=tick, daemon=True).start()


def _usage() -> tuple[float, float, float]:
    """User seconds, system seconds and minor page faults of this process and of its reaped
    children (a forked combine). The system time is mostly first touches of memory, whose
    price depends on the machine more than on npusim (docs/performance.md, "First touches
    of memory")."""
    both = (resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN))
    return (sum(u.ru_utime for u in both), sum(u.ru_stime for u in both),
            sum(u.ru_minflt for u in both))


def simpy_baseline(n_events: int = 1_000_000) -> float:
    """Events per second of a bare simpy loop (one process, n timeouts) on this machine."""
    return simpy_rates(n_events)[0]


def simpy_rates(n_events: int = 1_000_000) -> tuple[float, float]:
    """The bare simpy loop's events per second by wall clock and by CPU clock. On a shared
    machine the wall rate falls with the load; the CPU rate much less, so a long run's CPU
    time in loops of the CPU rate is the steadier measure."""
    import simpy

    env = simpy.Environment()

    def ticker(env):
        for _ in range(n_events):
            yield env.timeout(1)

    env.process(ticker(env))
    t0, c0 = time.perf_counter(), time.process_time()
    env.run()
    return n_events / (time.perf_counter() - t0), n_events / (time.process_time() - c0)


def main() -> int:
    from npusim.oneline import OneLineParser

    ap = OneLineParser(prog=f"benchmarks/{Path(__file__).name}",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the cases whose name contains this text")
    ap.add_argument("--scale", action="store_true",
                    help="run the scale group (the large-EP Atlas A3 W 64/256/768 cases, minutes "
                         "each) instead of the standard set; --only picks among them")
    ap.add_argument("--supernode", action="store_true",
                    help="run the supernode group (DeepEP normal mode, A3, EP 32/64/128 at 4096 "
                         "tokens, timing only: a quarter of an hour to over an hour each) instead "
                         "of the standard set; --only picks among them")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--check", help="compare with this baseline JSON (exit 1 on a regression)")
    ap.add_argument("--slack", default="25%", help="allowed slowdown for --check (default 25%%)")
    ap.add_argument("--instructions", action="store_true",
                    help="count the instructions of each case's simulate() with valgrind")
    ap.add_argument("--workers", default=None,
                    help="processes per run, as npusim run --workers (default: as npusim run)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-sim", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, simulate_it=not args.no_sim,
                                 workers=int(args.workers or 1))))
        return 0
    if args.workers is None:
        from npusim.sim import default_workers

        args.workers = default_workers()
    elif not args.workers.isdigit() or int(args.workers) < 1:
        return _usage_error(f"--workers {args.workers}: allowed: 1 or more")
    args.workers = int(args.workers)
    if args.scale and args.supernode:
        return _usage_error("--scale with --supernode: allowed: one group per run")
    group = list(SCALE) if args.scale else list(SUPERNODE) if args.supernode else DEFAULT
    names = [n for n in group if not args.only or args.only in n]
    if not names and args.only in (*CASES, *SUPERNODE):  # a case outside the set, by name
        names = [args.only]
    if args.instructions:
        if shutil.which("valgrind") is None:
            return _usage_error("--instructions: valgrind is not on PATH; allowed: install "
                                "valgrind (e.g. apt install valgrind), or time without it")
        return count_instructions(names)
    ref = slack = None
    if args.check:  # checked before anything runs: a bad argument costs no benchmark
        try:
            slack = float(args.slack.rstrip("%")) / 100
        except ValueError:
            return _usage_error(f"--slack {args.slack!r}: not a number; allowed: a "
                                "percentage such as 25%")
        try:
            ref = json.loads(Path(args.check).read_text())
            ref_rows = {r["name"]: r for r in ref["cases"]}
            float(ref["plain_simpy_events_per_s"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _usage_error(f"--check {args.check}: not a baseline written by --json "
                                f"({type(exc).__name__}); allowed: a JSON file from "
                                "benchmarks/run.py --json")
    base, cpu_base = simpy_rates()
    rows = []
    print(f"plain simpy loop: {base:,.0f} events/s ({platform.processor() or platform.machine()}, "
          f"{_interpreter()})")
    fault_us = page_fault_us()
    print(f"workers per run: {args.workers}; a page's first touch: {fault_us:.1f} us")
    print(_builds())
    print(f"{'case':<28}{'wall s':>8}{'cpu s':>7}{'sys s':>7}{'faults':>9}{'events':>10}"
          f"{'events/s':>11}{'ratio':>7}{'peak MiB':>10}")
    for name in names:
        out = subprocess.run([sys.executable, __file__, "--child", name,
                              "--workers", str(args.workers)], stdout=subprocess.PIPE,
                             stderr=None if name in LONG else subprocess.PIPE,
                             text=True, check=True, cwd=ROOT)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["vs_plain_simpy"] = row["events_per_s"] / base
        loop, cpu_loop = base, cpu_base
        if name in LONG:
            # a scale case runs for minutes, over which this VM's speed has drifted by
            # 1.6x: measure the loop again after it and compare with the faster of the two
            # (the larger, safer ratio), keeping both rates
            after, cpu_after = simpy_rates()
            loop, cpu_loop = max(base, after), max(cpu_base, cpu_after)
            row["plain_simpy_events_per_s"] = loop
            row["plain_simpy_cpu_events_per_s"] = cpu_loop
            row["plain_simpy_before_after"] = [base, after]
        rows.append(row)
        peak = row["peak_rss_mib"] + row["peak_rss_forked_mib"]
        print(f"{name:<28}{row['wall_s']:>8.2f}{row['cpu_s']:>7.2f}"
              f"{row['sys_s']:>7.2f}{row['minor_faults']:>9}{row['events']:>10}"
              f"{row['events_per_s']:>11,.0f}{row['vs_plain_simpy']:>7.3f}{peak:>10.0f}")
        if name in SUPERNODE:
            print(_supernode_line(row, loop, cpu_loop))
        if name in SCALE:  # the large-EP measure: wall time in 1 M-event plain simpy loops
            w = CASES[name]
            row["x_1m_loop"] = row["wall_s"] * loop / 1e6
            row["x_1m_loop_cpu"] = row["cpu_s"] * cpu_loop / 1e6
            row["loop_events_per_event"] = row["cpu_s"] * cpu_loop / max(row["events"], 1)
            row["events_per_unit"] = row["events"] / (w["bs"] * w["k"] * w["ep_world_size"])
            goal = SCALE_TARGETS.get(name)
            print(f"  = {row['x_1m_loop']:.0f}x a 1 M-event simpy loop "
                  f"(loop {base:,.0f} events/s before, {after:,.0f} after: the faster)"
                  + (f" (target {goal}x: {'met' if row['x_1m_loop'] <= goal else 'NOT met'})"
                     if goal else "")
                  + f"; by CPU clock {row['x_1m_loop_cpu']:.0f}x, "
                  f"{row['loop_events_per_event']:.0f} loop events per event"
                  + f", {row['events_per_unit']:.1f} events per BS*K*W")
    if args.json:
        Path(args.json).write_text(json.dumps({"plain_simpy_events_per_s": base,
                                               "python": _interpreter(),
                                               "compiled": _builds(),
                                               "page_fault_us": fault_us,
                                               "cases": rows}, indent=2) + "\n")
    if ref is not None and slack is not None:
        return check(rows, base, args.check, ref, ref_rows, slack)
    return 0


def _supernode_line(row: dict, loop: float, cpu_loop: float) -> str:
    """A supernode case's cost beside its targets: wall and peak RSS (both processes), CPU
    in loop events per event (the per-event cost, which the wall hides when one worker
    idles), and how busy the second worker was (CPU over wall: 2.0 is both CPUs)."""
    row["x_1m_loop"] = row["wall_s"] * loop / 1e6
    row["loop_events_per_event"] = row["cpu_s"] * cpu_loop / max(row["events"], 1)
    peak_gb = (row["peak_rss_mib"] + row["peak_rss_forked_mib"]) * 2**20 / 1e9
    goal = SUPERNODE_TARGETS.get(row["name"])
    met = "" if goal is None else (
        f" (target {goal[0]:.0f} s and {goal[1]:.0f} GB: "
        f"{'met' if row['wall_s'] <= goal[0] and peak_gb < goal[1] else 'NOT met'})")
    return (f"  = {row['wall_s'] / 60:.1f} min wall, {peak_gb:.1f} GB peak{met}; "
            f"CPU over wall {row['cpu_s'] / row['wall_s']:.2f}, "
            f"{row['loop_events_per_event']:.0f} loop events per event")


def count_instructions(names: list[str]) -> int:
    """Print the instructions each case's simulate() executes: a valgrind run of the case
    minus one that stops before simulate()."""
    print(f"{'case':<28}{'instructions':>16}{'per event':>11}")
    for name in names:
        full, row = _instructions([name])
        setup, _ = _instructions([name, "--no-sim"])
        work = full - setup
        print(f"{name:<28}{work:>16,}{work / max(row['events'], 1):>11,.0f}")
    return 0


def _instructions(child_args: list[str]) -> tuple[int, dict]:
    """A child run under cachegrind: its instruction count and its figures."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--child", *child_args]
    # the same set orders in every run, and no idle BLAS threads spinning in the count
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return instruction_refs(out.stderr), json.loads(out.stdout.strip().splitlines()[-1])


def instruction_refs(valgrind_stderr: str) -> int:
    """The 'I refs' total of a cachegrind run's summary."""
    m = re.search(r"I\s+refs:\s+([\d,]+)", valgrind_stderr)
    if m is None:
        raise ValueError("no 'I refs' line in valgrind's output")
    return int(m.group(1).replace(",", ""))


def _usage_error(message: str) -> int:
    print(f"benchmarks/run.py: error: {message}", file=sys.stderr)
    return 2


# large EP: W 256 BS 128 within 120x, W 768 BS 128 within 400x; BS 80 is 80/128 of that work
SCALE_TARGETS = {"a3_w256_bs128_int8_timing": 120, "a3_w768_bs80_int8_timing": 250}
"""The large-EP targets, in multiples of a 1 M-event plain simpy loop on the same machine."""

SUPERNODE_TARGETS = {"deepep_a3_normal_ep128_bs4096": (600.0, 12.0)}
"""The normal-mode target: EP 128 within 10 minutes of wall with 2 workers, peak RSS (both
processes) under 12 GB."""

TARGETS_S = {"dc_bs256_fp16": 5.0, "dc_bs256_quant": 5.0, "dc_w64_bs128_quant_timing": 60.0}
"""The fixed cases' wall-time targets on a 2-core machine."""


def _interpreter() -> str:
    """The interpreter the loop and the cases ran on: the plain loop's rate is its own
    (docs/performance.md, "The machine and its noise"), so ratios compare only on the same one."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def page_fault_us(mib: int = 64) -> float:
    """Microseconds per first touch of a page of fresh anonymous memory, on this machine now.
    A run's system time is mostly such touches; their price is the machine's (a VM whose host
    takes freed memory back charges several times a bare machine's), so the figures carry it."""
    pages = (mib << 20) // PAGE
    return touch_fresh_pages(pages) * 1e6 / pages


def touch_fresh_pages(pages: int) -> float:
    """Seconds to write one byte into each page of a fresh anonymous map of 4 KiB pages (as
    npusim's maps take them): one first touch, one page fault, per page."""
    import mmap

    area = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # a machine with huge pages always on
        area.madvise(mmap.MADV_NOHUGEPAGE)
    try:
        t0 = time.perf_counter()
        for at in range(0, pages * PAGE, PAGE):
            area[at] = 1
        return time.perf_counter() - t0
    finally:
        area.close()


def _builds() -> str:
    """Which compiled builds the cases run (the children import the same package): a
    stale or missing build makes every figure slower, so a figure names its path."""
    from npusim.engine.compiled import describe

    return describe()


def check(rows: list[dict], base: float, path: str, ref: dict, ref_rows: dict[str, dict],
          slack: float) -> int:
    """Compare with a baseline run, in plain-simpy-event units (wall x simpy events/s)."""
    worst = 0.0
    print(f"\nagainst {path} (plain simpy {ref['plain_simpy_events_per_s']:,.0f} events/s there)")
    if ref.get("python", _interpreter()) != _interpreter():
        print(f"  note: the baseline ran on {ref['python']}, this on {_interpreter()}; the "
              "plain loop's rate differs between interpreters, so the ratios carry that too")
    if ref.get("compiled", _builds()) != _builds():
        print(f"  note: the baseline ran with {ref['compiled']}; this run with {_builds()}")
    for row in rows:
        old = ref_rows.get(row["name"])
        target = TARGETS_S.get(row["name"])
        goal = f"target {target:.0f} s: {'met' if row['wall_s'] < target else 'NOT met'}" \
            if target else ""
        if old is None:
            print(f"  {row['name']:<28} no baseline  {goal}")
            continue
        if old.get("workers", 1) != row["workers"]:
            goal += f" (baseline ran with {old.get('workers', 1)} workers, this with " \
                f"{row['workers']})"
        # a row measured at another moment (the scale group) carries its own loop rate
        old_base = old.get("plain_simpy_events_per_s", ref["plain_simpy_events_per_s"])
        ratio = (row["wall_s"] * base) / (old["wall_s"] * old_base)
        worst = max(worst, ratio)
        flag = "  <- slower" if ratio > 1 + slack else ""
        print(f"  {row['name']:<28} x{ratio:.2f} of the baseline's cost  {goal}{flag}")
    return 1 if worst > 1 + slack else 0


if __name__ == "__main__":
    sys.exit(main())
