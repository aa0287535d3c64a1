"""The simpy environment npusim runs on, counting the events it processes."""

from __future__ import annotations

import simpy


class SimEnv(simpy.Environment):
    """simpy.Environment in nanoseconds that counts processed events (for speed reports)."""

    def __init__(self) -> None:
        super().__init__(initial_time=0.0)
        self.events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()
