"""Trace records: what the model did, as plain data.

The report layer reads these and nothing else, so it never touches simpy. Times are
nanoseconds of simulated time from the start of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Span:
    """One interval of activity on one lane of one core.

    lane is one of: "phase" (a kernel phase such as send_data), "scalar", "vector",
    "mte2", "mte3" (pipe activity) or "wait" (blocked on a flag, barrier or event).
    """

    rank: int
    core: int
    lane: str
    name: str
    start_ns: float
    end_ns: float
    bytes: int = 0


@dataclass
class Trace:
    """Collects spans; pipe-level spans only when detailed tracing is on (they are many)."""

    detailed: bool = False
    spans: list[Span] = field(default_factory=list)

    def phase(self, rank: int, core: int, name: str, start_ns: float, end_ns: float) -> None:
        self.spans.append(Span(rank, core, "phase", name, start_ns, end_ns))

    def activity(
        self, rank: int, core: int, lane: str, name: str, start_ns: float, end_ns: float,
        nbytes: int = 0,
    ) -> None:
        if self.detailed:
            self.spans.append(Span(rank, core, lane, name, start_ns, end_ns, nbytes))
