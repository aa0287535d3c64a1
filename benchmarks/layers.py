"""Where a run's time goes, by layer of npusim: cProfile's own time per function, summed
by the package it lives in, for the A3 large-EP case (benchmarks/run.py's) at one W and BS.

    python benchmarks/layers.py --ep 64 --bs 32 [--op dispatch|combine|dispatch_combine]

The split bounds what making one layer cheaper can give (docs/performance.md, "Where the
time goes").
cProfile adds a cost per call, so layers with many small calls read somewhat high.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from collections import Counter
from pathlib import Path

# package path fragment -> layer, first match wins (C calls are classed by their name)
LAYERS = (("npusim/engine/flow", "flow network (engine/flow.py)"),
          ("npusim/engine", "event loop (engine/)"),
          ("simpy", "simpy (events, processes)"),
          ("npusim/runtime", "kernel API (runtime/)"),
          ("npusim/hw", "hardware (hw/)"),
          ("npusim/kernels", "kernel programs (kernels/)"),
          ("npusim", "npusim set-up and report"),
          ("numpy", "numpy (its Python parts)"))

# the compiled core's methods are C calls named after their build; what they call inside the
# build costs no profiled call and counts as their own time
COMPILED = (("npusim.engine._flow", "compiled: flow network"),
            ("npusim.engine._env", "compiled: event loop"),
            ("npusim.hw._pipe", "compiled: pipes"))


def layer_of(filename: str, function: str) -> str:
    """The layer of one profiled function (filename '~' marks a C built-in)."""
    if filename == "~":
        for build, layer in COMPILED:
            if build in function:
                return layer
        if "heap" in function:
            return "C built-ins: heapq"
        if "numpy" in function or "ndarray" in function or "ufunc" in function:
            return "C built-ins: numpy"
        return "C built-ins: dict, list, ..."
    path = filename.replace("\\", "/")
    for fragment, layer in LAYERS:
        if fragment in path:
            return layer
    return "other Python"


def split(stats: pstats.Stats) -> tuple[Counter, Counter]:
    """Own seconds and calls per layer."""
    seconds: Counter = Counter()
    calls: Counter = Counter()
    for (filename, _, function), (_, ncalls, own, _, _) in stats.stats.items():
        layer = layer_of(filename, function)
        seconds[layer] += own
        calls[layer] += ncalls
    return seconds, calls


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from scaling import ep_scenario

    from npusim.oneline import OneLineParser

    ap = OneLineParser(prog=f"benchmarks/{Path(__file__).name}",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--ep", type=int, default=64, help="world size W (64)")
    ap.add_argument("--bs", type=int, default=32, help="batch size (32)")
    ap.add_argument("--op", default="dispatch",
                    choices=("dispatch", "combine", "dispatch_combine"))
    args = ap.parse_args()
    from npusim.errors import InputError
    from npusim.formats import tables
    from npusim.sim import simulate

    if args.bs < 1 or args.ep < 2:
        ap.error(f"--ep {args.ep} --bs {args.bs}: allowed: W of 2 or more, BS of "
                            "1 or more")
    try:
        sc = ep_scenario(args.ep, args.bs, args.op)
    except InputError as e:
        ap.error(str(e))
    tables()  # ml_dtypes, built on first use: imported before the timing
    profile = cProfile.Profile()
    profile.enable()
    result = simulate(sc, workers=1)
    profile.disable()
    seconds, calls = split(pstats.Stats(profile))
    total = sum(seconds.values())
    events = max(result.events, 1)
    from npusim.engine.compiled import describe

    print(f"W {args.ep} BS {args.bs} {args.op}: {result.events} events, {total:.2f} s "
          f"profiled, {sum(calls.values()) / events:.0f} calls per event")
    print(describe())
    print("| layer | own time | calls per event |")
    print("|---|---|---|")
    for layer, own in seconds.most_common():
        if own >= 0.001 * total:
            print(f"| {layer} | {100 * own / total:.1f}% | {calls[layer] / events:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
