"""numpy's large arrays in 4 KiB pages while npusim runs.

numpy advises transparent huge pages for every array of 4 MiB or more. A run's large
numpy arrays are written once or sparsely (the inputs, the families' references and the
temporaries of their steps, the outputs) and most are fresh maps (glibc maps a large block
and unmaps it when freed), so each 2 MiB page they touch is zeroed whole on its first
fault. On a virtual machine whose host takes freed memory back (free page reporting hands
it free 2 MiB blocks, exactly what a huge page is made of), every 4 KiB of such a page must
be backed by the host again: the CANN sample's numpy dispatch reference at W 8 BS 256 took
1.9-3.6 s with numpy's huge pages and 0.5 s without (docs/performance.md, "numpy's large
arrays in 4 KiB pages"). On a bare machine the 4 KiB faults cost a fraction of a
microsecond each, so the setting costs little there either way. Where the bytes live
changes no result.

`NUMPY_MADVISE_HUGEPAGE` (numpy's own switch) set in the environment is the user's choice,
and is left as it is.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ENV = "NUMPY_MADVISE_HUGEPAGE"


def _switch() -> Callable[[bool], bool] | None:
    """numpy's `_set_madvise_hugepage` (it returns the previous setting), or None where
    this numpy has none."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2, numpy 1
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        switch = getattr(module, "_set_madvise_hugepage", None)
        if callable(switch):
            return switch
    return None


def before_numpy() -> None:
    """The CLI's default, set before numpy loads (numpy reads its switch once, at import):
    4 KiB pages for the whole process, unless the user set the switch."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(ENV, "0")


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's large arrays in 4 KiB pages inside the block (a run, and the process it
    forks), numpy's previous setting after it; nothing changes when the user set the
    switch or numpy has none."""
    switch = None if ENV in os.environ else _switch()
    if switch is None:
        yield
        return
    was = switch(False)
    try:
        yield
    finally:
        switch(was)
