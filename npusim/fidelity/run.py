"""A run's ledgers, from its resolved scenario (plain data: the report layer is handed
them, npusim.run_report, and never imports the simulator)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from npusim.fidelity.assumed import assumed_of
from npusim.fidelity.fit import table_fit
from npusim.fidelity.ledger import Ledger
from npusim.fidelity.tables import table_rows, tables_of


def ledger_of(family: str, preset: str, workload: Mapping[str, Any], op: str,
              off_preset: str = "") -> Ledger:
    """The ledger of one op of a run of `family` on the shipped preset `preset` at the
    scenario's `workload` (its validated keys); `off_preset` says why the hardware is
    not the shipped preset (hardware_overrides, a preset file): then nothing vouches."""
    assumed = assumed_of(family, preset, op)
    if off_preset:
        return Ledger(family, preset, op, assumed=assumed, why=off_preset)
    tables = tables_of(preset)
    if not tables:
        return Ledger(family, preset, op, assumed=assumed, why=f"no shipped table of {preset}")
    fits, of_family = [], False
    for path in tables:
        rows = [r for r in table_rows(path) if r.family == family]
        of_family = of_family or bool(rows)
        rows = [r for r in rows if r.op == op]
        if rows:
            fits.append(table_fit(path.stem, preset, rows, family, workload))
    ledger = Ledger(family, preset, op, tuple(fits), assumed)
    if ledger.calibrated:
        return ledger
    why = (next(t.outside_why for t in fits) if fits
           else f"{preset}'s tables have no {family} row" + (f" of op {op}" if of_family else ""))
    return replace(ledger, why=why)


def off_preset(scenario: Mapping[str, Any], rows_set: Mapping[str, Any] | None = None) -> str:
    """Why the run's hardware is not a shipped preset as shipped ('' when it is). An
    override every row of the op's tables sets too, to the same value (`rows_set`: the
    window DeepEP's normal rows need), leaves the run on the preset those rows ran on."""
    ref, name = str(scenario.get("hardware", "")), str(scenario.get("hardware_name", ""))
    if ref != name:
        return f"a preset file ({ref}), not the shipped preset {name}"
    shared = rows_set or {}
    overrides = [k for k, v in (scenario.get("hardware_overrides") or {}).items()
                 if k not in shared or shared[k] != v]
    if overrides:
        return f"hardware_overrides ({', '.join(overrides)}): not the shipped preset"
    return ""


def rows_hardware(preset: str, family: str, op: str) -> dict[str, Any] | None:
    """The preset keys every row of the family and op in the preset's tables sets to one
    value (their `hw.` columns); None when there are no rows."""
    rows = [r.m.hardware for t in tables_of(preset) for r in table_rows(t)
            if r.family == family and r.op == op]
    if not rows:
        return None
    return {k: v for k, v in rows[0].items() if all(h.get(k) == v for h in rows[1:])}


def run_ledgers(scenario: Mapping[str, Any], ops: Mapping[str, Mapping[str, Any]],
                family: str | None = None) -> dict[str, Ledger]:
    """Each op's ledger, for a scenario as Scenario.to_dict() gives it and each op's
    family_fields: a figure the op reports it ran with (hixl's path when the scenario says
    auto, its block size) is the run's value of that key, before the scenario's. `family`:
    the family's name when the scenario names it by a file or module."""
    w = scenario.get("workload", {})
    family = family or str(w.get("kernel", ""))
    preset = str(scenario.get("hardware_name", ""))
    out = {}
    for op, fields in ops.items():
        shared = rows_hardware(preset, family, op)
        # an op no row measures is uncalibrated for that first, whatever its hardware
        why = "" if shared is None else off_preset(scenario, shared)
        out[op] = ledger_of(family, preset, {**w, **_scalars(fields)}, op, why)
    return out


def _scalars(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if isinstance(v, str | int | float)}


def fidelity_docs(scenario: Mapping[str, Any], ops: Mapping[str, Mapping[str, Any]]
                  ) -> dict[str, dict[str, Any]]:
    """Each op's ledger as the report's `fidelity` block."""
    return {op: led.as_doc() for op, led in run_ledgers(scenario, ops).items()}


def op_fields(result: Any) -> dict[str, dict[str, Any]]:
    """A RunResult's ops by name, each with its family_fields."""
    return {op.op: op.family_fields for op in result.ops}
