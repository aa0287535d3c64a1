"""Reading a scenario file: its bytes as UTF-8 YAML, one mapping of scenario keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.paths import resolved, user_path
from npusim.useryaml import load_text


def read_yaml(path: Path, src: str) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InputError(src, None, "is a directory, expected a scenario YAML file") from None
    except OSError as exc:
        raise InputError(src, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(src, None, f"not UTF-8 text (byte {exc.start})") from None
    doc = load_text(text, src)
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise InputError(src, None, f"must be a YAML mapping of scenario keys, got {kind}")
    return doc


def read_scenario_file(path: str | Path) -> tuple[dict[str, Any], str, Path]:
    """A scenario file's document, its name for errors and its folder (for relative paths)."""
    src = str(path)
    if not src or "\x00" in src:
        raise InputError(src or "<empty path>", None, "not a valid file path")
    p = user_path(src)
    return read_yaml(p, src), src, resolved(p, src, None).parent
