"""How npusim's cost grows with the work: wall time and events of timing-only
dispatch_combine runs over BS (W=8) and over W (BS=8), against BS * K * W.

    python benchmarks/scaling.py            # prints a Markdown table (docs/performance.md)
    python benchmarks/scaling.py --plot reports/scaling.png   # and draws the curve (matplotlib)
    python benchmarks/scaling.py --ep 8,16,32,64,128    # the large-EP A3 case along W (BS 128)

--ep runs benchmarks/run.py's Atlas A3 large-EP case (one expert per rank, INT8 dispatch,
bf16, timing only, K 8) at BS 128 for each W, each in a fresh process, and prints events,
events per BS*K*W, the kernels' own transfers (DMA copies and puts, the work a real NPU's
MTE engines do) per BS*K*W and the simulator's events per transfer, CPU and wall time, the
cost of an event in plain-simpy-loop events (CPU time per event x the loop's rate, measured
first) and peak RSS. --bs sets the batch size (128).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

POINTS = [(8, bs) for bs in (8, 32, 64, 128, 256, 512)] + [(w, 8) for w in (2, 4, 16, 32, 64)]


def plot(rows: list[tuple[int, int, int, float]], out: str) -> None:
    """Wall time against BS*K*W on log-log axes, along BS and along W, with a line of
    slope 1 through the first BS point (linear cost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, pick in (("BS 8..512 at W = 8", lambda w, bs: w == 8),
                        ("W 2..64 at BS = 8", lambda w, bs: bs == 8)):
        pts = sorted((work, wall) for w, bs, work, wall in rows if pick(w, bs))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ref = min((work, wall) for w, bs, work, wall in rows if w == 8 and bs >= 64)
    xs = [min(r[2] for r in rows), max(r[2] for r in rows)]
    ax.plot(xs, [ref[1] * x / ref[0] for x in xs], "k:", label="linear in BS*K*W")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("BS * K * W (token-expert sends)")
    ax.set_ylabel("wall time (s), timing-only dispatch_combine")
    ax.set_title("npusim cost vs work (H 7168, K 8, L 4, MXFP8 + INT8)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"figure: {out}")


def ep_scenario(w: int, bs: int, op: str = "dispatch_combine"):
    """benchmarks/run.py's A3 large-EP case at W and BS, of `op` (InputError if it is not a
    valid scenario, e.g. fewer than K = 8 experts)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from run import _a3_ep

    from npusim.scenario import scenario_from_doc

    workload = dict(_a3_ep(w, bs), op=op)
    if op == "dispatch":
        del workload["combine_quant"]
    doc = {"name": f"a3_w{w}_bs{bs}", "hardware": workload.pop("hardware"),
           "workload": workload}
    return scenario_from_doc(doc, f"--ep {w} --bs {bs}", ROOT)


def ep_point(w: int, bs: int) -> dict:
    """Child process: one A3 large-EP run (benchmarks/run.py's case), its figures."""
    import resource

    from npusim.formats import tables
    from npusim.sim import simulate

    sc = ep_scenario(w, bs)
    tables()  # ml_dtypes, built on first use: imported before the timing
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate(sc, workers=1)
    transfers = sum(s.count for op in r.ops for row in op.core_transfers for core in row
                    for s in core)
    return {"w": w, "bs": bs, "events": r.events, "transfers": transfers,
            "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def ep_table(ws: list[int], bs: int = 128) -> int:
    import json
    import subprocess

    import simpy

    env = simpy.Environment()  # the plain loop, timed by wall and by CPU clock

    def ticker(env):
        for _ in range(1_000_000):
            yield env.timeout(1)

    env.process(ticker(env))
    t0, c0 = time.perf_counter(), time.process_time()
    env.run()
    base, cpu_base = 1e6 / (time.perf_counter() - t0), 1e6 / (time.process_time() - c0)
    from npusim.engine.compiled import describe

    print(f"plain simpy loop: {base:,.0f} events/s wall, {cpu_base:,.0f} events/s CPU")
    print(describe())
    print("| W | BS*K*W | events | events per BS*K*W | transfers per BS*K*W | events per "
          "transfer | CPU s | wall s | loop events per event | loop events per transfer | "
          "x 1 M loop (CPU) | x 1 M loop (wall) | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in ws:
        out = subprocess.run([sys.executable, __file__, "--ep-point", f"{w},{bs}"],
                             stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT)
        p = json.loads(out.stdout.strip().splitlines()[-1])
        work = bs * 8 * w
        print(f"| {w} | {work} | {p['events']} | {p['events'] / work:.1f} | "
              f"{p['transfers'] / work:.2f} | {p['events'] / p['transfers']:.2f} | "
              f"{p['cpu_s']:.1f} | "
              f"{p['wall_s']:.1f} | {p['cpu_s'] / p['events'] * cpu_base:.0f} | "
              f"{p['cpu_s'] / p['transfers'] * cpu_base:.0f} | "
              f"{p['cpu_s'] * cpu_base / 1e6:.0f} | {p['wall_s'] * base / 1e6:.0f} | "
              f"{p['peak_rss_mib']:.0f} |", flush=True)
    return 0


def _usage_error(message: str) -> int:
    print(f"benchmarks/scaling.py: error: {message}", file=sys.stderr)
    return 2


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from npusim.oneline import OneLineParser

    ap = OneLineParser(prog=f"benchmarks/{Path(__file__).name}",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--plot", help="also draw the curve into this PNG (needs matplotlib)")
    ap.add_argument("--ep", help="comma-separated W values: the A3 large-EP table instead")
    ap.add_argument("--bs", type=int, default=128, help="batch size of the --ep table (128)")
    ap.add_argument("--ep-point", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ep_point:
        import json

        w, bs = (int(v) for v in args.ep_point.split(","))
        print(json.dumps(ep_point(w, bs)))
        return 0
    if args.bs < 1:
        return _usage_error(f"--bs {args.bs}: allowed: a batch size of 1 or more")
    if args.ep:
        try:
            ws = [int(v) for v in args.ep.split(",")]
        except ValueError:
            ws = []
        if not ws or min(ws) < 2:
            return _usage_error(f"--ep {args.ep!r}: allowed: comma-separated world sizes "
                                "of 2 or more, e.g. 8,16,32")
        from npusim.errors import InputError

        for w in ws:  # every point is a valid scenario before anything is timed
            try:
                ep_scenario(w, args.bs)
            except InputError as e:
                return _usage_error(str(e))
        return ep_table(ws, args.bs)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            print("benchmarks/scaling.py: error: --plot needs matplotlib; allowed: "
                  "pip install 'npusim[plot]', or run without --plot", file=sys.stderr)
            return 2
    from npusim.formats import tables
    from npusim.scenario import scenario_from_doc
    from npusim.sim import simulate

    tables()  # ml_dtypes, built on first use: imported before the timing
    rows = []

    print("| W | BS | K | BS*K*W | events | wall s | events per BS*K*W | us wall per BS*K*W |")
    print("|---|---|---|---|---|---|---|---|")
    for w, bs in sorted(POINTS, key=lambda p: p[0] * p[1]):
        doc = {"name": f"scale_w{w}_bs{bs}", "hardware": "ascend950", "workload": {
            "op": "dispatch_combine", "bs": bs, "h": 7168, "k": 8, "ep_world_size": w,
            "experts_per_rank": 4, "dispatch_quant": "mxfp8", "combine_quant": "int8",
            "timing_only": True}}
        sc = scenario_from_doc(doc, "scaling", ROOT)
        t0 = time.perf_counter()
        r = simulate(sc)
        wall = time.perf_counter() - t0
        work = bs * 8 * w
        rows.append((w, bs, work, wall))
        print(f"| {w} | {bs} | 8 | {work} | {r.events} | {wall:.2f} | {r.events / work:.1f} | "
              f"{1e6 * wall / work:.0f} |", flush=True)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
