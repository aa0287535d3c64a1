"""docs/scenario.md's option tables are the families' declarations, rendered."""

from __future__ import annotations

from pathlib import Path

from npusim.kernels import registry
from npusim.kernels.docs import option_table
from npusim.scenario import GENERIC
from npusim.scenario.docs import render, workload_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenario.md"


def test_scenario_doc_tables_match_the_declarations():
    text = DOC.read_text()
    assert render(text) == text, "run: python -m npusim.scenario.docs docs/scenario.md"
    for name in registry.names():
        fam = registry.get(name)
        assert f"<!-- options:{name} begin -->\n{option_table(fam)}\n" in text
        for o in fam.options:  # every option appears with its default
            assert f"| `{o.name}` |" in text


def test_generic_workload_keys_are_rendered_from_their_declaration():
    text = DOC.read_text()
    assert f"<!-- options:workload begin -->\n{workload_table()}\n" in text
    for o in GENERIC:  # required ones say so, the others give their default
        row = next(line for line in text.splitlines() if line.startswith(f"| `{o.name}` |"))
        assert ("| required |" in row) == o.required
