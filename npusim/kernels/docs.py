"""docs/scenario.md's option tables and shape limits, generated from the families'
declarations.

Between the markers `<!-- options:<family> begin -->` and `<!-- options:<family> end -->`
the doc holds exactly `option_table(family)`; tests/test_docs.py checks that, and

    python -m npusim.scenario.docs docs/scenario.md

rewrites them (and the generic workload keys' table) after a declaration changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from npusim.kernels import registry
from npusim.kernels.family import Family, Option


def _default(o: Option) -> str:
    if o.required:
        return "required"
    if isinstance(o.default, (list, tuple)):
        return f"`{list(o.default)}`"
    if isinstance(o.default, bool):
        return "`true`" if o.default else "`false`"
    return f"`{o.default}`"


def _allowed(o: Option) -> str:
    if o.allowed:
        return o.allowed
    if o.kind == "choice":
        return ", ".join(f"`{c}`" for c in o.choices)
    if o.kind == "bool":
        return "`true`, `false`"
    if o.kind == "ints":
        return f"list of {o.lo:g}..{o.hi:g}"
    return f"{o.lo:g}..{o.hi:g}"


def option_rows(options: Iterable[Option]) -> list[str]:
    """Options as a markdown table: key, type, default, allowed, meaning."""
    types = {"choice": "string", "bool": "bool", "int": "int", "float": "number",
             "ints": "list of int", "str": "string"}
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for o in options:
        rows.append(f"| `{o.name}` | {types[o.kind]} | {_default(o)} | {_allowed(o)} | "
                    f"{o.help} |")
    return rows


def option_table(fam: Family) -> str:
    """The family's ops, its shape limits (a MoE family) and its options' table."""
    ops = ", ".join(f"`{op}` ({' then '.join(k)})" for op, k in fam.runs.items())
    shape = [f"Shape limits: {fam.shape_limits.text()}.", ""] if fam.uses_moe_shape else []
    return "\n".join([f"`workload.op`: {ops}.", "", *shape, *option_rows(fam.options)])


def replace_block(text: str, name: str, block: str) -> str:
    """`text` with what stands between the `options:<name>` markers set to `block`."""
    begin, end = _markers(name)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    return pattern.sub(lambda _m: f"{begin}\n{block}\n{end}", text)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- options:{name} begin -->", f"<!-- options:{name} end -->"


def render(text: str) -> str:
    """The doc with every built-in family's table between its markers replaced."""
    for name in registry.names():
        text = replace_block(text, name, option_table(registry.get(name)))
    return text
