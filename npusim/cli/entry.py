"""main: the entry point of the console scripts and of `python -m npusim`."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from npusim.cli.common import EXIT_INPUT, EXIT_OK, err
from npusim.cli.guard import guarded
from npusim.cli.parser import build_parser
from npusim.numpy_pages import before_numpy


def _prog() -> str:
    """The name this was started as: npusim, or npusim-moe (the name CANN cannot shadow)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name in ("npusim", "npusim-moe") else "npusim"


BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _one_blas_thread() -> None:
    """One BLAS thread per process unless the user set one: the simulator is one thread,
    its parallelism is processes (--workers, sweeps), and numpy's idle BLAS threads only
    contend with them (a 256x128x256 matmul took 62 ms with two threads on a loaded
    2-core machine, 2.2 ms with one). Effective only before numpy is first imported."""
    if "numpy" in sys.modules:
        return
    for var in BLAS_THREAD_VARS:
        os.environ.setdefault(var, "1")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of the console scripts (npusim, npusim-moe) and of `python -m npusim`;
    returns the exit code."""
    from npusim.cann import SUBCOMMANDS, wrong_simulator

    _one_blas_thread()
    before_numpy()  # numpy's large arrays in 4 KiB pages, unless the user set it
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:  # meant for CANN's NPU Simulator, also `npusim`
        err(wrong_simulator(argv[0]))
        return EXIT_INPUT
    parser = build_parser(prog or _prog())
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2), --help / --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    try:
        return guarded(args.func, args)
    except BrokenPipeError:  # e.g. `npusim presets | head -1`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
