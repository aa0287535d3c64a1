"""The ledger's data: what vouches for one op's time, and what it rests on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_BAND = 0.25  # the error assumed of a time no table vouches for (advise --band)


@dataclass(frozen=True)
class TableFit:
    """One measured table's word on a family at a preset, for one op and shape."""

    table: str  # the shipped table's name ("atlas_a3", "atlas_a3_hixl")
    rows: int  # the table's rows of this family and op
    simulated: int  # of them, simulated in the table's current validation record
    mape: float | None  # over the simulated rows matching the shape's fixed keys (None: none)
    worst: float | None  # the largest |error| among those rows
    worst_row: str  # its label
    inside: bool  # the shape lies within those rows' range, key by key
    outside_why: str = ""  # one line when not inside (or when the record is not current)

    @property
    def vouches(self) -> bool:
        return self.inside and self.worst is not None


@dataclass(frozen=True)
class Assumed:
    """An assumed preset value the op's time depends on."""

    key: str  # dotted preset key
    value: float
    unit: str
    lo: float  # its declared plausible range
    hi: float
    effect: float  # relative change of the op's time when the value grows by 10%
    span: tuple[float, float] | None = None  # relative change at lo and at hi, if computed
    at: str = ""  # where it was measured: "this run", or the reference scenario's name


@dataclass(frozen=True)
class Ledger:
    """One op's fidelity."""

    family: str
    preset: str
    op: str
    tables: tuple[TableFit, ...] = ()
    assumed: tuple[Assumed, ...] = ()  # largest |effect| first
    why: str = ""  # why no table vouches ("" when one does)

    @property
    def calibrated(self) -> bool:
        return any(t.vouches for t in self.tables)

    def band(self, uncalibrated: float = DEFAULT_BAND) -> float:
        """The error to allow this op's time: the worst row of the tables that vouch for
        it (the largest of them), else `uncalibrated`."""
        worst = [t.worst for t in self.tables if t.vouches and t.worst is not None]
        return max(worst) if worst else uncalibrated

    def as_doc(self) -> dict[str, Any]:
        raise NotImplementedError

    def lines(self) -> list[str]:
        raise NotImplementedError


def ledger_of(family: str, preset: str, workload: Mapping[str, Any], op: str,
              off_preset: str = "") -> Ledger:
    """The ledger of one op of a run of `family` on the shipped preset `preset` at the
    scenario's `workload` (its validated keys); `off_preset` says why the hardware is
    not the shipped preset (hardware_overrides, a preset file): then nothing vouches."""
    if off_preset:
        return Ledger(family, preset, op, why=off_preset)
    return Ledger(family, preset, op, why="not yet computed")
