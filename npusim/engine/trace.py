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
    For an MTE transfer end_ns is when its last byte left the pipe (the pipe is free
    again) and delivered_ns when the bytes landed; flight latencies overlap the next
    transfer, so only [start_ns, end_ns] is the pipe's occupancy.
    """

    rank: int
    core: int
    lane: str
    name: str
    start_ns: float
    end_ns: float
    bytes: int = 0
    delivered_ns: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """A shared resource's used bandwidth (GB/s) from t_ns until its next sample."""

    resource: str
    kind: str  # "egress" | "ingress" | "d2d" | "hbm", or a level's ("server.egress")
    rank: int
    t_ns: float
    gbps: float


@dataclass
class Trace:
    """Collects spans; pipe-level spans and link samples only when detailed tracing is on
    (they are many)."""

    detailed: bool = False
    spans: list[Span] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    _last: dict[str, int] = field(default_factory=dict, repr=False)

    def phase(self, rank: int, core: int, name: str, start_ns: float, end_ns: float) -> None:
        self.spans.append(Span(rank, core, "phase", name, start_ns, end_ns))

    def activity(
        self, rank: int, core: int, lane: str, name: str, start_ns: float, end_ns: float,
        nbytes: int = 0, delivered_ns: float | None = None,
    ) -> None:
        if self.detailed:
            self.spans.append(Span(rank, core, lane, name, start_ns, end_ns, nbytes,
                                   delivered_ns))

    def sample(self, resource: str, kind: str, rank: int, t_ns: float, gbps: float) -> None:
        """Record a resource's rate; of several changes at one instant only the last is
        kept, and a sample equal to the previous one is dropped."""
        i = self._last.get(resource)
        if i is not None:
            prev = self.samples[i]
            if prev.t_ns == t_ns:
                self.samples[i] = Sample(resource, kind, rank, t_ns, gbps)
                return
            if prev.gbps == gbps:
                return
        self._last[resource] = len(self.samples)
        self.samples.append(Sample(resource, kind, rank, t_ns, gbps))
