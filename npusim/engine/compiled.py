"""The optional compiled core: Cython builds of a few pure-Python modules (same source,
C types from a `.pxd` beside it), made at `pip install` when a C compiler is there.

A pure module ends by taking its classes from its compiled build when one imports; the
pure module stays the reference and the fallback, and both give the same bytes and
times. NPUSIM_PURE_PYTHON=1 in the environment forces the pure path (CI runs the tests
both ways)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any

PURE = os.environ.get("NPUSIM_PURE_PYTHON", "") not in ("", "0")


# how much newer than its build a pure source must be to count as edited since (an install
# writes both within moments, in either order)
STALE_AFTER_S = 60.0

# the compiled builds, in the order they are adopted (setup.py builds the same list)
BUILDS = ("npusim.engine._env", "npusim.engine._flow", "npusim.hw._pipe", "npusim.hw._ub",
          "npusim.hw._memory", "npusim.runtime._transfer")

# a build whose fields are C types of other builds (a cimport): used only with them, as
# the objects it holds are theirs
REQUIRES = {"npusim.runtime._transfer": ("npusim.hw._pipe", "npusim.hw._ub", "npusim.hw._memory")}


def in_use() -> list[str]:
    """The compiled builds this process runs (empty on the pure path)."""
    return [name for name in BUILDS if compiled(name) is not None]


def stale() -> list[str]:
    """The compiled builds present here but older than their pure source, so not used."""
    if PURE:
        return []
    found = []
    for name in BUILDS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if _stale(module, name):
            found.append(name)
    return found


def describe() -> str:
    """One line on which path this process runs: what a benchmark figure depends on."""
    used = in_use()
    line = "compiled core: " + (", ".join(used) if used else "none (pure Python)")
    if PURE:
        return line + " (NPUSIM_PURE_PYTHON is set)"
    old = stale()
    if old:
        line += (f"; not used, older than their edited source: {', '.join(old)} "
                 "(rebuild: pip install -e .)")
    from npusim.engine.arenas import use_huge_arenas

    return f"{line}; Python's objects in huge pages: {use_huge_arenas()}"


def compiled(name: str) -> ModuleType | None:
    """The compiled build `name`, or None (forced pure, not built here, or older than its
    pure source: an edited module in an editable install runs as edited until rebuilt)."""
    if PURE or any(compiled(dep) is None for dep in REQUIRES.get(name, ())):
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    return None if _stale(module, name) else module


def _stale(module: ModuleType, name: str) -> bool:
    """Whether the pure source the build was made from changed after the build."""
    package, _, base = name.rpartition(".")
    pure = importlib.util.find_spec(f"{package}.{base.lstrip('_')}")
    built = getattr(module, "__file__", None)
    if pure is None or not pure.origin or not built:
        return False
    try:
        return os.path.getmtime(pure.origin) > os.path.getmtime(built) + STALE_AFTER_S
    except OSError:
        return False


def adopt(namespace: dict[str, Any], name: str, names: tuple[str, ...]) -> None:
    """Replace `names` in a pure module's namespace by those of its compiled build `name`,
    when there is one."""
    built = compiled(name)
    if built is not None:
        for n in names:
            namespace[n] = getattr(built, n)
