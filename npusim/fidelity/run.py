"""A run's ledgers, from its resolved scenario (plain data: the report layer passes it in
and never imports the simulator)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.fidelity.ledger import Ledger, ledger_of


def off_preset(scenario: Mapping[str, Any]) -> str:
    """Why the run's hardware is not a shipped preset as shipped ('' when it is)."""
    ref, name = str(scenario.get("hardware", "")), str(scenario.get("hardware_name", ""))
    if ref != name:
        return f"a preset file ({ref}), not the shipped preset {name}"
    overrides = scenario.get("hardware_overrides") or {}
    if overrides:
        return f"hardware_overrides ({', '.join(overrides)}): not the shipped preset"
    return ""


def run_ledgers(scenario: Mapping[str, Any], ops: Mapping[str, Mapping[str, Any]]
                ) -> dict[str, Ledger]:
    """Each op's ledger, for a scenario as Scenario.to_dict() gives it and each op's
    family_fields: a figure the op reports it ran with (hixl's path when the scenario says
    auto, its block size) is the run's value of that key, before the scenario's."""
    w = scenario.get("workload", {})
    family = str(w.get("kernel", ""))
    preset = str(scenario.get("hardware_name", ""))
    why = off_preset(scenario)
    return {op: ledger_of(family, preset, {**w, **_scalars(fields)}, op, why)
            for op, fields in ops.items()}


def _scalars(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if isinstance(v, str | int | float)}


def fidelity_docs(scenario: Mapping[str, Any], ops: Mapping[str, Mapping[str, Any]]
                  ) -> dict[str, dict[str, Any]]:
    """Each op's ledger as the report's `fidelity` block."""
    return {op: led.as_doc() for op, led in run_ledgers(scenario, ops).items()}


def op_fields(result: Any) -> dict[str, dict[str, Any]]:
    """A RunResult's ops by name, each with its family_fields."""
    return {op.op: op.family_fields for op in result.ops}


def report_with_fidelity(result: Any) -> dict[str, Any]:
    """A run's report (npusim.report.build) with each op's ledger in it."""
    from npusim.report.build import build_report

    return build_report(result, fidelity_docs(result.scenario, op_fields(result)))
