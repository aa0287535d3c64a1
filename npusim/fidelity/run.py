"""A run's ledgers, from its resolved scenario (plain data: the report layer passes it in
and never imports the simulator)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def run_ledgers(scenario: Mapping[str, Any], ops: Iterable[str]) -> dict[str, Ledger]:
    """Each op's ledger, for a scenario as Scenario.to_dict() gives it."""
    w = scenario.get("workload", {})
    family = str(w.get("kernel", ""))
    preset = str(scenario.get("hardware_name", ""))
    why = off_preset(scenario)
    return {op: ledger_of(family, preset, w, op, why) for op in ops}


def fidelity_docs(scenario: Mapping[str, Any], ops: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each op's ledger as the report's `fidelity` block."""
    return {op: led.as_doc() for op, led in run_ledgers(scenario, ops).items()}


def report_with_fidelity(result: Any) -> dict[str, Any]:
    """A run's report (npusim.report.build) with each op's ledger in it."""
    from npusim.report.build import build_report

    return build_report(result, fidelity_docs(result.scenario, [op.op for op in result.ops]))
