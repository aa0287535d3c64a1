"""The simpy environment npusim runs on, counting the events it processes; and the garbage
collector pause its event loops run under."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import simpy


class SimEnv(simpy.Environment):
    """simpy.Environment in nanoseconds that counts processed events (for speed reports).

    `step()` is simpy's own; an event loop that wants the count adds its steps to
    `events_processed` (launch does), which keeps a Python frame off every event."""

    def __init__(self) -> None:
        super().__init__(initial_time=0.0)
        self.events_processed = 0


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while an event loop runs.

    A simulation allocates millions of short-lived objects (events, heap entries, spans),
    and the collector's full passes walk every live one: at W = 64 they took half of the
    run time. Nothing in the loop relies on the collector (the engine and the runtime
    break the reference cycles they make), so reference counting frees the memory; the
    collector runs again afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
