"""Progress of long commands on stderr: a W 256 run takes minutes, a sweep hours.

On a terminal one status line is redrawn in place (carriage return); otherwise (a log, a
CI job) a plain line is printed every PLAIN_EVERY_S seconds. Nothing is printed before
DELAY_S, so a run that ends in a second or two stays silent. The simulation loop pays
almost nothing: `launch` calls `tick` once every TICK_MASK + 1 events (a bit test per
event), and only `tick` reads the wall clock.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

DELAY_S = 2.0  # silent before this
LIVE_EVERY_S = 0.5  # redraw rate of the terminal line
PLAIN_EVERY_S = 20.0  # rate of plain lines when stderr is not a terminal
TICK_MASK = (1 << 12) - 1  # launch calls tick() when events & TICK_MASK == 0
CLOCK: Callable[[], float] = time.monotonic  # wall clock (tests put a fake one here)


class Progress:
    """A status line for one command; `update` is cheap to call often."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.live = bool(isatty and isatty()) if live is None else live
        self.every = LIVE_EVERY_S if self.live else PLAIN_EVERY_S
        self.clock = clock or CLOCK
        self.start = self.clock()
        self.next_at = self.start + DELAY_S
        self.pid = os.getpid()  # a forked child inherits the object but must not print
        self._drawn = False

    def elapsed(self) -> float:
        return self.clock() - self.start

    def update(self, text: Callable[[], str]) -> None:
        """Show text() if the next line is due (text is built only then)."""
        now = self.clock()
        if now < self.next_at or os.getpid() != self.pid:
            return
        self.next_at = now + self.every
        line = f"npusim: {text()}"
        if self.live:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write(f"\r{line[:width]}\x1b[K")
            self._drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        """A line that stays (a finished sweep point); the status line is redrawn later."""
        self.clear()
        self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Take the status line off the terminal (before other output, at the end)."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


def _clock_text(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


class RunProgress(Progress):
    """One run: its ops in turn, each op's simulated time and events from the launch loop."""

    def __init__(self, ops: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.ops = ops
        self.done = -1
        self.op = ""
        self.events_before = 0  # of the ops already done
        self.events = 0  # of the current op
        self.sim_ns = 0.0

    def begin_op(self, name: str) -> None:
        """simulate() starts an op (its `progress` callback)."""
        self.done += 1
        self.events_before += self.events
        self.op, self.events, self.sim_ns = name, 0, 0.0

    def tick(self, sim_ns: float, events: int) -> None:
        self.sim_ns, self.events = sim_ns, events
        self.update(self.text)

    def text(self) -> str:
        return (f"{max(self.done, 0)}/{self.ops} ops done; {self.op or 'setup'} at "
                f"{self.sim_ns / 1000:.3f} us simulated, "
                f"{self.events_before + self.events:,} events, {_clock_text(self.elapsed())}")


_watching: RunProgress | None = None


@contextmanager
def watching(p: RunProgress | None) -> Iterator[RunProgress | None]:
    """Route the launch loop's ticks to `p` (None: nobody watches) while the block runs."""
    global _watching
    before, _watching = _watching, p
    try:
        yield p
    finally:
        _watching = before
        if p is not None:
            p.clear()


def tick(sim_ns: float, events: int) -> None:
    """The launch loop's report, every TICK_MASK + 1 events: simulated ns, events so far."""
    p = _watching
    if p is not None:
        p.tick(sim_ns, events)
