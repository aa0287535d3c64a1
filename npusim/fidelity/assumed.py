"""The assumed preset values an op's time rests on, as the shipped sensitivity records
hold them (configs/sensitivity/<preset>/<family>.json, written by `npusim sensitivity`
through npusim.sensitivity.records): their JSON form and reading them for a ledger.

Reading a record runs nothing: a run's ledger (npusim.fidelity.run) takes its assumed
values from here, below the perturbed runs that measure them (npusim.sensitivity.perturb).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from npusim.fidelity.ledger import Assumed

STEP = 0.10  # the relative step of every perturbed value


def stepped(value: float) -> float:
    """The value raised by STEP; an integer by max(1, round(STEP x value))."""
    if isinstance(value, int):
        return value + max(1, round(STEP * value))
    return value * (1.0 + STEP)


def assumed_doc(a: Assumed) -> dict[str, Any]:
    """An Assumed as JSON, with `up`: the value its effect was measured at (an integer
    steps by at least 1, so a small one by more than 10%)."""
    return {"key": a.key, "value": a.value, "unit": a.unit, "range": [a.lo, a.hi],
            "up": stepped(a.value), "effect": a.effect,
            "span": list(a.span) if a.span is not None else None}


def assumed_from_doc(d: Mapping[str, Any], at: str) -> Assumed:
    span = d.get("span")
    return Assumed(d["key"], d["value"], d["unit"], d["range"][0], d["range"][1],
                   d["effect"], tuple(span) if span is not None else None, at)


def record_path(family: str, preset: str) -> Path:
    """A shipped sensitivity record: configs/sensitivity/<preset>/<family>.json."""
    from npusim.shipped import configs_dir

    return configs_dir() / "sensitivity" / preset / f"{family}.json"


@lru_cache(maxsize=64)
def _record(family: str, preset: str) -> dict[str, Any] | None:
    path = record_path(family, preset)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def assumed_of(family: str, preset: str, op: str) -> tuple[Assumed, ...]:
    """The assumed values `op` of `family` on the shipped `preset` moves with most, largest
    effect first, from the shipped sensitivity record (() when there is none)."""
    rec = _record(family, preset)
    entry = rec["ops"].get(op) if rec is not None else None
    if entry is None:
        return ()
    return tuple(assumed_from_doc(d, entry["at"]) for d in entry["assumed"])
