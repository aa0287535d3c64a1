"""`npusim advise`'s ranking: each candidate's band from its own ledger, the tie rule, and
the words for a verdict.

A candidate's band is the largest of its ops' bands (`Ledger.band`: the worst row of the
measured tables that vouch for the op at this shape, else the declared uncalibrated band).
Two candidates tie when their difference is within the larger of their two bands, relative
to the faster: the model cannot tell them apart, so nothing says one wins. A tie names
the measurement that would break it: the uncalibrated candidates' ops at this shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npusim.fidelity import Ledger

# the MoE shape's keys as a measurement names them
SHAPE_LABELS = (("bs", "BS"), ("h", "H"), ("k", "K"), ("ep_world_size", "EP"))
NOT_SHAPE = ("kernel", "timing_only", "op")  # workload keys a family-own shape leaves out


def pct(x: float) -> str:
    """0.25 -> '25%', 0.032 -> '3.2%': no more digits than the figure has."""
    return f"{x:.0%}" if round(x * 100, 6).is_integer() else f"{x:.1%}"


@dataclass(frozen=True)
class Band:
    """A candidate's error band and where it comes from."""

    value: float  # relative
    source: str  # one phrase: the table and its worst row, or why uncalibrated
    unvouched: tuple[str, ...] = ()  # its ops no table vouches for


def band_of(ledgers: Sequence[Ledger], uncalibrated: float) -> Band:
    """The largest band of a run's ops, with the source of that band."""
    if not ledgers:
        return Band(uncalibrated, f"no op, assumed ±{pct(uncalibrated)}")
    worst = max(ledgers, key=lambda led: (led.band(uncalibrated), not led.calibrated))
    unvouched = tuple(led.op for led in ledgers if not led.calibrated)
    return Band(worst.band(uncalibrated), _source(worst, uncalibrated), unvouched)


def _source(led: Ledger, uncalibrated: float) -> str:
    if led.calibrated:
        fit = max((t for t in led.tables if t.vouches), key=lambda t: t.worst or 0.0)
        return f"{fit.table} table, worst row {fit.worst_row} ±{pct(fit.worst or 0.0)}"
    why = led.why or next((t.outside_why for t in led.tables if t.outside_why), "")
    why = f" ({why})" if why else ""
    return f"uncalibrated{why}, assumed ±{pct(uncalibrated)}"


def shape_words(workload: Mapping[str, Any]) -> str:
    """'BS 8, H 7168, K 8, EP 8'; a family-own shape: its options as they are."""
    if "ep_world_size" in workload:
        return ", ".join(f"{label} {workload[k]}" for k, label in SHAPE_LABELS
                         if k in workload)
    return ", ".join(f"{k} {v}" for k, v in workload.items() if k not in NOT_SHAPE)


@dataclass(frozen=True)
class Entry:
    """One candidate's result at one point."""

    candidate: Any  # advise.Candidate
    ops: Mapping[str, float]  # op -> latency us
    total_us: float
    critical: str  # "op.phase" of the op that takes longest
    phases: Mapping[str, Mapping[str, tuple[float, float]]]  # op -> phase -> (start, end) us
    wire_bytes: int
    band: Band
    workload_op: str = ""  # the shape's op (dispatch_combine): what a measurement times
    where: str = ""  # "atlas_a3 at BS 8, H 7168, K 8, EP 8"

    @property
    def name(self) -> str:
        return f"{self.candidate.label} ({self.candidate.quant})"

    def unmeasured(self) -> str:
        """What to measure so that its band is a table's: its unvouched ops, or the shape's
        op when that is all of them."""
        if set(self.band.unvouched) >= set(self.ops):
            return self.workload_op
        return " and ".join(self.band.unvouched)


def ties(a: Entry, b: Entry) -> bool:
    """Within the larger of the two bands, relative to the faster."""
    fast, slow = sorted((a.total_us, b.total_us))
    return slow - fast <= max(a.band.value, b.band.value) * fast


@dataclass
class Ranking:
    """Candidates by time, shortest first, in groups: each group is a head and the
    candidates after it that tie with it (a tie is not transitive, so a group is read from
    its head)."""

    entries: list[Entry]

    @property
    def groups(self) -> list[list[Entry]]:
        out: list[list[Entry]] = []
        for e in self.entries:
            if out and ties(out[-1][0], e):
                out[-1].append(e)
            else:
                out.append([e])
        return out

    @property
    def tied(self) -> list[Entry]:
        """The first group: the candidates the model cannot tell from the first."""
        return self.groups[0] if self.entries else []

    def places(self) -> list[tuple[int, bool]]:
        """Per entry its place (its group head's) and whether it shares it."""
        out = []
        for g in self.groups:
            out += [(len(out) + 1, len(g) > 1)] * len(g)
        return out

    def why(self) -> str:
        """One line: the tie and what would break it, or the verdict outside both bands."""
        if not self.entries:
            return "nothing could run this shape"
        first = self.entries[0]
        if len(self.entries) == 1:
            return f"{first.name} is the only candidate that runs this shape"
        group = self.tied
        if len(group) > 1:
            return _tie_words(group)
        return _lead_words(first, self.entries[1])


