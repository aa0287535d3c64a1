"""What kind of value a caller gave, checked once for the scenario loader, the hardware
loader and the Python API.

Python callers hand npusim values YAML never makes: numpy scalars (np.int64(16) is a
count like 16), strings where a flag belongs ("false" is true to Python), containers that
hold themselves. Each check here either gives the value in a plain Python type or raises
one InputError naming the argument and what is allowed (docs/api.md), so nothing deeper
meets a TypeError or a RecursionError.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from npusim.errors import InputError, excerpt

API = "api"  # the source the Python API's errors name
MAX_DEPTH = 64  # nesting levels of a document or value; a scenario needs fewer than 10


def is_integer(raw: Any) -> bool:
    """An integer of any kind (Python's, numpy's int64, ...), never a bool: true and false
    are YAML's booleans, not counts."""
    return isinstance(raw, numbers.Integral) and not isinstance(raw, bool)


def is_number(raw: Any) -> bool:
    """A real number of any kind (numpy's float32 included), never a bool."""
    return isinstance(raw, numbers.Real) and not isinstance(raw, bool)


def is_finite(raw: Any) -> bool:
    """A finite real number, never a bool; an integer past float's range is not (its
    math.isfinite would raise OverflowError)."""
    return is_number(raw) and math.isfinite(as_float(raw))


def as_number(raw: Any) -> int | float:
    """A number (is_number) as Python's int or float."""
    return int(raw) if is_integer(raw) else as_float(raw)


def as_float(raw: Any) -> float:
    """A number (is_number) as a float; one past float's range is an infinity."""
    try:
        return float(raw)
    except OverflowError:
        return math.inf if raw > 0 else -math.inf


def flag(value: Any, name: str) -> bool:
    """A real bool: "false" or 1 would silently mean true or a count."""
    if not isinstance(value, bool):
        raise InputError(API, name, f"{excerpt(value)}; allowed: True or False")
    return value


def whole(value: Any, name: str, lo: int = 1) -> int:
    """An integer >= lo (numpy's included, a bool not)."""
    if not is_integer(value) or int(value) < lo:
        raise InputError(API, name, f"{excerpt(value)}; allowed: an integer >= {lo}")
    return int(value)


def finite(value: Any, name: str, lo: float = 0.0) -> float:
    """A finite real number >= lo (numpy's included, a bool not)."""
    number = as_float(value) if is_number(value) else math.nan
    if not math.isfinite(number) or number < lo:
        raise InputError(API, name, f"{excerpt(value)}; allowed: a finite number >= {lo:g}")
    return number


def path(value: Any, name: str) -> Path:
    """A file or folder path given as text or a path object, not empty, without NUL."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text or "\x00" in text:
        raise InputError(API, name, f"{excerpt(value)}; allowed: a path (str or Path), "
                         "not empty, without NUL characters")
    return Path(text)


def callback(value: Any, name: str) -> Callable[..., Any] | None:
    """None or something to call."""
    if value is not None and not callable(value):
        raise InputError(API, name, f"{excerpt(value)}; allowed: None or a callable")
    return value


def plain(value: Any, name: str) -> Any:
    """A deep copy of a caller's value as plain dicts and lists (validation may not change
    the caller's data); a container inside itself, or nested past MAX_DEPTH, is refused."""
    return _copy(value, name, set(), 0)


def _copy(value: Any, name: str, open_ids: set[int], depth: int) -> Any:
    if not isinstance(value, (Mapping, list, tuple)):
        return value
    if id(value) in open_ids:
        raise InputError(API, name, "a mapping or list that contains itself; allowed: a "
                         "document of mappings, lists and values")
    if depth >= MAX_DEPTH:
        raise InputError(API, name, f"nested deeper than {MAX_DEPTH} levels; allowed: a "
                         "document of mappings, lists and values")
    open_ids.add(id(value))
    if isinstance(value, Mapping):
        out: Any = {k: _copy(v, name, open_ids, depth + 1) for k, v in value.items()}
    else:
        out = [_copy(v, name, open_ids, depth + 1) for v in value]
    open_ids.discard(id(value))
    return out
