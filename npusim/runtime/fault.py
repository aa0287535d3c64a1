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

import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Protocol

from npusim.errors import KernelError, NpusimError

_PKG = Path(__file__).resolve().parents[1]  # npusim/
_KERNELS = _PKG / "kernels"
_LIBS = tuple(str(Path(p).resolve()) for p in {
    sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


class Located(Protocol):
    """What a fault names of the core it happened on: a KernelContext, which calls these
    helpers from its charges (so they sit below it and know it by this much alone)."""

    rank_id: int
    core_label: int | str
    t: float

    def error(self, message: str, address: int | None = None, size: int | None = None
              ) -> KernelError: ...


def _own(filename: str) -> bool:
    """A frame of kernel code: a kernel family's (npusim/kernels or a user's file), not
    npusim's runtime or a library's."""
    p = Path(filename).resolve()
    if p.is_relative_to(_PKG):
        return p.is_relative_to(_KERNELS)
    return not str(p).startswith(_LIBS) and not filename.startswith("<")


def where_in(frames: list[tuple[str, int]], own_only: bool = False) -> str:
    """' (file, line N)' of the innermost kernel-code frame (else the innermost, or with
    own_only nothing: a hook that failed as it was called)."""
    own = [f for f in frames if _own(f[0])]
    pick = own[-1] if own else (frames[-1] if frames and not own_only else None)
    return f" ({pick[0]}, line {pick[1]})" if pick else ""


def raised_at(exc: BaseException) -> list[tuple[str, int]]:
    return [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]


def _suspended_at(gen: Any) -> list[tuple[str, int]]:
    """Where a generator (and the ones it delegates to) stands."""
    frames = []
    while gen is not None and getattr(gen, "gi_frame", None) is not None:
        frames.append((gen.gi_frame.f_code.co_filename, gen.gi_frame.f_lineno))
        gen = gen.gi_yieldfrom
    return frames


def exc_text(exc: BaseException) -> str:
    """The exception in one line: its type and (at most 200 characters of) its text, or
    its type alone when its __str__ itself fails."""
    try:
        text = " ".join(str(exc).split())
    except BaseException:  # noqa: BLE001 - a user's __str__ may raise anything
        text = "(its message cannot be shown: str() raised)"
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def raised(ctx: Located, exc: BaseException) -> KernelError:
    """The error for an exception raised inside ctx's program."""
    return ctx.error(f"the kernel program raised {exc_text(exc)}{where_in(raised_at(exc))}"
                     f"{ending(exc)}")


def ending(exc: BaseException) -> str:
    """What a message adds for SystemExit: it ends nothing but the kernel."""
    return "; a kernel cannot end the simulator" if isinstance(exc, SystemExit) else ""


def bad_yield(ctx: Located, gen: Any, value: str) -> KernelError:
    """The error for a program that yielded something that is not a simpy event."""
    where = where_in(_suspended_at(gen))
    return ctx.error(f"the kernel program yielded {value}, not an event (yield from "
                     f"ctx.wait(...), ctx.sync() or another of the runtime's waits){where}")


class PastTimeLimit(NpusimError):
    """A core's own clock passed the simulated-time limit (ctx.t_limit) in a charge,
    without yielding; the launch turns it into the run's SimTimeLimitError, the limit
    holding for local clocks as for the event queue."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.where = where


def past_time_limit(ctx: Located) -> PastTimeLimit:
    return PastTimeLimit(f"rank {ctx.rank_id} core {ctx.core_label} ran its own clock to "
                         f"{ctx.t / 1000:.3f} us without yielding", calling_line())


def calling_line() -> str:
    """' (file, line N)' of the kernel code that called into the runtime from here."""
    return where_in([(f.f_code.co_filename, f.f_lineno) for f in _stack()])


def _stack() -> list[Any]:
    frames = []
    f = sys._getframe(2)
    while f is not None:
        frames.append(f)
        f = f.f_back
    return frames[::-1]
