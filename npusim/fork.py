"""A function run in a forked child process while the parent goes on.

Fork, not spawn: the child starts from the parent's memory (inputs, configuration) at
no cost, where a spawned one would import everything and rebuild the inputs first. The
child never raises into the parent: whatever goes wrong there (a kernel error, no memory,
an interrupt) makes `result()` return None, and the parent does the work itself, where
the same error then surfaces with its usual message.

The value comes back pickled through a pipe, streamed, with each large array's 64 KiB
blocks of zeros left out and mapped back untouched: a timing-only run's outputs are
gigabytes of zeros (a combine's [BS, H] rows on every rank), which sent whole would
take their size in each process, twice over in the parent (the bytes read, then the
arrays made of them).
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.hw.memory import SMALL_PAGES_FROM, paged_zeros

ZERO_BLOCK = 1 << 16  # the granule of the zero blocks left out


def _sparse(dtype: np.dtype, shape: tuple[int, ...], nbytes: int, blocks: bytes,
            data: bytes, tail: bytes) -> np.ndarray:
    """An array rebuilt from its non-zero blocks (their indices, the blocks' bytes) and its
    last partial block, in memory the OS backs only where those land."""
    buf = paged_zeros(nbytes, "an array from the second process")
    whole = nbytes // ZERO_BLOCK * ZERO_BLOCK
    buf[:whole].reshape(-1, ZERO_BLOCK)[np.frombuffer(blocks, np.intp)] = \
        np.frombuffer(data, np.uint8).reshape(-1, ZERO_BLOCK)
    buf[whole:] = np.frombuffer(tail, np.uint8)
    return buf.view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    """Pickles a C-contiguous array of plain numbers from SMALL_PAGES_FROM bytes on as its
    non-zero 64 KiB blocks (`_sparse`); everything else as pickle does."""

    def reducer_override(self, obj: Any) -> Any:
        if (type(obj) is not np.ndarray or obj.nbytes < SMALL_PAGES_FROM
                or obj.dtype.hasobject or not obj.flags.c_contiguous):
            return NotImplemented
        raw = obj.reshape(-1).view(np.uint8)
        whole = raw.size // ZERO_BLOCK * ZERO_BLOCK
        grid = raw[:whole].reshape(-1, ZERO_BLOCK)
        # any() over 8-byte words: a reduction in place (count_nonzero along an axis
        # would make a bool copy of the whole array)
        blocks = np.flatnonzero(np.any(grid.view(np.uint64), axis=1))
        # the indices and blocks as plain buffers, which this override does not see again
        return _sparse, (obj.dtype, obj.shape, raw.size, pickle.PickleBuffer(blocks),
                         pickle.PickleBuffer(grid[blocks]), raw[whole:].tobytes())


PIPE_BYTES = 1 << 20  # Linux's largest pipe buffer for an unprivileged process


def _widen(fd: int) -> None:
    """A pipe buffer of PIPE_BYTES where the OS allows it (Linux): the result crosses in
    fewer, larger writes; 30 MB took 0.19 s through the default 64 KiB and 0.08 s
    through 1 MiB on the project's machine."""
    try:
        import fcntl  # (POSIX only, like the fork itself)

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


class Forked:
    """`work()` running in a child process; `result()` collects its (pickled) value."""

    @staticmethod
    def available() -> bool:
        return hasattr(os, "fork")

    def __init__(self, work: Callable[[], Any]) -> None:
        """OSError if no child can be started (no memory or processes left)."""
        read_fd, write_fd = os.pipe()
        _widen(write_fd)
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
                value = work()
                with os.fdopen(write_fd, "wb") as out:
                    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
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