def _tie_words(group: Sequence[Entry]) -> str:
    first, last = group[0], group[-1]
    owner = max(group, key=lambda e: e.band.value)  # the band each pair with the first used
    gap = last.total_us - first.total_us
    names = ", ".join(e.name for e in group)
    same = len({(e.band.value, e.band.source) for e in group}) == 1
    whose = "each one's band" if same else f"{owner.name}'s band, the larger"
    text = (f"tie: {names} are {gap:.1f} us ({pct(gap / first.total_us)}) apart, within "
            f"±{pct(owner.band.value)} ({whose}: {owner.band.source})")
    open_ = [e for e in group if e.band.unvouched]
    if not open_:
        return (f"{text}; every one is calibrated here: only measurements closer than "
                f"±{pct(owner.band.value)} would break it")
    ops = {e.unmeasured() for e in open_}
    if len(open_) == len(group) > 2 and len(ops) == 1:  # no need to name them all again
        return f"{text}; a measured {ops.pop()} of each on {first.where} would break it"
    return f"{text}; a measured {_measurements(open_)} on {first.where} would break it"


def _measurements(entries: Sequence[Entry]) -> str:
    """'tilelang_shmem dispatch_combine', 'a, b dispatch_combine and c combine': the
    candidates by what each lacks, with their quantisation where any is quantised."""
    plain = all(e.candidate.quant == "none/none" for e in entries)
    by_op: dict[str, list[str]] = {}
    for e in entries:
        by_op.setdefault(e.unmeasured(), []).append(e.candidate.label if plain else e.name)
    return " and ".join(f"{', '.join(dict.fromkeys(names))} {op}"
                        for op, names in by_op.items())


def _lead_words(first: Entry, second: Entry) -> str:
    gap = second.total_us - first.total_us
    lead = (f"{first.name} wins by {gap:.1f} us ({pct(gap / first.total_us)}) over "
            f"{second.name}, outside both bands (±{pct(first.band.value)}, "
            f"±{pct(second.band.value)}): ")
    if not first.ops.keys() & second.ops.keys():  # other kernels (a fused form): list both
        return lead + f"{_op_list(first)} against {_op_list(second)}"
    ops = dict.fromkeys([*first.ops, *second.ops])
    op, delta = max(((op, second.ops.get(op, 0.0) - first.ops.get(op, 0.0)) for op in ops),
                    key=lambda x: x[1])
    if op not in first.ops:
        return lead + f"most of it in {op} ({delta:+.1f} us), which the winner does not run"
    ph_a, ph_b = _durations(first, op), _durations(second, op)
    ph = max(ph_b, key=lambda n: ph_b[n] - ph_a.get(n, 0.0)) if ph_b else None
    where = (f", {ph} {ph_a[ph]:.1f} vs {ph_b[ph]:.1f} us" if ph in ph_a
             else f", the runner-up's {ph} ({ph_b[ph]:.1f} us)" if ph else "")
    return lead + f"most of it in {op} ({delta:+.1f} us){where}"


def _op_list(e: Entry) -> str:
    """'gmm1 665.4, combine 258.9 us': an entry's kernels, longest first."""
    ops = sorted(e.ops.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{op} {us:.1f}" for op, us in ops) + " us"


def _durations(e: Entry, op: str) -> dict[str, float]:
    return {n: round(end - start, 4) for n, (start, end) in e.phases.get(op, {}).items()}


def rank(entries: Sequence[Entry]) -> Ranking:
    """Fastest first (by time; the bands decide only what may be said of the order)."""
    return Ranking(sorted(entries, key=lambda e: (e.total_us, e.candidate.label,
                                                  e.candidate.quant)))


def winners(rankings: Sequence[tuple[Any, Ranking]]) -> list[tuple[Any, str]]:
    """Per axis value the first's name, or 'tie: a, b' for those that tie with it."""
    out = []
    for value, r in rankings:
        group = r.tied
        if not group:
            out.append((value, "-"))
        elif len(group) > 1:  # the same tie whichever of them is a hair ahead
            out.append((value, "tie: " + ", ".join(sorted(e.name for e in group))))
        else:
            out.append((value, group[0].name))
    return out


def crossovers(rankings: Sequence[tuple[Any, Ranking]], axis: str, preset: str) -> list[str]:
    """Where the first place changes along the axis, one line each; a lone first place is
    outside both bands of every other candidate, so only it is called a win."""
    short = axis.removeprefix("workload.")
    short = short.upper() if short in ("bs", "h", "k") else short
    won = winners(rankings)
    lines = []
    for (_, before), (value, now) in zip(won, won[1:], strict=False):
        if now == before:
            continue
        if now.startswith("tie") or before.startswith("tie") or "-" in (now, before):
            lines.append(f"from {short} {value}, {now} (before: {before}) on {preset}")
        else:
            lines.append(f"from {short} {value}, {now} beats {before}, outside both bands, "
                         f"on {preset}")
    return lines
