"""Paths the user typed: `~` and `~user` expanded as a shell would.

`Path.expanduser` raises RuntimeError for an unknown `~user`; a shell leaves such a word
as it is, and so does npusim, so the path then fails as "not found" with the usual
one-line input error instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path


def user_path(text: str | Path) -> Path:
    p = Path(text)
    try:
        return p.expanduser()
    except RuntimeError:  # ~name of no user on this machine: a literal file name
        return p
