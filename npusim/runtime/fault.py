"""A kernel program's own faults, told as a kernel error: where and what, in one line.

A program may raise (ValueError, ZeroDivisionError, RecursionError, even SystemExit),
yield something that is not an event, run its local clock past the simulated-time
limit without yielding, or loop without charging anything. None of these may end the
simulator with a traceback, a hang or a silent exit: each becomes a KernelError (or the
SimTimeLimitError every run past its limit gets) with the rank, core and step, the
program's file and line, and the exception in one line. The exception it came from is
kept as the error's cause (npusim --debug prints it).
"""

from __future__ import annotations

import signal
import sys
import sysconfig
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npusim.errors import KernelError, NpusimError

if TYPE_CHECKING:
    from npusim.runtime.context import KernelContext

_PKG = Path(__file__).resolve().parents[1]  # npusim/
_KERNELS = _PKG / "kernels"
_LIBS = tuple(str(Path(p).resolve()) for p in {
    sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _own(filename: str) -> bool:
    """A frame of kernel code: a kernel family's (npusim/kernels or a user's file), not
    npusim's runtime or a library's."""
    p = Path(filename).resolve()
    if p.is_relative_to(_PKG):
        return p.is_relative_to(_KERNELS)
    return not str(p).startswith(_LIBS) and not filename.startswith("<")


def _where(frames: list[tuple[str, int]]) -> str:
    """' (file, line N)' of the innermost kernel-code frame (else the innermost)."""
    own = [f for f in frames if _own(f[0])]
    pick = own[-1] if own else (frames[-1] if frames else None)
    return f" ({pick[0]}, line {pick[1]})" if pick else ""


def _raised_at(exc: BaseException) -> list[tuple[str, int]]:
    return [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]


def _suspended_at(gen: Any) -> list[tuple[str, int]]:
    """Where a generator (and the ones it delegates to) stands."""
    frames = []
    while gen is not None and getattr(gen, "gi_frame", None) is not None:
        frames.append((gen.gi_frame.f_code.co_filename, gen.gi_frame.f_lineno))
        gen = gen.gi_yieldfrom
    return frames


def _text(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def raised(ctx: KernelContext, exc: BaseException) -> KernelError:
    """The error for an exception raised inside ctx's program."""
    ending = "; a kernel cannot end the simulator" if isinstance(exc, SystemExit) else ""
    return ctx.error(f"the kernel program raised {_text(exc)}{_where(_raised_at(exc))}"
                     f"{ending}")


def bad_yield(ctx: KernelContext, gen: Any, value: str) -> KernelError:
    """The error for a program that yielded something that is not a simpy event."""
    where = _where(_suspended_at(gen))
    return ctx.error(f"the kernel program yielded {value}, not an event (yield from "
                     f"ctx.wait(...), ctx.sync() or another of the runtime's waits){where}")


class PastTimeLimit(NpusimError):
    """A core's own clock passed the simulated-time limit (ctx.t_limit) in a charge,
    without yielding; the launch turns it into the run's SimTimeLimitError, the limit
    holding for local clocks as for the event queue."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.where = where


def past_time_limit(ctx: KernelContext) -> PastTimeLimit:
    return PastTimeLimit(f"rank {ctx.rank_id} core {ctx.core_label} ran its own clock to "
                         f"{ctx.t / 1000:.3f} us without yielding", calling_line())


def calling_line() -> str:
    """' (file, line N)' of the kernel code that called into the runtime from here."""
    return _where([(f.f_code.co_filename, f.f_lineno) for f in _stack()])


def _stack() -> list[Any]:
    frames = []
    f = sys._getframe(2)
    while f is not None:
        frames.append(f)
        f = f.f_back
    return frames[::-1]


class WallClockLimit(BaseException):
    """Raised by the wall-clock guard into whatever Python code runs (a BaseException, so a
    program's `except Exception` does not swallow it)."""


class WallClock:
    """run.wall_time_limit_s: SIGALRM after that many seconds of wall time raises
    WallClockLimit in the running code, noting which simpy process (core) was running.
    Only in the main thread (where Python runs signal handlers), where setitimer exists."""

    def __init__(self, env: Any, limit_s: float | None) -> None:
        self.env, self.limit_s = env, limit_s
        self.process: Any = None
        self._armed = False

    def _fire(self, signum: int, frame: Any) -> None:
        if self._armed:
            self._armed = False
            self.process = self.env.active_process
            raise WallClockLimit(self.limit_s)

    @contextmanager
    def armed(self) -> Iterator[WallClock]:
        usable = (self.limit_s is not None and hasattr(signal, "setitimer")
                  and threading.current_thread() is threading.main_thread())
        if not usable:
            yield self
            return
        old = signal.signal(signal.SIGALRM, self._fire)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.limit_s)
        try:
            yield self
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)

    def error(self, ctx: KernelContext | None, exc: BaseException) -> KernelError:
        """The error for the limit: the core that was running and where its program was."""
        head = (f"wall-clock limit of {self.limit_s:g} s (run.wall_time_limit_s) reached "
                f"at simulated time {self.env.now / 1000:.3f} us")
        if ctx is None:
            return KernelError(f"{head}, no core running")
        cause = exc.__cause__ or exc
        return ctx.error(f"{head} while the core ran without yielding (a loop that never "
                         f"waits?){_where(_raised_at(cause))}")
