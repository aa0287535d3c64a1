"""Paths the user typed: `~` and `~user` expanded as a shell would, and made absolute
with a loop of symbolic links refused as bad input.

`Path.expanduser` raises RuntimeError for an unknown `~user`; a shell leaves such a word
as it is, and so does npusim, so the path then fails as "not found" with the usual
one-line input error instead of a traceback. `Path.resolve` raises RuntimeError (Python
3.11, 3.12) or OSError ELOOP (3.13) on a symlink loop; `resolved` turns both into one
InputError naming where the path was given.
"""

from __future__ import annotations

import errno
from pathlib import Path

from npusim.errors import InputError

LOOP = "is a loop of symbolic links; allowed: a path that leads to a file or folder"


def user_path(text: str | Path) -> Path:
    p = Path(text)
    try:
        return p.expanduser()
    except RuntimeError:  # ~name of no user on this machine: a literal file name
        return p


def is_loop(path: Path) -> bool:
    """Whether resolving path never ends (a test that is False for it reads "not found")."""
    try:
        resolved(path, "", None)
    except InputError:
        return True
    except OSError:
        return False
    return False


def resolved(path: Path, source: str, key: str | None) -> Path:
    """path made absolute, symlinks followed; InputError(source, key) on a loop."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise
        raise InputError(source, key, f"{path} {LOOP}") from None
