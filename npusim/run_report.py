"""A run's report with each op's fidelity ledger in it: where the report (plain data in,
npusim.report) meets the ledgers (npusim.fidelity), for the sweep's points, `npusim check`
and the Python API alike."""

from __future__ import annotations

from typing import Any

from npusim.fidelity.run import fidelity_docs, op_fields
from npusim.report.build import build_report


def report_with_fidelity(result: Any) -> dict[str, Any]:
    """A run's report (npusim.report.build) with each op's ledger in it."""
    return build_report(result, fidelity_docs(result.scenario, op_fields(result)))
