"""The memory a functional run will touch, estimated before anything is allocated.

A run maps far more than it touches (every rank's 1 GiB window, every core's UB, the
expand_x capacity of A rows), and the OS backs only the pages written. What a run
writes is set by the work: each token-expert pair writes one dispatch slot into a
window, one row (and its scales and assist info) into expand_x, one combine slot into a
window, and in a functional run the combine input row too; each core writes part of
its UB and its write marks; the interpreter, numpy and simpy cost a fixed base. The
estimate counts both ops' machines at once (what `--workers 2` holds: combine runs in
a forked process while dispatch runs); with `--workers 1` dispatch's machine is freed
before combine's is built and the peak is lower. A family whose kernels do not read the
MoE shape is estimated from its declared GM tensors instead: each family says what its
data touches (Family.touched). docs/memory.md has the measured points the two measured
constants come from and the check against the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from npusim.kernels.family import Touched
from npusim.runtime import userguard
from npusim.scenario import Scenario

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_LIMIT_GIB = 24.0
BASE_BYTES = 48 * MIB  # interpreter, numpy, simpy, npusim and the scenario (measured: 41-48 MiB)
CORE_BYTES = 88 << 10  # UB pages the kernels write, their write marks and the core's
#                        simulator objects (measured 86 KiB per core at H 7168, atlas_a3)


@dataclass(frozen=True)
class Footprint:
    """The estimate's terms in bytes; `total` is what is compared with the limit. `data`
    is what the family says its run's data touches (Family.touched)."""

    base: int
    cores: int
    data: Touched

    @property
    def total(self) -> int:
        return self.base + self.cores + self.data.total


def estimate(scenario: Scenario, workers: int = 2) -> Footprint:
    """Bytes the run will touch: the base, every core of every rank, and what the family
    says its data touches (Family.touched: a MoE family per token-expert pair and rank,
    with workers >= 2 both ops' machines of a dispatch_combine run at once; any other
    by its declared tensors)."""
    w = scenario.workload
    t = scenario.tiling
    data = userguard.call(w.family, "touched", t, w.shape, w.options, w.op, w.timing_only,
                          workers, check=_touched)
    return Footprint(base=BASE_BYTES, cores=t.world * scenario.hardware.chip.aiv_cores
                     * CORE_BYTES, data=data)


def _touched(value: object) -> str | None:
    """What Family.touched must return (a user family's override, or its pair_bytes, may
    not): a Touched of whole byte counts >= 0."""
    whole = userguard.whole(0)
    ok = isinstance(value, Touched) and not any(
        whole(getattr(value, term)) for term in ("pairs", "ranks", "tensors"))
    return None if ok else "a Touched of whole byte counts >= 0 (pair_bytes: an integer >= 0)"


def limit_bytes(spec: str | None) -> tuple[int, str]:
    """The memory a run may use: '24' (GiB, the default), or 'auto' (this machine's
    MemAvailable). Returns (bytes, how it was chosen)."""
    if spec in (None, ""):
        return int(DEFAULT_LIMIT_GIB * GIB), f"{DEFAULT_LIMIT_GIB:g} GiB (the default)"
    if spec == "auto":
        avail = _mem_available()
        if avail is None:
            return int(DEFAULT_LIMIT_GIB * GIB), (f"{DEFAULT_LIMIT_GIB:g} GiB (the default; "
                                                  "MemAvailable unknown here)")
        return avail, f"{avail / GIB:.1f} GiB (this machine's MemAvailable)"
    try:
        gib = float(spec)
    except ValueError:
        gib = -1.0
    if not gib > 0:
        from npusim.errors import InputError

        raise InputError("command line", "--memory", f"{spec!r}; allowed: a number of GiB "
                         "> 0, or auto (this machine's available memory)")
    return int(gib * GIB), f"{gib:g} GiB (--memory)"


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    if hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None


def _gib(n: int) -> str:
    """Bytes in GiB to three figures: a small run's need must not read as its limit."""
    return f"{n / GIB:.3g} GiB"


def too_big(scenario: Scenario, limit: int, how: str, workers: int = 2) -> str | None:
    """One line if the run's estimate binds and exceeds the limit, else None."""
    fp = estimate(scenario, workers)
    if not fp.data.binding or fp.total <= limit:
        return None
    w = scenario.workload
    s = w.shape
    if s is not None:
        what = (f"a functional run of W={s.W}, BS={s.BS}, H={s.H}, K={s.K} "
                f"needs about {_gib(fp.total)} ({_gib(fp.data.pairs)} windows and "
                f"tensors of {s.W * s.BS} tokens")
    else:
        run = "a timing-only" if w.timing_only else "a functional"
        what = (f"{run} run of {w.family.name} needs about {_gib(fp.total)} "
                f"({_gib(fp.data.tensors)} of its GM tensors")
    timing = "" if w.timing_only else "workload.timing_only: true, "
    return (f"{scenario.source}: {what}, {_gib(fp.cores)} cores) but the limit is "
            f"{how}; allowed: smaller {fp.data.sized_by}, {timing}or --memory GIB|auto on "
            "a larger machine")
