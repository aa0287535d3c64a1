"""The table `npusim run` prints: per op the latency and each phase's span over ranks.

Works on the report document only (not on RunResult), so a saved report.json can be
summarised again without re-running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.fidelity.ledger import assumed_line, calibrated_text, status_line, vouching

_COLS = ("start min", "start max", "end min", "end max", "busy max")


def _fmt_us(x: float | None) -> str:
    return f"{x:12.3f}" if isinstance(x, (int, float)) else f"{'-':>12}"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # unreachable; keeps type checkers calm


def phase_spread(op: Mapping[str, Any], name: str) -> tuple[float | None, ...]:
    """(min start, max start, min end, max end) over the ranks that ran the phase, and
    the busiest core's summed time in it."""
    starts, ends = [], []
    for rank in op.get("ranks", []):
        ph = rank.get("phases", {}).get(name)
        if ph:
            starts.append(ph["start_us"])
            ends.append(ph["end_us"])
    ph = op.get("phases", {}).get(name, {})
    busy = ph.get("busy_us")
    if not starts:
        return (ph.get("start_us"), ph.get("start_us"), ph.get("end_us"), ph.get("end_us"), busy)
    return (min(starts), max(starts), min(ends), max(ends), busy)


def _link_head(width: int) -> str:
    return (f"  {'link':<{width}}{'links':>6}{'GB/s each':>11}{'bytes':>13}{'GB/s mean':>11}"
            f"{'GB/s max':>10}{'util op':>9}  util in phase")


def link_lines(op: Mapping[str, Any]) -> list[str]:
    """Per link class: bandwidth, bytes, achieved GB/s (bytes / op duration), utilisation."""
    lines = []
    classes = op.get("link_classes", {})
    width = max([9, *(len(k) + 1 for k in classes)])  # a level's 'supernode.downlink'
    for kind, c in classes.items():
        phase = c.get("phase")
        during = f"{c['utilisation_in_phase']:.1%} {phase}" if phase else "-"
        lines.append(
            f"  {kind:<{width}}{c['links']:>6}{c['bandwidth_gbps']:>11g}{fmt_bytes(c['bytes']):>13}"
            f"{c['achieved_gbps_mean']:>11.1f}{c['achieved_gbps_max']:>10.1f}"
            f"{c['utilisation_max']:>9.1%}  {during}"
        )
    return [_link_head(width), *lines] if lines else []


