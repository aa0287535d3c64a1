"""A function run in a forked child process while the parent goes on.

Fork, not spawn: the child starts from the parent's memory (inputs, configuration) at
no cost, where a spawned one would import everything and rebuild the inputs first. The
child never raises into the parent: whatever goes wrong there (a kernel error, no memory,
an interrupt) makes `result()` return None, and the parent does the work itself, where
the same error then surfaces with its usual message.
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from collections.abc import Callable
from typing import Any


class Forked:
    """`work()` running in a child process; `result()` collects its (pickled) value."""

    @staticmethod
    def available() -> bool:
        return hasattr(os, "fork")

    def __init__(self, work: Callable[[], Any]) -> None:
        """OSError if no child can be started (no memory or processes left)."""
        read_fd, write_fd = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns on fork in a process with threads (numpy's BLAS pool);
                # the child runs no BLAS and takes no lock another thread might hold.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # the child: compute, send, leave without running the parent's exit code
            os.close(read_fd)
            status = 0
            try:
                payload = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write_fd, "wb") as out:
                    out.write(payload)
            except BaseException:  # noqa: BLE001 - the parent redoes the work and reports
                status = 1
            finally:
                os._exit(status)
        os.close(write_fd)
        self._pid: int | None = pid
        self._fd = read_fd

    def result(self) -> Any | None:
        """Wait for the child; its value, or None if it failed."""
        with os.fdopen(self._fd, "rb") as src:
            data = src.read()
        status = self._reap()
        if status != 0 or not data:
            return None
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 - a truncated payload counts as a failure
            return None

    def cancel(self) -> None:
        """Stop the child (the parent failed or no longer needs it)."""
        if self._pid is None:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap()
        os.close(self._fd)

    def _reap(self) -> int:
        pid, self._pid = self._pid, None
        if pid is None:
            return 1
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
