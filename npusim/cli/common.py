"""What every command shares: the exit codes, one-line messages, and the parsing of the
numeric options (tolerances, counts, --workers) into InputErrors naming the option."""

from __future__ import annotations

import math
import sys

from npusim.errors import InputError

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_KERNEL = 0, 1, 2, 3


def one_line(text: str) -> str:
    return " ".join(text.split())


def err(text: str) -> None:
    print(text, file=sys.stderr)


def tolerance(text: str, option: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise InputError(
            "command line", option, f"{text!r}: expected a number or a percentage"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise InputError(
            "command line",
            option,
            f"{text[:40]!r}: allowed: a finite number >= 0 or a percentage (5%)",
        )
    return value


def count(text: str, option: str) -> int:
    """A whole number >= 1 given on the command line."""
    try:
        value = int(text) if len(text) <= 18 else 0
    except ValueError:
        value = 0
    if value < 1:
        raise InputError("command line", option, f"{text[:40]!r}: allowed: a whole number >= 1")
    return value


def workers(text: str | None) -> int | None:
    """--workers N: a whole number >= 1 (None: the command's default)."""
    return None if text is None else count(text, "--workers")
