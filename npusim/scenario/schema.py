"""The scenario's value checks: a mapping's keys, and ints, numbers, booleans, choices and
strings within what is allowed; a declared Option checked by its kind. Each problem is one
InputError naming the file, the dotted key and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from npusim.errors import InputError, excerpt, key_text
from npusim.kernels.family import Option
from npusim.suggest import did_you_mean
from npusim.values import as_number, is_integer, is_number


def dotted(prefix: str, key: object) -> str:
    return f"{prefix}.{key_text(key)}" if prefix else key_text(key)


def section(
    src: str, key: str, raw: Any, allowed: Iterable[str], required: Iterable[str] = ()
) -> dict[str, Any]:
    """Check a mapping's keys: unknown ones get a did-you-mean, missing required ones named."""
    allowed = list(allowed)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        where = key or None
        raise InputError(src, where, f"must be a mapping with keys: {', '.join(allowed)}")
    for k in raw:
        if not isinstance(k, str) or k not in allowed:
            hint = did_you_mean(str(k), allowed)
            raise InputError(
                src, dotted(key, k), f"unknown key{hint}; allowed: {', '.join(allowed)}"
            )
    for r in required:
        if r not in raw:
            raise InputError(src, dotted(key, r), "missing (required)")
    return raw


def show(raw: Any) -> str:
    """A value as the user wrote it in YAML (true, null), not as Python prints it, and
    at most a short excerpt of it (errors.excerpt)."""
    return excerpt(raw)


def integer(src: str, key: str, raw: Any, lo: int, hi: int | None, why: str = "") -> int:
    span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    note = f" ({why})" if why else ""
    if not is_integer(raw):
        raise InputError(src, key, f"must be an integer {span}{note}, got {show(raw)}")
    raw = int(raw)
    if raw < lo or (hi is not None and raw > hi):
        raise InputError(src, key, f"{show(raw)} is out of range; allowed: {span}{note}")
    return raw


def number(src: str, key: str, raw: Any, lo: float, hi: float, *, lo_open: bool) -> float:
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if not is_number(raw):
        raise InputError(src, key, f"must be a number in {span}, got {show(raw)}")
    raw = as_number(raw)
    if isinstance(raw, float) and not math.isfinite(raw):
        raise InputError(src, key, f"{show(raw)} is out of range, not a finite number; "
                         f"allowed: {span}")
    bad_lo = raw <= lo if lo_open else raw < lo  # int against float: exact, never overflows
    if bad_lo or raw > hi:
        raise InputError(src, key, f"{show(raw)} is out of range; allowed: {span}")
    return float(raw)


def boolean(src: str, key: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise InputError(src, key, f"must be true or false, got {show(raw)}")
    return raw


def choice(src: str, key: str, raw: Any, choices: tuple[str, ...]) -> str:
    allowed = ", ".join(choices)
    if not isinstance(raw, str):
        raise InputError(src, key, f"must be one of: {allowed}; got {show(raw)}")
    if raw not in choices:
        hint = did_you_mean(raw, choices)
        raise InputError(src, key, f"unknown value {show(raw)}{hint}; allowed: {allowed}")
    return raw


def string(src: str, key: str, raw: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(raw, str) or (not empty_ok and not raw.strip()):
        raise InputError(src, key, f"must be a {'' if empty_ok else 'non-empty '}string")
    if "\x00" in raw:
        raise InputError(src, key, "must not contain NUL characters")
    return raw


def option_value(src: str, o: Option, raw: Any, prefix: str = "workload") -> Any:
    """`raw` as the declared option `o` allows it (`prefix`.name in errors)."""
    key = f"{prefix}.{o.name}"
    if o.kind == "choice":
        return choice(src, key, raw, o.choices)
    if o.kind == "bool":
        return boolean(src, key, raw)
    if o.kind == "str":
        return string(src, key, raw)
    lo = o.lo if o.lo is not None else -math.inf
    if o.kind == "int":
        return integer(src, key, raw, int(o.lo or 0), None if o.hi is None else int(o.hi))
    if o.kind == "ints":  # a list of integers, e.g. one per rank ([] when not given)
        if not isinstance(raw, (list, tuple)):
            raise InputError(src, key, f"must be a list of integers, got {show(raw)}")
        return tuple(integer(src, f"{key}[{i}]", v, int(o.lo or 0),
                          None if o.hi is None else int(o.hi)) for i, v in enumerate(raw))
    return number(src, key, raw, lo, o.hi if o.hi is not None else math.inf,
                  lo_open=o.lo_open)

