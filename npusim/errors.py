"""Errors npusim reports to users.

Two families: input errors (a scenario, preset or case file is wrong; the CLI prints one
line and exits 2) and kernel-program errors (the simulated program did something the
hardware would not allow or that can never finish; reported with rank, core, step and
address so the kernel author can find it).
"""

from __future__ import annotations

import math
from itertools import islice
from typing import Any

EXCERPT_CHARS = 80  # the most of a user's value an error message quotes
MESSAGE_CHARS = 4000  # a backstop: no input error is longer than this


class NpusimError(Exception):
    """Base of every error npusim raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by state, not by calling __init__ again with `args`: a subclass's
        __init__ takes other arguments than the message it passes on, and an error raised
        in a sweep's worker process must reach the parent whole (same line, same code)."""
        return _restored, (type(self), self.args, self.__dict__)


def _restored(cls: type[NpusimError], args: tuple[Any, ...], state: dict[str, Any]
              ) -> NpusimError:
    """An unpickled NpusimError: its args and attributes as they were, __init__ not run."""
    exc = cls.__new__(cls, *args)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


class InputError(NpusimError):
    """Bad user input: names the file, the (dotted) key and what is allowed."""

    def __init__(self, source: str, key: str | None, message: str) -> None:
        self.source = _cut(source, MESSAGE_CHARS // 4)
        self.key = None if key is None else _cut(key, MESSAGE_CHARS // 4)
        self.message = _cut(message, MESSAGE_CHARS)
        where = f"{self.source}: {self.key}" if self.key else self.source
        super().__init__(f"{where}: {self.message}")


class KernelError(NpusimError):
    """A kernel-program bug found by the sanitiser (UB overflow, bad address, race)."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        core: int | str | None = None,
        step: str | None = None,
        address: int | None = None,
        size: int | None = None,
    ) -> None:
        self.rank, self.core, self.step, self.address, self.size = rank, core, step, address, size
        parts = []
        if rank is not None:
            parts.append(f"rank {rank}")
        if core is not None:
            parts.append(f"core {core}")
        if step:
            parts.append(f"step {step!r}")
        if address is not None:
            parts.append(f"address 0x{address:x}")
        if size is not None:
            parts.append(f"size {size}")
        prefix = ", ".join(parts)
        self.message = message
        super().__init__(f"{prefix}: {message}" if prefix else message)

    def located(self, rank: int, core: int | str, step: str) -> KernelError:
        """The same error with the rank, core and step filled in where missing."""
        return KernelError(
            self.message,
            rank=self.rank if self.rank is not None else rank,
            core=self.core if self.core is not None else core,
            step=self.step or step,
            address=self.address,
            size=self.size,
        )


class BlockedError(NpusimError):
    """The run stopped with cores unfinished (a deadlock, the simulated-time or the
    wall-clock limit).

    The message is a summary that stays short at any scale (cores grouped by what they wait
    for, one example each); `blocked` holds one line per unfinished core, which the CLI
    writes to DIR/blocked.txt and names in the message (`written`)."""

    def __init__(self, summary: str, blocked: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(summary, tuple(blocked))
        self.summary = summary
        self.blocked = tuple(blocked)
        self.written: str | None = None

    def listing(self) -> str:
        """The text of blocked.txt."""
        return f"{self.summary}\n" + "".join(f"{line}\n" for line in self.blocked)

    def __str__(self) -> str:
        if self.written:
            return f"{self.summary}; every unfinished core: {self.written}"
        return self.summary


class DeadlockError(BlockedError):
    """No core can make progress but some still wait."""


class SimTimeLimitError(BlockedError):
    """The run passed its simulated-time limit."""


class WallClockLimitError(BlockedError):
    """The run passed its wall-clock limit (run.wall_time_limit_s)."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A user's value as YAML shows it (true, null, 'text', [1, 2], {a: 1}), at most
    `limit` characters. Error messages quote values, and a value can be huge: a 10 MB
    string, an integer of 10^5 digits (whose str() Python refuses), or nested YAML aliases
    that stand for a list of 2^40 items. The walk stops once `limit` characters are out,
    so quoting costs O(limit) whatever the value."""
    parts: list[str] = []
    _emit(value, parts, [limit + 1])
    return _cut("".join(parts), limit)


def key_text(key: Any, limit: int = EXCERPT_CHARS) -> str:
    """A mapping key as a dotted key shows it: a string bare, anything else excerpted."""
    return _cut(key, limit) if isinstance(key, str) else excerpt(key, limit)


def _emit(value: Any, parts: list[str], budget: list[int]) -> None:
    """Append value's text to parts until the budget (characters left) runs out."""
    if budget[0] <= 0:
        return
    if isinstance(value, dict):
        _emit_items(islice(value.items(), budget[0]), "{", "}", parts, budget)
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        _emit_items(islice(value, budget[0]), "[", "]", parts, budget)
        return
    text = _scalar(value, budget[0])
    parts.append(text)
    budget[0] -= len(text)


def _emit_items(items: Any, open_: str, close: str, parts: list[str], budget: list[int]
                ) -> None:
    parts.append(open_)
    budget[0] -= 1
    for i, item in enumerate(items):
        if budget[0] <= 0:
            return
        if i:
            parts.append(", ")
            budget[0] -= 2
        if open_ == "{":
            _emit(item[0], parts, budget)
            parts.append(": ")
            budget[0] -= 2
            _emit(item[1], parts, budget)
        else:
            _emit(item, parts, budget)
    parts.append(close)
    budget[0] -= 1


def _scalar(value: Any, room: int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        if value.bit_length() > 3 * EXCERPT_CHARS:  # str() of 4300+ digits raises
            digits = int(value.bit_length() * math.log10(2)) + 1
            return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
        return str(value)
    if isinstance(value, float):
        return ".nan" if math.isnan(value) else (
            (".inf" if value > 0 else "-.inf") if math.isinf(value) else repr(value))
    if isinstance(value, (str, bytes)):
        return repr(value[:room + 1])
    return _cut(str(value), room + 1)
