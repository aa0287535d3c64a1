"""docs/scenario.md's generated tables: the generic workload keys (GENERIC and ROUTING,
between the `options:workload` markers) and every family's options and shape limits
(npusim.kernels.docs), so the loader, `npusim lint` and the doc read one declaration.

    python -m npusim.scenario.docs docs/scenario.md
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from npusim.kernels import docs as family_docs
from npusim.scenario.workload import GENERIC, ROUTING


def workload_table() -> str:
    """The generic workload keys, routing's as `routing.<key>`."""
    keys = (*GENERIC, *(replace(o, name=f"routing.{o.name}") for o in ROUTING))
    return "\n".join(family_docs.option_rows(keys))


def render(text: str) -> str:
    """The doc with the generic table and every family's table replaced."""
    return family_docs.render(family_docs.replace_block(text, "workload", workload_table()))


def main(argv: list[str]) -> int:
    for path in argv or ["docs/scenario.md"]:
        p = Path(path)
        p.write_text(render(p.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
