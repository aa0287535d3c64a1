"""Figures (optional extra `npusim[plot]`, matplotlib): a sweep's latency against one
axis with the phase breakdown stacked, and a report's per-rank phase bars.

Plots read the files npusim writes (results.csv, report.json); they know nothing of the
simulator.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.report.io import write_bytes_atomic
from npusim.units import ceil_div


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise InputError("npusim plot", None, "needs matplotlib: pip install 'npusim[plot]'"
                         ) from None
    return plt


def _save(plt: Any, fig: Any, out: Path) -> Path:
    """Write the figure atomically (temp file + rename, a regular file only) and free it."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return write_bytes_atomic(out, png.getvalue())


def _phase_durations(row: dict[str, str], phases: list[str]) -> list[float]:
    """Each phase's share of the latency, in the order phases end: the part of the
    timeline between the previous phase's end and this one's (so the stack adds up to
    the op's latency and shows which phase finishes the op)."""
    ends = []
    for ph in phases:
        end = row.get(f"{ph}_end_us", "")
        if end != "":
            ends.append((float(end), ph))
    ends.sort()
    out = {ph: 0.0 for ph in phases}
    prev = 0.0
    for end, ph in ends:
        out[ph] = max(0.0, end - prev)
        prev = max(prev, end)
    return [out[ph] for ph in phases]


Marks = Mapping[tuple[str, str], list[tuple[float, float]]]  # (op, series) -> [(x, us)]
MAX_COLUMNS = 8  # panels per row: a sweep of many series wraps into a grid


def _panels(rows: list[dict[str, str]], group: str | None
            ) -> dict[tuple[str, str], list[dict[str, str]]]:
    """The rows of each (op, group value), in the order the sweep's points first give them
    (the sweep file's order of its axes' values)."""
    panels: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        panels.setdefault((r["op"], r[group] if group else ""), []).append(r)
    return panels


