"""How npusim's cost grows with the work: wall time and events of timing-only
dispatch_combine runs over BS (W=8) and over W (BS=8), against BS * K * W.

    python benchmarks/scaling.py            # prints a Markdown table (docs/performance.md)
    python benchmarks/scaling.py --plot reports/scaling.png   # and draws the curve (matplotlib)
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", help="also draw the curve into this PNG (needs matplotlib)")
    args = ap.parse_args()
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            print("benchmarks/scaling.py: error: --plot needs matplotlib; allowed: "
                  "pip install 'npusim[plot]', or run without --plot", file=sys.stderr)
            return 2
    from npusim.scenario import scenario_from_doc
    from npusim.sim import simulate

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
