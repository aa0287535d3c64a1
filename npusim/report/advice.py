"""`npusim advise` as text: the ranking table, the winner's reason, where the winner
changes along an axis, and what could not run. Reads the advice document (plain data,
`npusim.advice/1`); knows nothing of the simulator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHAPE_WORDS = (("ep_world_size", "W"), ("bs", "BS"), ("h", "H"), ("k", "K"),
               ("experts_per_rank", "L"), ("dtype", ""), ("op", "op"))


def _shape_line(doc: Mapping[str, Any]) -> str:
    w = doc["shape"]
    if "kernel" in w:  # a family whose options are its shape: them as they are
        parts = [f"{k} {v}" for k, v in w.items()]
    else:
        parts = [f"{label} {w[k]}".strip() for k, label in SHAPE_WORDS if k in w]
    cal = doc["calibration"]
    return f"advise: {doc['preset']}, {cal['status']}; " + ", ".join(parts)


def _ops(ranking: list[Mapping[str, Any]]) -> list[str]:
    ops: list[str] = []
    for r in ranking:
        ops += [op for op in r["ops_us"] if op not in ops]
    return ops


def format_ranking(ranking: list[Mapping[str, Any]]) -> list[str]:
    """The table of one point, fastest first; '=' marks a tie with the winner and '*'
    a run outside the preset's calibrated shapes."""
    ops = _ops(ranking)
    head = (f"  {'#':>3}  {'family/variant':<24} {'quant':<12}"
            + "".join(f"{op + ' us':>13}" for op in ops)
            + f"{'total us':>11}  {'critical':<24} {'wire MB':>9}  calibration")
    lines = [head]
    place = 0
    for i, r in enumerate(ranking):
        place = place if r["tie"] and i else i + 1
        tag = f"{place}{'=' if r['tie'] else ''}"
        name = r["family"] + (f"/{r['variant']}" if r["variant"] else "")
        quant = f"{r['dispatch_quant']}/{r['combine_quant']}"
        cells = "".join(f"{r['ops_us'][op]:>13.2f}" if op in r["ops_us"] else f"{'-':>13}"
                        for op in ops)
        mark = " *" if r["outside_calibration"] else ""
        lines.append(f"  {tag:>3}  {name:<24} {quant:<12}{cells}{r['total_us']:>11.2f}  "
                     f"{r['critical']:<24} {r['wire_bytes'] / 1e6:>9.2f}  "
                     f"{r['calibration']}{mark}")
    notes = {r["outside_calibration"] for r in ranking if r["outside_calibration"]}
    lines += [f"  * outside the calibrated shapes: {n}" for n in sorted(notes)]
    rests = dict.fromkeys(k for r in ranking for k in r.get("rests_on", ()))
    if rests:
        lines.append("  the variants differ by preset values; the answer rests on:")
        lines += [f"    {k}" for k in rests]
    return lines


def _bases(doc: Mapping[str, Any]) -> list[str]:
    """Where each MAPE shown comes from, once each."""
    cals = [doc["calibration"], *(pt.get("calibration", {}) for pt in doc["points"])]
    return [f"  {b}" for b in dict.fromkeys(c.get("basis") for c in cals) if b]


def format_advice(doc: Mapping[str, Any]) -> str:
    lines = [_shape_line(doc), *_bases(doc)]
    axis = doc["axis"]
    varies = doc["calibration"]["mape"] is None and len(
        {pt["calibration"]["status"] for pt in doc["points"] if "calibration" in pt}) > 1
    for pt in doc["points"]:
        if axis:
            own = f"  ({pt['calibration']['status']})" if varies else ""
            lines += ["", f"{axis} = {pt['value']}{own}"]
        if pt["ranking"]:
            lines += format_ranking(pt["ranking"])
        lines.append(f"why: {pt['why']}")
    if doc["crossovers"]:
        lines += ["", "where the winner changes:"] + [f"  {c}" for c in doc["crossovers"]]
    elif axis and len(doc["points"]) > 1:
        lines += ["", f"the winner is the same at every {axis} value"]
    if doc["refused"]:
        lines += ["", "cannot run this shape:"]
        seen = set()
        for r in doc["refused"]:
            name = r["family"] + (f"/{r['variant']}" if r["variant"] else "")
            quant = f" ({r['quant']})" if r["quant"] else ""
            at = f" at {axis} = {r['value']}" if axis else ""
            line = f"  {name}{quant}{at}: {r['reason']}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
    return "\n".join(lines) + "\n"