def plot_sweep(csv_path: Path, axis: str | None, out: Path, group: str | None = None,
               published: Marks | None = None, logx: bool = False) -> Path:
    """Latency vs `axis` per op (one panel per op and `group` value, at most MAX_COLUMNS
    to a row), phases stacked; `published` measured points to overlay (the caller reads
    them from their table); `logx`: a log2 axis, for sizes that double."""
    plt = _pyplot()
    try:
        rows = list(csv.DictReader(csv_path.open()))
    except OSError as exc:
        raise InputError(str(csv_path), None, f"cannot read: {exc.strerror or exc}") from None
    if not rows or "op" not in rows[0] or "latency_us" not in rows[0]:
        raise InputError(str(csv_path), None, "not a sweep results.csv (needs op, latency_us)")
    axes_cols = [c for c in rows[0] if c not in ("point", "op", "latency_us")
                 and not c.endswith(("_start_us", "_end_us"))]
    axis = axis or (axes_cols[0] if axes_cols else None)
    if axis not in axes_cols:
        raise InputError(str(csv_path), "--axis", f"{axis!r}; allowed: {', '.join(axes_cols)}")
    if group is not None and group not in axes_cols:
        raise InputError(str(csv_path), "--group", f"{group!r}; allowed: {', '.join(axes_cols)}")
    phases = [c[: -len("_end_us")] for c in rows[0] if c.endswith("_end_us")]
    panels = _panels(rows, group)
    marks = published or {}
    keys = list(panels)
    ncols = min(len(keys), MAX_COLUMNS)
    nrows = ceil_div(len(keys), ncols)
    fig, axs = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axs.flat[len(keys):]:
        ax.set_visible(False)
    colors = plt.get_cmap("tab10")
    for ax, key in zip(axs.flat, keys, strict=False):
        sel = sorted(panels[key], key=lambda r: float(r[axis]))
        xs = [float(r[axis]) for r in sel]
        used = [ph for ph in phases if any(r.get(f"{ph}_end_us") for r in sel)]
        stacks = [_phase_durations(r, used) for r in sel]
        bottom = [0.0] * len(sel)
        for j, ph in enumerate(used):
            ys = [s[j] for s in stacks]
            ax.fill_between(xs, bottom, [b + y for b, y in zip(bottom, ys, strict=True)],
                            step=None, alpha=0.6, color=colors(j), label=ph)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        ax.plot(xs, [float(r["latency_us"]) for r in sel], "k.-", lw=1, label="latency")
        for (op, quant), pts in marks.items():
            if op == key[0] and (not group or quant in key[1]):
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "r*", ms=9,
                        label=f"published {quant}")
        op, g = key
        ax.set_title(f"{op}" + (f" ({group}={g})" if group else ""), fontsize=9)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel("latency (us)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(plt, fig, out)


def plot_report(report: dict[str, Any], out: Path) -> Path:
    """Per-rank phase bars (start..end) of every op in a report.json."""
    plt = _pyplot()
    ops = report.get("ops") or []
    if not ops:
        raise InputError("report", "ops", "no ops to plot")
    fig, axs = plt.subplots(len(ops), 1, figsize=(8, 1.2 + 0.35 * len(ops[0]["ranks"]) *
                                               len(ops)), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, op in zip(axs[:, 0], ops, strict=True):
        names = list(op["phases"])
        for rank in op["ranks"]:
            for j, ph in enumerate(names):
                span = rank["phases"].get(ph)
                if span:
                    ax.barh(rank["rank"] + (j - len(names) / 2) * 0.8 / len(names),
                            span["end_us"] - span["start_us"], left=span["start_us"],
                            height=0.8 / len(names), color=colors(j),
                            label=ph if rank["rank"] == 0 else None)
        ax.set_title(f"{op['op']}: latency {op['latency_us']:.2f} us", fontsize=9)
        ax.set_xlabel("us from the op's start")
        ax.set_ylabel("rank")
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="lower right")
    return _save(plt, fig, out)


def _label(r: dict[str, Any]) -> str:
    name = r["family"] + (f"/{r['variant']}" if r["variant"] else "")
    return f"{name} {r['dispatch_quant']}/{r['combine_quant']}"


def plot_advice(doc: dict[str, Any], out: Path) -> Path:
    """`npusim advise --plot`: one point's ranking as horizontal bars, each op's phases
    stacked in the order they end (ops back to back); along an axis, total latency
    against the axis, one line per family / variant / quantisation."""
    plt = _pyplot()
    if doc["axis"] is None:
        ranking = doc["points"][0]["ranking"] if doc["points"] else []
        fig, ax = plt.subplots(figsize=(8, 1.0 + 0.45 * max(1, len(ranking))))
        colors = plt.get_cmap("tab20")
        shade: dict[str, int] = {}
        for y, r in enumerate(ranking):
            start = 0.0
            for op, latency in r["ops_us"].items():
                left = start
                spans = r["phases_us"].get(op, {})
                row = {f"{ph}_end_us": str(span[1]) for ph, span in spans.items()}
                for ph, width in zip(spans, _phase_durations(row, list(spans)), strict=True):
                    key = f"{op}.{ph}"
                    new = key not in shade
                    shade.setdefault(key, len(shade))
                    ax.barh(y, width, left=left, color=colors(shade[key] % 20),
                            label=key if new else None)
                    left += width
                start += latency
        ax.errorbar([r["total_us"] for r in ranking], range(len(ranking)),
                    xerr=[r["band"] * r["total_us"] for r in ranking], fmt="none",
                    ecolor="black", elinewidth=0.8, capsize=3)  # each candidate's band
        totals = [r["total_us"] for r in ranking if r["total_us"] > 0]
        if totals and max(totals) > 20 * min(totals):  # one slow outlier hides the rest
            ax.set_xscale("log")
        ax.set_yticks(range(len(ranking)), [_label(r) for r in ranking], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("latency (us), phases in the order they end")
        ax.set_title(f"{doc['preset']}: {doc['points'][0]['why'] if doc['points'] else ''}",
                     fontsize=8, wrap=True)
        ax.legend(fontsize=6, loc="lower right")
        return _save(plt, fig, out)
    lines: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for pt in doc["points"]:
        for r in pt["ranking"]:
            lines[_label(r)].append((float(pt["value"]), r["total_us"], r["band"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in sorted(lines):
        pts = sorted(lines[name])
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-", label=name)
        ax.fill_between([p[0] for p in pts], [p[1] * (1 - p[2]) for p in pts],
                        [p[1] * (1 + p[2]) for p in pts], color=line.get_color(), alpha=0.08)
    ax.set_xlabel(doc["axis"])
    ax.set_ylabel("latency (us), all ops")
    ax.set_title(f"{doc['preset']}: each line with its band (uncalibrated "
                 f"±{doc['uncalibrated_band']:.0%})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, out)
