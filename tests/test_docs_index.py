"""Every built-in kernel family has its page, a row in both family indexes and a section of
its own in docs/scenario.md linking that page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npusim.kernels import registry

ROOT = Path(__file__).resolve().parents[1]
KERNEL_DOCS = ROOT / "docs" / "kernels"


def linked_families(page: Path, prefix: str) -> set[str]:
    """The families a page's table rows begin with, each linking its own page (prefix: the
    path from the index to docs/kernels/)."""
    found = re.findall(r"^\| \[`(\w+)`\]\(([^)]*)\)", page.read_text(), re.MULTILINE)
    return {name for name, link in found if link == f"{prefix}{name}.md"}


@pytest.mark.parametrize("name", registry.names())
def test_family_has_a_page(name: str) -> None:
    assert (KERNEL_DOCS / f"{name}.md").is_file(), f"docs/kernels/{name}.md is missing"


@pytest.mark.parametrize("index, prefix", [("docs/kernels/README.md", ""),
                                           ("README.md", "docs/kernels/")])
def test_index_lists_every_family(index: str, prefix: str) -> None:
    missing = sorted(set(registry.names()) - linked_families(ROOT / index, prefix))
    assert not missing, f"{index} has no row linking the page of {missing}"


def scenario_sections(page: Path) -> set[str]:
    """The families whose `#### `name` (...)` heading in docs/scenario.md links their page."""
    found = re.findall(r"^#### `(\w+)` \(.*\]\(kernels/(\w+)\.md\)\)$", page.read_text(),
                       re.MULTILINE)
    return {name for name, page_name in found if page_name == name}


def test_scenario_doc_has_a_section_per_family() -> None:
    missing = sorted(set(registry.names()) - scenario_sections(ROOT / "docs" / "scenario.md"))
    assert not missing, f"docs/scenario.md has no section heading linking the page of {missing}"
