"""How npusim's cost grows with the work: wall time and events of timing-only
dispatch_combine runs over BS (W=8) and over W (BS=8), against BS * K * W.

    python benchmarks/scaling.py            # prints a Markdown table (docs/performance.md)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

POINTS = [(8, bs) for bs in (8, 32, 64, 128, 256, 512)] + [(w, 8) for w in (2, 4, 16, 32, 64)]


def main() -> int:
    from npusim.scenario import scenario_from_doc
    from npusim.sim import simulate

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
        print(f"| {w} | {bs} | 8 | {work} | {r.events} | {wall:.2f} | {r.events / work:.1f} | "
              f"{1e6 * wall / work:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
