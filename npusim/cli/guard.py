"""npusim's own errors as one stderr line and an exit code (docs/report.md), never a
traceback unless --debug asks for it."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from npusim.cli.common import EXIT_FAIL, EXIT_INPUT, EXIT_KERNEL, err, one_line
from npusim.errors import BlockedError, InputError, KernelError, NpusimError
from npusim.outputs import Interrupted, forget_placed, placed_so_far


def guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Turn npusim's own errors into one stderr message and an exit code; with --debug,
    the traceback (and the exception a kernel error came from) first."""
    forget_placed()
    try:
        return func(args)
    except BrokenPipeError:
        raise  # a closed stdout (`| head`): main ends quietly
    except (Exception, KeyboardInterrupt) as exc:
        line, code = one_line_of(exc)
        if code is None:
            raise
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exception(exc)
        err(line)
        return code


def one_line_of(exc: BaseException) -> tuple[str, int | None]:
    """The message and exit code for an exception npusim reports; code None: not one."""
    if isinstance(exc, InputError):
        return f"npusim: error: {one_line(str(exc))}", EXIT_INPUT
    if isinstance(exc, BlockedError):  # a deadlock or a limit, and where its list went
        return f"npusim: {one_line(str(exc))}", EXIT_KERNEL
    if isinstance(exc, KernelError):
        return f"npusim: kernel error: {one_line(str(exc))}", EXIT_KERNEL
    if isinstance(exc, NpusimError):
        return f"npusim: error: {one_line(str(exc))}", EXIT_KERNEL
    if isinstance(exc, MemoryError):
        why = one_line(str(exc)) or "the run needs more memory"
        return (
            f"npusim: error: out of memory: {why}; allowed: a smaller workload (BS, W, H) "
            "on this machine",
            EXIT_FAIL,
        )
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return f"npusim: error: cannot write or read{where}: {exc.strerror or exc}", EXIT_FAIL
    if isinstance(exc, KeyboardInterrupt):  # what the command left, in every case
        left = str(exc) if isinstance(exc, Interrupted) and str(exc) else placed_so_far()
        return f"npusim: interrupted; {left}", 130
    return "", None
