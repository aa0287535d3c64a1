"""The family x preset matrix: which shipped tables vouch for each family on each preset,
over all of the family's rows (`npusim presets --explain`, docs/fidelity.md).

`python -m npusim.fidelity.matrix docs/fidelity.md` rewrites the page's generated part.
"""

from __future__ import annotations

import sys
from pathlib import Path

from npusim.fidelity.fit import errors_of
from npusim.fidelity.tables import table_rows, tables_of
from npusim.hw.config import preset_names
from npusim.kernels import registry

BEGIN = "<!-- the matrix below is generated: python -m npusim.fidelity.matrix docs/fidelity.md -->"
END = "<!-- end of the generated matrix -->"


def cell(family: str, preset: str) -> str:
    """One family on one preset: 'calibrated: <table> <n> rows, MAPE, worst (<row>)' per
    vouching table, or 'uncalibrated: <why>'."""
    tables = tables_of(preset)
    if not tables:
        return f"uncalibrated: no shipped table of {preset}"
    done, pending = [], []
    for path in tables:
        rows = [r for r in table_rows(path) if r.family == family]
        if not rows:
            continue
        mape, worst, worst_row = errors_of(rows)
        n = sum(r.simulated is not None for r in rows)
        if worst is None or mape is None:
            pending.append(f"{path.stem}: 0 of {len(rows)} rows simulated")
            continue
        more = f" ({n} of {len(rows)} simulated)" if n < len(rows) else ""
        done.append(f"{path.stem} {n} rows{more}, MAPE {100 * mape:.1f}%, worst "
                    f"{100 * worst:.1f}% ({worst_row})")
    if done:
        return "; ".join(["calibrated: " + "; ".join(done), *pending])
    if pending:
        return "uncalibrated: " + "; ".join(pending)
    return f"uncalibrated: {preset}'s tables have no {family} row"


def matrix_lines() -> list[str]:
    """Per registered family, a line per shipped preset."""
    presets = preset_names()
    width = max(len(p) for p in presets)
    out: list[str] = []
    for family in registry.names():
        out.append(family)
        out += [f"  {p:<{width}}  {cell(family, p)}" for p in presets]
    return out


def generated_block() -> str:
    """The page's generated part, markers included."""
    return "\n".join([BEGIN, "", "```", *matrix_lines(), "```", "", END])


def rewrite_page(page: Path) -> bool:
    """Replace the page's generated part; True if the text changed."""
    text = page.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + generated_block() + text[end:]
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {'rewritten' if rewrite_page(Path(arg)) else 'current'}")
