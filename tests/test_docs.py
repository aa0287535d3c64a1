"""docs/scenario.md's option tables are the families' declarations, rendered."""

from __future__ import annotations

from pathlib import Path

from npusim.kernels import registry
from npusim.kernels.docs import option_table
from npusim.scenario.docs import render

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenario.md"


def test_scenario_doc_tables_match_the_declarations():
    text = DOC.read_text()
    assert render(text) == text, "run: python -m npusim.scenario.docs docs/scenario.md"
    for name in registry.names():
        fam = registry.get(name)
        assert f"<!-- options:{name} begin -->\n{option_table(fam)}\n" in text
        for o in fam.options:  # every option appears with its default
            assert f"| `{o.name}` |" in text
