"""The fit report: what `npusim calibrate` writes beside the fitted preset (FIT.json)
and the summary it prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npusim.calibrate.comparison import Comparison, row_entry
from npusim.calibrate.fitting import FitResult, FreeParameter
from npusim.calibrate.table import Measurement


def fit_report(
    hw_path: Path,
    table: str,
    params: list[FreeParameter],
    result: FitResult,
    cmp: Comparison,
    held: list[Measurement],
    held_sim: list[float],
) -> dict[str, Any]:
    """The fit report: parameters (start and fitted), each row's error, the speed-ups,
    leave-one-out and held-out predictions, and which rows pin each parameter."""
    rows = cmp.rows
    return {
        "hardware": str(hw_path),
        "table": str(table),
        "evaluations": result.evaluations,
        "parameters": [
            {
                "keys": list(p.keys),
                "low": p.low,
                "high": p.high,
                "start": result.start[p.name],
                "fitted": result.values[p.name],
            }
            for p in params
        ],
        "rows": [row_entry(m, s) for m, s in zip(rows, result.simulated, strict=True)],
        "mape": cmp.mape(),
        "speedups": cmp.speedups,
        "leave_one_out": result.loo,
        "held_out": [row_entry(m, t, "predicted") for m, t in zip(held, held_sim, strict=True)],
        "pinned_by": result.pinned_by,
    }


def fit_summary(
    report: dict[str, Any], params: list[FreeParameter], result: FitResult
) -> list[str]:
    """The lines printed after a fit: each parameter's move, each row's error, the MAPE,
    the leave-one-out and held-out predictions, and which rows pin each parameter."""
    lines = [
        f"  {p.name:<44} {result.start[p.name]:>10.4g} -> {result.values[p.name]:.4g}"
        for p in params
    ]
    lines += [
        f"  {row['row']:<24}{row['measured']:>10.1f}{row['simulated']:>10.2f} "
        f"{row['unit']:<5}{100 * row['error']:>7.1f}%"
        for row in report["rows"]
    ]
    lines.append(f"  MAPE {100 * report['mape']:.2f}%")
    lines += [
        f"  leave-one-out {r['row']:<24} predicted {r['predicted']:.2f} {r['unit']} "
        f"({100 * r['error']:+.1f}%)"
        for r in result.loo
    ]
    lines += [
        f"  held out (--hold-out) {r['row']:<24} predicted {r['predicted']:.2f}, "
        f"measured {r['measured']:.1f} {r['unit']} ({100 * r['error']:+.1f}%)"
        for r in report["held_out"]
    ]
    lines.append("which rows pin each parameter (share of its effect on the residuals):")
    lines += [f"  {e['parameter']:<44} {_pin_note(e)}" for e in result.pinned_by]
    return lines


def _pin_note(e: dict[str, Any]) -> str:
    """What pins one parameter: its top row and share, or the prior."""
    if e["total_elasticity"] < 0.01:
        return "barely moved by any row: the prior holds it"
    note = f"{e['top_row']} {100 * e['top_share']:.0f}%"
    if e["top_share"] >= 0.8:
        note += "  <- one row alone"
    return note