def _op_lines(op: Mapping[str, Any]) -> list[str]:
    head = f"{op.get('op', '?')}: latency {op.get('latency_us', 0.0):.3f} us"
    crit = op.get("critical") or {}
    if crit.get("rank") is not None:
        head += f"  (critical: rank {crit['rank']}"
        if crit.get("core") is not None:
            head += f", core {crit['core']}, phase {crit['phase']}"
        head += ")"
    lines = [head]
    diag = op.get("diagnosis") or {}
    if diag.get("text"):
        lines.append(f"  diagnosis: {diag['text']}")
    scalars = {k: v for k, v in (op.get("family_fields") or {}).items()
               if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
    if scalars:  # a family's one-number figures (lists and tables: report.md)
        lines.append("  family: " + ", ".join(f"{k} {_figure(v)}" for k, v in scalars.items()))
    names = list(op.get("phase_order") or op.get("phases", {}))
    width = max([len("phase")] + [len(n) for n in names])
    if names:
        lines.append(f"  {'phase':<{width}}" + "".join(f"{c:>12}" for c in _COLS) + "   (us)")
        for name in names:
            cells = "".join(_fmt_us(v) for v in phase_spread(op, name))
            lines.append(f"  {name:<{width}}{cells}")
    else:
        lines.append("  (no phase spans recorded)")
    sent = [r["bytes_sent"] for r in op.get("ranks", []) if r.get("bytes_sent") is not None]
    recv = [r["bytes_received"] for r in op.get("ranks", []) if r.get("bytes_received") is not None]
    if sent or recv:
        parts = []
        if sent:
            parts.append(f"sent {fmt_bytes(min(sent))} .. {fmt_bytes(max(sent))}")
        if recv:
            parts.append(f"received {fmt_bytes(min(recv))} .. {fmt_bytes(max(recv))}")
        lines.append("  bytes per rank: " + ", ".join(parts))
    lines.extend(link_lines(op))
    lines.extend(vector_lines(op))
    return lines


def vector_lines(op: Mapping[str, Any]) -> list[str]:
    """Pipe ratios and instruction counts, for ops that ran vector functions."""
    counts = op.get("instructions") or {}
    if not counts.get("RVECEX"):
        return []
    ratios = op.get("pipe_ratios") or {}
    return ["  pipe busy (mean over cores): "
            + ", ".join(f"{p} {v:.1%}" for p, v in ratios.items()),
            "  instructions (all cores): "
            + ", ".join(f"{k} {v:,}" for k, v in counts.items())]


GENERIC_KEYS = ("kernel", "op", "bs", "h", "k", "ep_world_size", "experts_per_rank",
                "num_experts", "dtype", "shared_experts", "shared_expert_ranks", "timing_only",
                "routing")


def _value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def family_options(wl: Mapping[str, Any]) -> str:
    """The kernel family's options of a resolved workload, as "name value, ..." (every
    key that is not a generic workload key is one)."""
    return ", ".join(f"{k} {_value(v)}" for k, v in wl.items() if k not in GENERIC_KEYS)


def format_summary(report: Mapping[str, Any]) -> str:
    """Fixed-width text: a scenario line, then per op latency and phase spans."""
    sc = report.get("scenario", {})
    wl = sc.get("workload", {})
    hw = report.get("hardware", {}).get("name", sc.get("hardware", "?"))
    lines = [f"scenario {sc.get('name', '?')} on {hw}"]
    if wl:
        lines[0] += (
            f"  ({wl.get('kernel', 'cann_sample')} {wl.get('op')}, "
            + (f"W={wl.get('ep_world_size')}, BS={wl.get('bs')}, "
               f"H={wl.get('h')}, K={wl.get('k')}, L={wl.get('experts_per_rank')}, "
               if "bs" in wl else "")
            + f"{wl.get('dtype')}"
            + (f", {family_options(wl)}" if family_options(wl) else "")
            + (f", S={wl['shared_experts']} shared experts on {wl.get('shared_expert_ranks')} "
               "ranks" if wl.get("shared_experts") else "")
            + ")"
        )
    for op in report.get("ops", []):
        lines.append("")
        lines.extend(_op_lines(op))
    fidelity = fidelity_lines(report.get("ops", []))
    if fidelity:
        lines += ["", *fidelity]
    sim = report.get("sim", {})
    if sim:
        lines.append("")
        lines.append(f"sim: {sim.get('events', 0)} events, {sim.get('wall_s', 0.0):.2f} s wall")
    return "\n".join(lines) + "\n"


def _figure(v: str | int | float) -> str:
    """A family figure for the one-line summary: floats to 6 significant digits (the
    report's JSON keeps them whole)."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def fidelity_lines(ops: list[Mapping[str, Any]]) -> list[str]:
    """At most two lines for the whole run: how far the ops' times are vouched for (one
    status when all ops share it, else per op), then the assumed values they rest on
    most. None for a report without ledgers (a report.json saved before them)."""
    docs = [(op.get("op", "?"), op["fidelity"]) for op in ops if op.get("fidelity")]
    if not docs:
        return []
    head = _pooled([d for _, d in docs])
    if head is None:
        by_status: dict[str, list[str]] = {}
        for name, d in docs:
            by_status.setdefault(status_line(d), []).append(name)
        head = next(iter(by_status)) if len(by_status) == 1 else "; ".join(
            f"{', '.join(names)} {s}" for s, names in by_status.items())
    lines = [f"fidelity: {head}"]
    ranked: dict[str, Mapping[str, Any]] = {}
    for _, d in docs:
        for a in d.get("assumed", []):
            if abs(a["effect"]) > abs(ranked.get(a["key"], {"effect": 0.0})["effect"]):
                ranked[a["key"]] = a
    rests = assumed_line(sorted(ranked.values(), key=lambda a: -abs(a["effect"])))
    if rests:
        lines.append(f"  {rests}")
    return lines


def _pooled(docs: list[Mapping[str, Any]]) -> str | None:
    """Every op vouched for by one table: its rows over the ops pooled (MAPE weighted by
    rows, the worst of all); None otherwise."""
    fits = [vouching(d) for d in docs]
    if any(f is None for f in fits) or len({f["table"] for f in fits}) != 1:
        return None
    rows = [f.get("matched") or f["simulated"] for f in fits]
    mape = sum(f["mape"] * n for f, n in zip(fits, rows, strict=True)) / sum(rows)
    worst = max(fits, key=lambda f: f["worst"])
    return (calibrated_text(worst["table"], sum(rows), mape, worst["worst"], worst["worst_row"])
            + "; shape inside")
