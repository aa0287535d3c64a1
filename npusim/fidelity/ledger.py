"""The ledger's data: what vouches for one op's time, and what it rests on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
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
    matched: int = 0  # the simulated rows mape and worst are over

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
        """Plain data for a report (docs/report.md, `fidelity`)."""
        return {
            "family": self.family,
            "preset": self.preset,
            "calibrated": self.calibrated,
            "band": self.band(),
            "why": self.why,
            "tables": [asdict(t) for t in self.tables],
            "assumed": [{**asdict(a), "span": list(a.span) if a.span else None}
                        for a in self.assumed],
        }

    def lines(self) -> list[str]:
        """The ledger as text, a line per table and one for the assumed values."""
        return doc_lines(self.as_doc())


def doc_lines(doc: Mapping[str, Any]) -> list[str]:
    """A ledger's lines from its document (a saved report's `fidelity`)."""
    out = [status_line(doc)]
    out += [f"{t['table']}: {table_text(t)}" for t in doc.get("tables", [])]
    line = assumed_line(doc.get("assumed", []))
    return [*out, line] if line else out


def status_line(doc: Mapping[str, Any]) -> str:
    """'calibrated by T (n rows, MAPE, worst row)' or 'uncalibrated (why)'."""
    fit = vouching(doc)
    if fit is None:
        return f"uncalibrated ({doc.get('why') or 'no table vouches'})"
    return calibrated_text(fit["table"], fit.get("matched") or fit["simulated"], fit["mape"],
                           fit["worst"], fit["worst_row"])


def vouching(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The table that vouches for a ledger's op (the first, if several), None if none."""
    if not doc.get("calibrated"):
        return None
    return next(t for t in doc.get("tables", []) if t.get("inside") and t.get("worst") is not None)


def calibrated_text(table: str, rows: int, mape: float, worst: float, worst_row: str) -> str:
    return (f"calibrated by {table} ({rows} row{'s' * (rows != 1)}, MAPE {100 * mape:.1f}%, worst "
            f"{100 * worst:.1f}% {worst_row})")


def table_text(t: Mapping[str, Any]) -> str:
    """One table's figures: rows, simulated, MAPE and worst, inside or why not."""
    text = f"{t['rows']} rows, {t['simulated']} simulated"
    if t.get("worst") is not None:
        text += (f", MAPE {100 * t['mape']:.1f}%, worst {100 * t['worst']:.1f}% "
                 f"({t['worst_row']})")
    return text + ("; shape inside" if not t.get("outside_why") else f"; {t['outside_why']}")


SIGNIFICANT = 0.0005  # an effect that shows as 0.1% or more


def assumed_text(assumed: list[Mapping[str, Any]], most: int = 3) -> str:
    """The first assumed values that move the time by 0.1% or more per +10%, and their
    effect: 'key (+4.2% per +10%), ...' ('' when none does)."""
    shown = [a for a in assumed if abs(a["effect"]) >= SIGNIFICANT][:most]
    return ", ".join(f"{a['key']} ({100 * a['effect']:+.1f}% per +10%)" for a in shown)


def assumed_line(assumed: list[Mapping[str, Any]]) -> str:
    """'rests most on KEY (+x% per +10%), ... (at SCENARIO)' for the values, largest effect
    first, that move the time by 0.1% or more; that none does, if none; '' without any."""
    rests = assumed_text(assumed)
    if rests:
        return f"rests most on {rests}{measured_at(assumed[:3])}"
    return f"no assumed value moves it by 0.1% per +10%{measured_at(assumed)}" if assumed else ""


def measured_at(assumed: list[Mapping[str, Any]]) -> str:
    """Where the effects were measured, in words: ' (at SCENARIO)' for one reference
    scenario, ' (at the reference scenarios)' for several, '' for this run's own."""
    where = sorted({str(a.get("at", "")) for a in assumed} - {"", "this run"})
    if not where:
        return ""
    return f" (at {where[0]})" if len(where) == 1 else " (at the reference scenarios)"
