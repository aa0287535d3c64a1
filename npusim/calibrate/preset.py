"""The preset side of a fit: the start values read from it, and the fitted values written
back into its YAML text with their `calibrated` provenance, every other line kept."""

from __future__ import annotations

from typing import Any

import yaml

from npusim.calibrate.fitting import FreeParameter
from npusim.errors import InputError


def current_values(hw_doc: dict[str, Any], params: list[FreeParameter]) -> dict[str, float]:
    """The preset's value of each parameter (the first key of a tied group)."""
    from npusim.hw.provenance import is_entry

    out = {}
    for p in params:
        node: Any = hw_doc
        for part in p.keys[0].split("."):
            if not isinstance(node, dict) or is_entry(node) or part not in node:
                raise InputError("command line", "--param", f"unknown preset key {p.keys[0]!r}")
            node = node[part]
        out[p.name] = float(node["value"] if is_entry(node) else node)
    return out


def fit_provenance(
    params: list[FreeParameter], table: str, report: str, day: str
) -> dict[str, dict[str, str]]:
    """The `calibrated` provenance of every fitted key: its fit report, date and method."""
    out = {}
    for p in params:
        for k in p.keys:
            tied = [t.split(".")[-1] for t in p.keys if t != k]
            method = (
                f"npusim calibrate to {table}"
                + (f", tied with {', '.join(tied)}" if tied else "")
                + f", bounds {p.low:g}-{p.high:g}"
            )
            out[k] = {"fit": report, "date": day, "method": method}
    return out


def rewrite_preset(
    text: str, values: dict[str, float], provenance: dict[str, dict[str, str]]
) -> str:
    """The preset's YAML with each fitted value put in place as
    `{value: V, calibrated: provenance[key]}` (a plain value becomes such an entry too;
    the note of a value calibrated before is kept); every other line, value, provenance
    and comment is kept as it was."""
    lines = text.splitlines()
    out: list[str] = []
    section = ""
    done = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if not stripped or stripped.startswith("#"):
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        dotted = key if indent == 0 else f"{section}.{key}"
        if indent == 0:
            section = key
        if indent == 0 or dotted not in values:
            out.append(line)
            continue
        first = i - 1
        i = _entry_end(lines, i, indent)
        out += _entry_lines(key, indent, values[dotted], provenance[dotted], lines[first:i])
        done.add(dotted)
    missing = set(values) - done
    if missing:
        raise InputError("preset", sorted(missing)[0], "key not found in the preset text")
    return "\n".join(out) + "\n"


def _entry_end(lines: list[str], i: int, indent: int) -> int:
    """Where the entry whose first line is just before line i ends: its deeper-indented
    lines, and blank lines only where the entry continues after them."""
    while i < len(lines) and (
        not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
    ):
        if not lines[i].strip():  # a blank line ends the entry unless it continues
            j = i
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j == len(lines) or len(lines[j]) - len(lines[j].lstrip()) <= indent:
                break
        i += 1
    return i


def _entry_lines(
    key: str, indent: int, value: float, provenance: dict[str, str], block: list[str]
) -> list[str]:
    """The fitted entry that replaces `block` (the old entry's lines), at its indent."""
    calibrated = dict(provenance)
    note = _calibrated_note(block, indent)
    if note:
        calibrated["note"] = note
    entry = {key: {"value": float(_fmt(value)), "calibrated": calibrated}}
    text = yaml.safe_dump(entry, sort_keys=False, default_flow_style=False, width=4096)
    return [" " * indent + b for b in text.splitlines()]


def _calibrated_note(block: list[str], indent: int) -> str | None:
    """The note of a value that was calibrated before (what it means is kept; where it
    came from is replaced); a sourced or assumed value's note is about its old source."""
    doc = yaml.safe_load("\n".join(line[indent:] for line in block))
    entry = next(iter(doc.values())) if isinstance(doc, dict) and doc else None
    old = entry.get("calibrated") if isinstance(entry, dict) else None
    return old.get("note") if isinstance(old, dict) else None


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.1f}"
