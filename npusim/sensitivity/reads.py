"""Which preset keys a run reads: the keys worth perturbing.

A hardware config is frozen dataclasses, read by attribute at machine build and in the
kernels' programs. A run on a copy whose every section records the attributes read
learns the dotted keys its timing can depend on: a key never read cannot move a time.
The report's copy of the whole config (HardwareConfig.to_dict, at the end of a run) is
not a read of the timing, so it is left out. A shipped preset's 38 assumed keys are read
8 (shmem_classic/a3_bs8_ep8) to 16 (frameworks/pypto_a3_w16_bs8) at a time, so learning
them costs one run and saves most of the perturbed ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class _Reads:
    """The keys read so far; `off` while the whole config is copied for the report."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.off = 0


def _watched(obj: Any, prefix: str, reads: _Reads) -> Any:
    """A copy of a config section whose field reads land in `reads` as dotted keys (a
    fabric level's as fabric.levels.<name>.<field>, as presets spell them)."""
    if isinstance(obj, tuple) and obj and all(dataclasses.is_dataclass(x) for x in obj):
        return tuple(_watched(x, f"{prefix}.{x.name}", reads) for x in obj)
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    cls = type(obj)
    names = frozenset(f.name for f in dataclasses.fields(obj))

    def getattribute(self: Any, name: str) -> Any:
        if name in names and not reads.off:
            reads.keys.add(f"{prefix}.{name}" if prefix else name)
        return object.__getattribute__(self, name)

    body: dict[str, Any] = {"__getattribute__": getattribute}
    if not prefix:
        def to_dict(self: Any) -> dict[str, Any]:
            reads.off += 1
            try:
                return cls.to_dict(self)
            finally:
                reads.off -= 1
        body["to_dict"] = to_dict
    copy = object.__new__(type(f"Watched{cls.__name__}", (cls,), body))
    for f in dataclasses.fields(obj):
        child = f"{prefix}.{f.name}" if prefix else f.name
        object.__setattr__(copy, f.name, _watched(getattr(obj, f.name), child, reads))
    return copy


def run_reading(scenario: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """Simulate the scenario in this process (one worker: a forked kernel's reads would
    be lost) and return its report and the dotted hardware keys the run read."""
    from npusim.report.build import build_report
    from npusim.sim import simulate

    reads = _Reads()
    watched = dataclasses.replace(scenario, hardware=_watched(scenario.hardware, "", reads))
    report = build_report(simulate(watched, workers=1))
    return report, frozenset(reads.keys)
