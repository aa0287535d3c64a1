"""Python's small objects in transparent huge pages, where the compiled core is built.

CPython keeps every object of up to 512 B in 1 MiB arenas that the OS backs in 4 KiB
pages. A large-EP run keeps hundreds of MiB of them live (flow groups, ops, spans, the
kernel API's objects) and each event touches objects all over them, so the cost per event
grows with W partly from address translation, which on a virtual machine walks two page
tables per miss. With the arenas in 2 MiB pages the cost per event falls by about a
tenth at W 64 and EP 128 and not at all for small runs (docs/performance.md, "Huge pages
for Python's objects"). The compiled build `_arenas` serves the arenas from maps advised
MADV_HUGEPAGE; without it (pure Python, NPUSIM_PURE_PYTHON=1, no Linux, transparent huge
pages set to "never") nothing changes. Where objects live changes no result: the outputs
and reports are the same to the byte either way.

NPUSIM_HUGE_ARENAS=0 in the environment leaves CPython's own arena allocator in place;
NPUSIM_HUGE_ARENAS=1 uses the maps whatever the kernel's setting (whether the pages are
then huge is the kernel's choice).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MAP_BYTES = 256 << 20  # each reserved map (address space; memory only where arenas are)
_state: str | None = None


def _pure() -> bool:
    """NPUSIM_PURE_PYTHON set: the process runs no compiled build, this one included (read
    here, as compiled.py does, since compiled.describe reports this module's state)."""
    return os.environ.get("NPUSIM_PURE_PYTHON", "") not in ("", "0")


def arena_bytes() -> int:
    """pymalloc's arena size: 1 MiB from CPython 3.10 on."""
    return 1 << 20 if sys.version_info >= (3, 10) else 256 << 10


def _thp() -> str:
    """The kernel's transparent huge page mode (always, madvise or never; "" if unknown)."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""


def use_huge_arenas() -> str:
    """Serve pymalloc's arenas from huge-page maps from now on (once per process: a forked
    process keeps them); returns the state `describe` reports."""
    global _state
    if _state is not None:
        return _state
    asked = os.environ.get("NPUSIM_HUGE_ARENAS", "")
    if asked == "0":
        _state = "off (NPUSIM_HUGE_ARENAS=0)"
    elif _pure() or not sys.platform.startswith("linux"):
        _state = "off (pure Python)" if _pure() else f"off (not on {sys.platform})"
    elif asked != "1" and _thp() not in ("always", "madvise"):
        _state = f"off (transparent huge pages: {_thp() or 'not available'})"
    else:
        try:
            from npusim.engine import _arenas  # type: ignore[attr-defined]
        except ImportError:
            _state = "off (not built)"
        else:
            ok = _arenas.install(arena_bytes(), MAP_BYTES)
            _state = "on" if ok else "off (no address space for the maps)"
    return _state
