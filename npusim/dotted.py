"""Dotted scenario keys set on top of a scenario file: `npusim run --set KEY=VALUE`.

A what-if ("and with BS 64?", "and at half the egress?") should not need a copy of the
file. Each `--set` writes one dotted key into the scenario document before validation,
so its value is checked exactly as if the file said it; an error about a key that came
from the command line names the `--set` option and the key. Sweep axes use the same
setter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npusim.errors import InputError, excerpt
from npusim.useryaml import load_text

OVERRIDES = "hardware_overrides"


def _flat(raw: dict[Any, Any], prefix: str = "") -> dict[Any, Any]:
    """Nested hardware overrides as dotted keys (the loader accepts both spellings)."""
    out: dict[Any, Any] = {}
    for k, v in raw.items():
        key = f"{prefix}.{k}" if prefix and isinstance(k, str) else k
        if isinstance(v, dict) and isinstance(k, str):
            out.update(_flat(v, key))
        else:
            out[key] = v
    return out


def set_dotted(doc: dict[str, Any], key: str, value: Any) -> None:
    """workload.bs -> doc['workload']['bs']; hardware_overrides.X.Y -> override 'X.Y'
    (replacing the same override however the file nests it). ValueError if a part of
    the key is not a mapping in the document."""
    if key.startswith(OVERRIDES + "."):
        raw = doc.get(OVERRIDES)
        flat = _flat(raw) if isinstance(raw, dict) else {}
        flat[key.split(".", 1)[1]] = value
        doc[OVERRIDES] = flat
        return
    node = doc
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(key)
    node[parts[-1]] = value


def parse_sets(items: Sequence[str], origin: str = "command line") -> list[tuple[str, Any]]:
    """KEY=VALUE strings -> (dotted key, value parsed as YAML: 64 int, 0.5 float, true
    bool, text str, {kind: zipf} a mapping); errors name `--set`, or the Python API's
    `set` (origin "api")."""
    where, option = _naming(origin)
    out: list[tuple[str, Any]] = []
    for item in items:
        if not isinstance(item, str):
            raise InputError(where, option, f"{excerpt(item)}: allowed: KEY=VALUE text")
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key or any(not p for p in key.split(".")):
            raise InputError(where, option,
                             f"{excerpt(item)}: allowed: KEY=VALUE with a dotted scenario key, "
                             "e.g. workload.bs=64")
        if any(k == key for k, _ in out):
            raise InputError(where, f"{option} {key}", "given twice")
        value = load_text(text, where, f"{option} {key}",
                          malformed=f"{excerpt(text)} is not a YAML value")
        out.append((key, value))
    return out


def _naming(origin: str) -> tuple[str, str]:
    """(error source, option) for set keys: `--set` on the command line, `set` in the API."""
    return ("command line", "--set") if origin == "command line" else ("api", "set")


def _related(error_key: str | None, key: str) -> bool:
    """Whether an error about error_key is about the value set at key."""
    if error_key is None:
        return False
    return error_key == key or error_key.startswith(key + ".") or key.startswith(
        error_key + ".")


def load_scenario_set(path: str | Path, items: Sequence[str],
                      case_dir_override: str | Path | None = None,
                      import_kernels: bool = True) -> Any:
    """The scenario file with the `--set` items applied, validated as one document."""
    from npusim.scenario import read_scenario_file

    sets = parse_sets(items)
    doc, src, base = read_scenario_file(path)
    return apply_sets(doc, src, base, sets, case_dir_override, import_kernels)


def apply_sets(doc: dict[str, Any], src: str, base: Path, sets: Sequence[tuple[str, Any]],
               case_dir_override: str | Path | None = None, import_kernels: bool = True,
               origin: str = "command line") -> Any:
    """A scenario document with dotted keys set on it, validated as one document; an
    error about a set key names it (`--set KEY` from the command line, `set KEY` from
    the Python API)."""
    from npusim.scenario import scenario_from_doc

    where, option = _naming(origin)
    for key, value in sets:
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise InputError(where, option, f"{excerpt(key)}: allowed: a dotted scenario key, "
                             "e.g. workload.bs")
        try:
            set_dotted(doc, key, value)
        except ValueError:
            raise InputError(where, f"{option} {key}",
                             f"names no scenario key: a part of it is not a mapping in {src}"
                             ) from None
    try:
        return scenario_from_doc(doc, src, base, case_dir_override, import_kernels)
    except InputError as exc:
        if exc.source != src or not sets:
            raise
        for key, _ in sets:
            if _related(exc.key, key):
                raise InputError(where, f"{option} {key}", exc.message) from None
        given = ", ".join(f"{k}={excerpt(v)}" for k, v in sets)
        raise InputError(exc.source, exc.key, f"{exc.message} (with {option} {given})") from None
