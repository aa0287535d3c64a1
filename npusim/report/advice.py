"""`npusim advise` as text: the ranking table with each candidate's band and its source,
the tie or the verdict, where the first place changes along an axis, and what could not
run. Reads the advice document (plain data, `npusim.advice/2`); knows nothing of the
simulator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.advise_rank import pct

SHAPE_WORDS = (("ep_world_size", "W"), ("bs", "BS"), ("h", "H"), ("k", "K"),
               ("experts_per_rank", "L"), ("dtype", ""), ("op", "op"))


def _shape_line(doc: Mapping[str, Any]) -> str:
    w = doc["shape"]
    if "kernel" in w:  # a family whose options are its shape: them as they are
        parts = [f"{k} {v}" for k, v in w.items()]
    else:
        parts = [f"{label} {w[k]}".strip() for k, label in SHAPE_WORDS if k in w]
    return (f"advise: {doc['preset']}; " + ", ".join(parts)
            + f"; uncalibrated band ±{pct(doc['uncalibrated_band'])}")


def format_ranking(ranking: list[Mapping[str, Any]]) -> list[str]:
    """The table of one point, by time; 'N=' marks the candidates that tie with the
    group's first (place N). Each row's band carries a letter; the letters' sources (a
    table and its worst row, or why uncalibrated) follow the table."""
    sources = list(dict.fromkeys(r["band_source"] for r in ranking))
    letter = {src: chr(ord("a") + i) if i < 26 else f"#{i}" for i, src in enumerate(sources)}
    rows = []
    for r in ranking:
        rows.append((f"{r['place']}{'=' if r['tie'] else ''}",
                     r["family"] + (f"/{r['variant']}" if r["variant"] else ""),
                     f"{r['dispatch_quant']}/{r['combine_quant']}", r["total_us"],
                     f"±{pct(r['band'])} {letter[r['band_source']]}", r["critical"],
                     r["wire_bytes"] / 1e6,
                     ", ".join(f"{op} {us:.2f}" for op, us in r["ops_us"].items())))
    # the text columns as wide as their longest entry (at least the usual width), so a
    # long kernel name does not push the row out of line
    wn = max([26, *(len(row[1]) for row in rows)])
    wq = max([10, *(len(row[2]) for row in rows)])
    wc = max([32, *(len(row[5]) for row in rows)])
    lines = [f"  {'#':>3}  {'family/variant':<{wn}} {'quant':<{wq}} {'total us':>9} "
             f"{'band':>7}  {'critical':<{wc}} {'wire MB':>7}  ops us"]
    lines += [f"  {tag:>3}  {name:<{wn}} {quant:<{wq}} {total:>9.2f} {band:>7}  "
              f"{crit:<{wc}} {mb:>7.2f}  {ops}"
              for tag, name, quant, total, band, crit, mb, ops in rows]
    lines += [f"  band {letter[src]}: {src}" for src in sources]
    rests = dict.fromkeys(k for r in ranking for k in r.get("rests_on", ()))
    if rests:
        lines.append("  the variants differ by preset values; the answer rests on:")
        lines += [f"    {k}" for k in rests]
    return lines


def format_advice(doc: Mapping[str, Any]) -> str:
    lines = [_shape_line(doc)]
    axis = doc["axis"]
    for pt in doc["points"]:
        if axis:
            lines += ["", f"{axis} = {pt['value']}"]
        if pt["ranking"]:
            lines += format_ranking(pt["ranking"])
        lines.append(f"why: {pt['why']}")
    if doc["crossovers"]:
        lines += ["", "where the first place changes:"] + [f"  {c}" for c in doc["crossovers"]]
    elif axis and len(doc["points"]) > 1:
        lines += ["", f"the first place (or tie) is the same at every {axis} value"]
    if doc["refused"]:
        lines += ["", "cannot run this shape:"] + _refusals(doc)
    return "\n".join(lines) + "\n"


def _refusals(doc: Mapping[str, Any]) -> list[str]:
    """One line per refusal, with the axis values it holds at (none when it holds at
    every value)."""
    axis, every = doc["axis"], len(doc["points"])
    at: dict[tuple[str, str], list[str]] = {}
    for r in doc["refused"]:
        name = r["family"] + (f"/{r['variant']}" if r["variant"] else "")
        quant = f" ({r['quant']})" if r["quant"] else ""
        values = at.setdefault((f"{name}{quant}", r["reason"]), [])
        if str(r["value"]) not in values:
            values.append(str(r["value"]))
    lines = []
    for (name, why), values in at.items():
        where = f" at {axis} = {', '.join(values)}" if axis and len(values) < every else ""
        lines.append(f"  {name}{where}: {why}")
    return lines
