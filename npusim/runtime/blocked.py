"""The cores a run left unfinished, summarised so the message stays short at any scale.

A deadlock or a simulated-time limit at W = 768 leaves tens of thousands of cores
waiting, mostly at a handful of places in the program. The summary groups them by step
and by what they wait for (pipe and instruction, poll name), with the rank, core and
address of one example per group; the full list, one line per core, is kept for
blocked.txt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from npusim.runtime.context import KernelContext

# Characters of the groups part of a summary; further groups are counted, not shown.
GROUPS_BUDGET = 300


@dataclass(frozen=True)
class Unfinished:
    """One core that had not finished: where it is and what it waits for."""

    rank: int
    core: int | str
    step: str
    what: str  # common to the cores of a group ("wait for mte2 'read_state'")
    detail: str  # about this core's bytes, or ''
    address: int | None
    line: str  # the full line of blocked.txt

    @classmethod
    def of(cls, ctx: KernelContext) -> Unfinished:
        what, detail, address = ctx.wait_parts()
        line = (f"rank {ctx.rank_id} core {ctx.core_label} in step {ctx.step!r}: "
                + (f"waits for {ctx.describe_wait()}" if ctx.waiting is not None else what))
        return cls(ctx.rank_id, ctx.core_label, ctx.step, what, detail, address, line)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _group_text(members: list[Unfinished]) -> str:
    first = members[0]
    ranks = sorted({u.rank for u in members})
    where = f"on rank {ranks[0]}" if len(ranks) == 1 else f"on {len(ranks)} ranks"
    example = f"rank {first.rank} core {first.core}"
    if first.address is not None:
        example += f" at 0x{first.address:x}"
    if first.detail:  # '; ' separates the groups
        example += f": {first.detail.replace('; ', ', ')}"
    lead = "" if len(members) == 1 else "e.g. "
    return (f"{_plural(len(members), 'core')} {where}, step {first.step!r}, {first.what} "
            f"({lead}{example})")


def summarise(cores: Iterable[Unfinished]) -> str:
    """The groups, largest first, as long as they fit GROUPS_BUDGET (always one)."""
    groups: dict[tuple[str, str], list[Unfinished]] = {}
    for u in cores:
        groups.setdefault((u.step, u.what), []).append(u)
    ordered = sorted(groups.values(), key=lambda g: -len(g))  # stable: program order ties
    shown: list[str] = []
    used = 0
    for g in ordered:
        text = _group_text(g)
        if shown and used + len(text) > GROUPS_BUDGET:
            break
        shown.append(text)
        used += len(text) + 2
    rest = len(ordered) - len(shown)
    if rest:
        shown.append(f"+{_plural(rest, 'more group')}")
    return "; ".join(shown)
