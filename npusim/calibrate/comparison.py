"""Measured against simulated: each row's error, the MAPE, and the speed-ups a row's
variant implies against its twin at the variant's default."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from npusim.calibrate.table import Measurement, family_of, variant_option


@dataclass
class Comparison:
    rows: list[Measurement]
    simulated: list[float]
    speedups: list[dict[str, Any]] = field(default_factory=list)

    def errors(self) -> list[float]:
        return [error(m, s) for s, m in zip(self.simulated, self.rows, strict=True)]

    def mape(self) -> float:
        errs = self.errors()
        return sum(abs(e) for e in errs) / len(errs)


def compare(rows: list[Measurement], simulated: list[float]) -> Comparison:
    """Rows side by side, plus the quantisation speed-ups: every quantised row whose
    unquantised twin (same fields, quant none) is in the table."""
    cmp = Comparison(rows, simulated)
    index = {_key(m, m.base_quant): i for i, m in enumerate(rows)
             if m.quant == m.base_quant and not m.bandwidth}
    for i, m in enumerate(rows):
        if m.quant == m.base_quant or m.bandwidth:
            continue
        j = index.get(_key(m, m.base_quant))
        if j is None:
            continue
        cmp.speedups.append(
            {
                "op": m.op,
                "bs": m.workload.get("bs"),
                "quant": m.quant,
                "label": _speedup_label(m, rows[j]),
                "measured": rows[j].measured / m.measured,
                "simulated": simulated[j] / simulated[i],
            }
        )
    return cmp


def _speedup_label(m: Measurement, base: Measurement) -> str:
    """How a speed-up is named: "dispatch BS 8 mxfp8" for a MoE row against its
    unquantised twin; the two rows' names for a family without the MoE shape."""
    if family_of(m.workload).uses_moe_shape:
        return f"{m.op} BS {m.workload['bs']} {m.quant}"
    return f"{m.name} vs {base.name}"


def _key(m: Measurement, quant: str) -> tuple:
    """The row's fields with its variant set to `quant` and every other kernel's variant
    blanked (a combine row's dispatch quantisation does not matter to it)."""
    w = dict(m.workload)
    fam = family_of(w)
    own = variant_option(w)
    for k in fam.ops:
        if k.variant is not None:
            w[k.variant] = quant if own is not None and k.variant == own.name else "-"
    return tuple(sorted((k, str(v)) for k, v in w.items()))


def error(m: Measurement, simulated: float) -> float:
    """The relative error of a simulated value against the row's measured one, in the
    row's unit (a bandwidth row: of the bandwidth, as its table quotes it)."""
    return (simulated - m.measured) / m.measured


def log_residuals(rows: list[Measurement], simulated: list[float]) -> list[float]:
    """log(simulated / measured): a bandwidth row's residual is its time's, sign aside."""
    return [math.log(s / m.measured) for s, m in zip(simulated, rows, strict=True)]


def row_entry(m: Measurement, simulated: float, key: str = "simulated") -> dict[str, Any]:
    """A row's figures for a report: measured_<unit>, <key>_<unit> and the error."""
    return {"row": m.name, m.column: m.measured, f"{key}_{m.unit}": simulated,
            "measured": m.measured, key: simulated, "unit": unit_label(m),
            "error": error(m, simulated)}


def unit_label(m: Measurement) -> str:
    return "GB/s" if m.bandwidth else "us"
