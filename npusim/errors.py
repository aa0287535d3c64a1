"""Errors npusim reports to users.

Two families: input errors (a scenario, preset or case file is wrong; the CLI prints one
line and exits 2) and kernel-program errors (the simulated program did something the
hardware would not allow or that can never finish; reported with rank, core, step and
address so the kernel author can find it).
"""

from __future__ import annotations


class NpusimError(Exception):
    """Base of every error npusim raises on purpose."""


class InputError(NpusimError):
    """Bad user input: names the file, the (dotted) key and what is allowed."""

    def __init__(self, source: str, key: str | None, message: str) -> None:
        self.source = source
        self.key = key
        self.message = message
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


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
    """The run stopped with cores unfinished (a deadlock or the simulated-time limit).

    The message is a summary that stays short at any scale (cores grouped by what they wait
    for, one example each); `blocked` holds one line per unfinished core, which the CLI
    writes to DIR/blocked.txt and names in the message (`written`)."""

    def __init__(self, summary: str, blocked: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(summary, tuple(blocked))  # both in args: the error pickles
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
