"""The one guard around every call into user code: a kernel file's import, a family's
declarations, constructor and hooks, and the programs its cores run.

User code may raise anything (a BaseException, KeyboardInterrupt, SystemExit, an
exception whose __str__ raises), return the wrong thing, or loop forever. None of it may
end npusim with a traceback, a hang or a silent exit. A `session` arms the wall-clock limit
(run.wall_time_limit_s) and a Ctrl-C handler: the first alarm raises WallClockLimit
wherever Python runs, and then again every REPEAT_S while user code runs (a loop that
swallows BaseException is stopped too); Ctrl-C raises UserInterrupt, a KeyboardInterrupt
npusim tells from one the kernel raises. Either also calls the stoppers a launch
registers, so the whole event loop stops, not one core. `call` runs one hook: its faults
become a KernelError naming the file, the hook and the line; a wrong return value one
naming what is allowed.
"""

from __future__ import annotations

import numbers
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npusim.errors import KernelError, NpusimError
from npusim.runtime.fault import ending, exc_text, raised_at, where_in
from npusim.values import is_finite, is_integer

DEFAULT_LIMIT_S = 3600.0  # run.wall_time_limit_s when a scenario gives none
REPEAT_S = 0.2  # how often the alarm repeats once the limit is reached
INT_BITS = 4000  # the largest integer a report field holds (JSON prints 4300 digits)


class WallClockLimit(BaseException):
    """Raised by the alarm into whatever Python code runs (a BaseException, so a program's
    `except Exception` does not swallow it)."""


class UserInterrupt(KeyboardInterrupt):
    """The user's Ctrl-C, raised by the session's SIGINT handler: a KeyboardInterrupt
    that user code raised itself is the kernel's fault, this one is not."""


@dataclass
class _Session:
    limit_s: float | None
    tripped: BaseException | None = None  # the first stop: WallClockLimit or UserInterrupt
    inside: int = 0  # depth of user code running now
    stoppers: list[Callable[[BaseException], None]] = field(default_factory=list)


_now: list[_Session | None] = [None]


def _usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _trip(s: _Session, exc: BaseException) -> None:
    """Note the stop and tell the running launch (its event loop ends at the next event)."""
    if s.tripped is None or isinstance(exc, UserInterrupt):
        s.tripped = exc
    for stop in list(s.stoppers):
        stop(exc)


def _on_alarm(signum: int, frame: Any) -> None:
    """The limit: raised wherever Python runs the first time, then again in user code
    only (a loop that swallowed it), as the stop that came first (the limit or Ctrl-C)."""
    s = _now[0]
    if s is None:
        return
    if s.tripped is None:
        exc = WallClockLimit(s.limit_s)
        _trip(s, exc)
        raise exc
    if s.inside:
        raise type(s.tripped)(*s.tripped.args)


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C: raised at once, and repeated by the alarm while user code runs."""
    exc = UserInterrupt()
    s = _now[0]
    if s is not None:
        _trip(s, exc)
        signal.setitimer(signal.ITIMER_REAL, REPEAT_S, REPEAT_S)
    raise exc


@contextmanager
def session(limit_s: float | None = DEFAULT_LIMIT_S) -> Iterator[None]:
    """Arm the wall-clock limit and the Ctrl-C handler (main thread only; a session inside
    another keeps the outer one's). The limit reached outside a hook or a launch comes out
    as a KernelError here."""
    if _now[0] is not None or not _usable():
        yield
        return
    s = _Session(limit_s)
    old_alarm = signal.signal(signal.SIGALRM, _on_alarm)
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:  # not where Ctrl-C is ignored or handled
        signal.signal(signal.SIGINT, _on_sigint)
    _now[0] = s
    if limit_s is not None:
        signal.setitimer(signal.ITIMER_REAL, limit_s, REPEAT_S)
    try:
        yield
    except WallClockLimit as exc:
        raise limit_error(s.limit_s, exc) from exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _now[0] = None
        signal.signal(signal.SIGALRM, old_alarm)
        if old_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, old_int)


@contextmanager
def span(stop: Callable[[BaseException], None] | None = None) -> Iterator[None]:
    """User code runs inside: the alarm repeats here, and a stop that came before it
    starts is raised at once. `stop(exc)` is called when the limit or Ctrl-C comes."""
    s = _now[0]
    if s is None:
        yield
        return
    if s.tripped is not None:
        raise s.tripped
    s.inside += 1
    if stop is not None:
        s.stoppers.append(stop)
    try:
        yield
    finally:
        s.inside -= 1
        if stop is not None:
            s.stoppers.remove(stop)


def stopping(exc: BaseException) -> BaseException | None:
    """The guard's own stop that exc stands for (the limit or the user's Ctrl-C, also when
    user code swallowed it and raised something else), or None: exc is the code's fault."""
    s = _now[0]
    if isinstance(exc, (WallClockLimit, UserInterrupt)):
        return exc
    return s.tripped if s is not None else None


def limit_error(limit_s: float | None, exc: BaseException, running: str = "") -> KernelError:
    """The error for the wall-clock limit: what ran and where its code was."""
    shown = "" if limit_s is None else f" of {limit_s:g} s"
    cause = exc.__cause__ or exc
    return KernelError(f"wall-clock limit{shown} (run.wall_time_limit_s) reached{running}"
                       f"{where_in(raised_at(cause))}")


