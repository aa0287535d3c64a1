"""Fingerprints of what the simulator computes, to show that a speed change changed nothing.

For each scenario it hashes, at full precision (floats as float.hex), every op's start and
end, every core's end, every span (phase spans; with --detailed also pipe spans and link
samples), the bytes per link, rank and core transfer kind, every output tensor's bytes
and the report `npusim run` writes (wall-clock aside).
Run it before and after a change and compare:

    python benchmarks/fingerprint.py --save /tmp/before.json
    python benchmarks/fingerprint.py --compare /tmp/before.json   # exit 1 on a difference
    python benchmarks/fingerprint.py --only a3                     # scenarios named *a3*
    python benchmarks/fingerprint.py --all --only deepep/          # the family folders too

The set: every scenario under scenarios/ (shipped and examples), two detailed traces, and
Atlas A3 timing-only and functional runs at W 16-64 with one expert per rank (the shape of
the large-EP runs of benchmarks/run.py's scale group). Each runs in this process with one
worker, so the fingerprints are those of `simulate(..., workers=1)`. With --all the set also
takes every family folder's scenarios (scenarios/<family>/*.yaml, named <family>/<stem>):
some run for minutes (deepep's normal mode at 4096 tokens), so narrow it with --only.
Each line also gives the scenario's wall and CPU seconds and the process's peak RSS so far
(the scenario's own when --only names it alone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _a3(name: str, w: int, bs: int, timing_only: bool) -> dict[str, Any]:
    return {"name": name, "hardware": "atlas_a3", "workload": {
        "op": "dispatch_combine", "bs": bs, "h": 7168, "k": 8, "ep_world_size": w,
        "experts_per_rank": 1, "dtype": "bfloat16", "dispatch_quant": "int8",
        "combine_quant": "none", "timing_only": timing_only,
        "routing": {"kind": "balanced", "seed": 0}}}


GENERATED = [
    _a3("a3_w16_bs32_int8", 16, 32, False),
    _a3("a3_w32_bs16_int8_timing", 32, 16, True),
    _a3("a3_w64_bs8_int8_timing", 64, 8, True),
]
DETAILED = ("dispatch_combine_bs8", "link_bound")  # also hashed with the detailed trace


def scenarios(family_folders: bool = False) -> list[tuple[str, Any, bool]]:
    """(name, scenario, detailed) for the whole set, in a fixed order."""
    from npusim.scenario import load_scenario, scenario_from_doc

    out = []
    for path in sorted((ROOT / "scenarios").glob("*.yaml")) + sorted(
            (ROOT / "scenarios" / "examples").glob("*.yaml")):
        sc = load_scenario(path)
        out.append((path.stem, sc, False))
        if path.stem in DETAILED:
            out.append((f"{path.stem}+detailed", sc, True))
    for doc in GENERATED:
        out.append((doc["name"], scenario_from_doc(doc, "fingerprint", ROOT), False))
    if family_folders:
        skip = {"examples", "sweeps"}
        for folder in sorted(p for p in (ROOT / "scenarios").iterdir()
                             if p.is_dir() and p.name not in skip):
            for path in sorted(folder.glob("*.yaml")):
                out.append((f"{folder.name}/{path.stem}", load_scenario(path), False))
    return out


def _h(x: float | None) -> str:
    return "-" if x is None else float(x).hex()


def parts(result: Any) -> dict[str, str]:
    """SHA-256 digests of each part of a run's result, the report document among them
    (every field but the wall-clock one)."""
    from npusim.report.build import build_report

    digests: dict[str, hashlib._Hash] = {k: hashlib.sha256() for k in (
        "latency", "spans", "core_end", "bytes", "transfers", "outputs", "samples",
        "report")}

    def put(part: str, *items: Any) -> None:
        digests[part].update(repr(items).encode())

    for op in result.ops:
        put("latency", op.op, _h(op.start_ns), _h(op.end_ns))
        for row in op.core_end_ns:
            put("core_end", [_h(t) for t in row])
        for s in sorted(op.spans, key=lambda s: (s.rank, s.core, s.lane, s.start_ns, s.end_ns,
                                                  s.name, s.bytes)):
            put("spans", s.rank, s.core, s.lane, s.name, _h(s.start_ns), _h(s.end_ns), s.bytes,
                _h(s.delivered_ns))
        put("bytes", op.bytes_sent, op.bytes_received,
            [(ln.name, ln.kind, ln.rank, ln.bytes) for ln in op.links], op.core_bytes_put)
        for row in op.core_transfers:
            for core in row:
                put("transfers", sorted((t.phase, t.pipe, t.name, t.remote, t.count, t.bytes)
                                        for t in core))
        for r, outs in enumerate(op.outputs):
            for name in sorted(outs):
                a = outs[name]
                put("outputs", r, name, str(a.dtype), a.shape)
                digests["outputs"].update(a.tobytes())
    for s in sorted(result.samples, key=lambda s: (s.resource, s.t_ns, s.gbps)):
        put("samples", s.resource, _h(s.t_ns), _h(s.gbps))
    report = build_report(result)
    del report["sim"]["wall_s"]  # the one wall-clock field
    if str(report.get("source", "")).startswith(str(ROOT)):  # the same in any checkout
        report["source"] = str(Path(report["source"]).relative_to(ROOT))
    text = json.dumps(report, sort_keys=True).replace(f"{ROOT}/", "")  # a kernel file's path
    digests["report"].update(text.encode())
    return {k: d.hexdigest()[:16] for k, d in digests.items()}


def _peak_mib() -> int:
    """The process's peak resident memory so far (MiB): a scenario's own when it runs
    first in the process (--only naming it alone)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="scenarios whose name contains this text")
    ap.add_argument("--all", action="store_true",
                    help="also the family folders' scenarios (scenarios/<family>/)")
    ap.add_argument("--save", help="write the fingerprints to this JSON file")
    ap.add_argument("--compare", help="compare with fingerprints saved by --save (exit 1 if "
                                      "any part differs)")
    args = ap.parse_args()
    from npusim.engine.compiled import describe
    from npusim.formats import tables
    from npusim.sim import simulate

    tables()  # ml_dtypes, built on first use: imported before the timing

    print(describe(), flush=True)
    ref = json.loads(Path(args.compare).read_text()) if args.compare else None
    found: dict[str, dict[str, Any]] = {}
    bad = 0
    for name, sc, detailed in scenarios(args.all):
        if args.only and args.only not in name:
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(sc, detailed_trace=detailed, workers=1)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        digest = parts(result)
        lat = [round((op.end_ns - op.start_ns) / 1000, 3) for op in result.ops]
        found[name] = {"parts": digest, "latency_us": lat, "events": result.events}
        line = (f"{name:<36}{wall:>7.2f} s {cpu:>7.1f} CPU s {_peak_mib():>6} MiB "
                f"{result.events:>9} ev  latency {lat}")
        if ref is not None:
            old = ref.get(name)
            if old is None:
                line += "  (not in the reference)"
            else:
                diff = [k for k, v in digest.items() if old["parts"].get(k) != v]
                bad += bool(diff)
                ev = result.events - old["events"]
                line += (f"  DIFFERS: {', '.join(diff)}" if diff else "  identical") + (
                    f" (events {ev:+d})" if ev else "")
        print(line, flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(found, indent=1) + "\n")
    if ref is not None:
        print(f"{len(found) - bad} of {len(found)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
