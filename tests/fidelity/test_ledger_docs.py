"""docs/fidelity.md's family x preset matrix is the one `npusim presets --explain` prints
from the shipped tables and records now."""

from __future__ import annotations

from pathlib import Path

from npusim.cli import main
from npusim.fidelity.matrix import BEGIN, END, generated_block, matrix_lines

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"


def test_the_page_holds_the_current_matrix() -> None:
    text = PAGE.read_text(encoding="utf-8")
    shown = text[text.index(BEGIN):text.index(END) + len(END)]
    assert shown == generated_block(), (
        "docs/fidelity.md's matrix is not current; rewrite it with "
        "`python -m npusim.fidelity.matrix docs/fidelity.md`")


def test_explain_without_a_name_prints_the_matrix(capsys) -> None:
    assert main(["presets", "--explain"]) == 0
    assert capsys.readouterr().out.splitlines() == matrix_lines()