def source_of(obj: Any) -> str:
    """The file a family or kernel object is defined in (its class's module)."""
    module = sys.modules.get(type(obj).__module__)
    return str(getattr(module, "__file__", None) or type(obj).__module__)


def fault(what: str, exc: BaseException) -> BaseException:
    """What to raise for exc coming out of user code `what` ("/f.py: tiling"): the guard's
    stop, npusim's own error or MemoryError as they are, else a KernelError in one line."""
    stop = stopping(exc)
    if isinstance(stop, UserInterrupt):
        return stop
    if stop is not None:
        return limit_error(_now[0].limit_s if _now[0] else None, exc, f" in {what}")
    if isinstance(exc, (NpusimError, MemoryError)):
        return exc
    where = where_in(raised_at(exc), own_only=True)
    return KernelError(f"{what} raised {exc_text(exc)}{where}{ending(exc)}")


Check = Callable[[Any], str | None]  # a return value -> what is allowed, or None: fine


def guarded(what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """fn(*args, **kw), user code, under the guard: its faults as `fault` tells them."""
    with session():
        try:
            with span():
                return fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - user code: every kind is told apart
            raise fault(what, exc) from exc


def call(owner: Any, hook: str, *args: Any, check: Check | None = None, **kw: Any) -> Any:
    """owner.hook(*args, **kw) under the guard: its faults and a return value `check`
    refuses become one-line KernelErrors naming the file and the hook."""
    what = f"{source_of(owner)}: {type(owner).__name__}.{hook}"
    value = guarded(what, lambda: getattr(owner, hook)(*args, **kw))
    allowed = check(value) if check is not None else None
    if allowed:
        raise KernelError(f"{what} returned {_kind(value)}; allowed: {allowed}")
    return value


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


# ---- the checks of the hooks' return values


def tiling(value: Any) -> str | None:
    """A tiling: the run reads its `world` (the ranks)."""
    world = getattr(value, "world", None)
    ok = is_integer(world) and world >= 1
    return None if ok else "the call's tiling, an object whose `world` is its ranks (an int)"


def optional_of(kind: type, words: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value is None or isinstance(value, kind) else f"{words} or None"
    return check


def field_dict(value: Any) -> str | None:
    ok = isinstance(value, dict) and all(isinstance(k, str) for k in value) and _plain(
        value, DEPTH, [ITEMS])
    return None if ok else "a dict of {name: JSON-able value}"


def field_dicts(n: int) -> Check:
    """One field dict per call of the run (Family.run_fields)."""
    def check(value: Any) -> str | None:
        ok = (isinstance(value, (list, tuple)) and len(value) == n
              and all(field_dict(v) is None for v in value))
        return None if ok else f"a list of {n} dicts of {{name: JSON-able value}}"
    return check


DEPTH, ITEMS = 32, 10**6  # how deep, and how many values, the report takes of a field
_LEAVES = (str, bytes, bool, type(None), numbers.Number, np.generic, os.PathLike)
_KEYS = (str, bool, type(None), numbers.Number)


def _plain(value: Any, depth: int, budget: list[int]) -> bool:
    """Whether the report can write value (npusim.report.build.jsonable, then JSON):
    plain data within DEPTH levels and ITEMS values, no integer JSON cannot print."""
    budget[0] -= 1
    if budget[0] < 0 or depth < 0:
        return False
    if isinstance(value, numbers.Integral) and not isinstance(value, np.generic):
        return abs(int(value)).bit_length() <= INT_BITS
    if isinstance(value, _LEAVES):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufcV" and value.size <= budget[0]
    if isinstance(value, Mapping):
        return all(isinstance(k, _KEYS) and _plain(v, depth - 1, budget)
                   for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v, depth - 1, budget) for v in value)
    return False


def arrays(none_ok: bool = False) -> Check:
    """A list of mappings of arrays (a family's data: its own ranks, which op_inputs turns
    into the machine's, checked there)."""
    def check(value: Any) -> str | None:
        if none_ok and value is None:
            return None
        ok = isinstance(value, (list, tuple)) and all(isinstance(a, Mapping) for a in value)
        return None if ok else "a list of dicts of arrays" + (" or None" if none_ok else "")
    return check


def whole(lo: int, none_ok: bool = False) -> Check:
    """An int >= lo (not a bool)."""
    def check(value: Any) -> str | None:
        if none_ok and value is None:
            return None
        ok = is_integer(value) and value >= lo
        return None if ok else f"an integer >= {lo}" + (" or None" if none_ok else "")
    return check


def number_or_none(value: Any) -> str | None:
    ok = value is None or (is_finite(value) and value >= 0)
    return None if ok else "a finite number of ns >= 0 or None"


def callable_value(value: Any) -> str | None:
    return None if callable(value) else "a generator function program(ctx)"


def window(value: Any) -> str | None:
    ok = callable(getattr(value, "regions", None))
    return None if ok else "the window layout, an object with regions()"


def regions(value: Any) -> str | None:
    ok = isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, (tuple, list)) and len(v) == 2
        and all(is_integer(x) for x in v)
        and 0 <= v[0] <= v[1] for k, v in value.items())
    return None if ok else "a dict {zone name: (start, end)}, whole bytes 0 <= start <= end"


def digest(value: Any) -> str | None:
    return None if isinstance(value, bytes) else "bytes"
