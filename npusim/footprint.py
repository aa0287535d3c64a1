"""The memory a functional run will touch, estimated before anything is allocated.

A run maps far more than it touches (every rank's 1 GiB window, every core's UB, the
expand_x capacity of A rows), and the OS backs only the pages written. What a run
writes is set by the work: each token-expert pair writes one dispatch slot into a
window, one row (and its scales and assist info) into expand_x, one combine slot into a
window, and in a functional run the combine input row too; each core writes part of
its UB and its write marks; the interpreter, numpy and simpy cost a fixed base. The
estimate counts both ops' machines at once (what `--workers 2` holds: combine runs in
a forked process while dispatch runs); with `--workers 1` dispatch's machine is freed
before combine's is built and the peak is lower. docs/memory.md has the
measured points the two measured constants come from and the check against the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from npusim.runtime import userguard
from npusim.scenario import Scenario

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_LIMIT_GIB = 24.0
BASE_BYTES = 48 * MIB  # interpreter, numpy, simpy, npusim and the scenario (measured: 41-48 MiB)
CORE_BYTES = 88 << 10  # UB pages the kernels write, their write marks and the core's
#                        simulator objects (measured 86 KiB per core at H 7168, atlas_a3)
PAIR_OF_RANKS_BYTES = 512  # a route and a flow group per pair of ranks (cached paths)


@dataclass(frozen=True)
class Footprint:
    """The estimate's terms in bytes; `total` is what is compared with the limit."""

    base: int
    cores: int
    pairs: int
    ranks: int

    @property
    def total(self) -> int:
        return self.base + self.cores + self.pairs + self.ranks


def estimate(scenario: Scenario, workers: int = 2) -> Footprint:
    """Bytes the run will touch: base + cores + token-expert pairs + per rank. With
    workers >= 2 a dispatch_combine run holds both ops' machines at once (two processes,
    the child with the reference dispatch's rows); with 1, dispatch's outputs and
    combine's machine (or dispatch's machine, the larger)."""
    t = scenario.tiling
    w = scenario.workload
    shape, cores = w.shape, scenario.hardware.chip.aiv_cores
    world = shape.W
    sends = world * shape.BS * (shape.K + shape.S)  # token-expert pairs put by all ranks
    per_pair = userguard.call(w.family, "pair_bytes", t, w.op, w.timing_only, workers,
                              check=userguard.whole(0))
    row = shape.token_bytes
    per_rank = 0 if w.timing_only else 3 * shape.BS * row  # x in, combine's x out, the reference
    return Footprint(base=BASE_BYTES, cores=world * cores * CORE_BYTES,
                     pairs=sends * per_pair + world * world * PAIR_OF_RANKS_BYTES,
                     ranks=world * per_rank)


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


def too_big(scenario: Scenario, limit: int, how: str, workers: int = 2) -> str | None:
    """One line if a functional run's estimate exceeds the limit, else None. Timing-only
    runs are not gated: they write no payload and their memory is being reduced (docs)."""
    if scenario.workload.timing_only:
        return None
    fp = estimate(scenario, workers)
    if fp.total <= limit:
        return None
    w = scenario.workload
    return (f"{scenario.source}: a functional run of W={w.ep_world_size}, BS={w.bs}, "
            f"H={w.h}, K={w.k} needs about {fp.total / GIB:.1f} GiB "
            f"({fp.pairs / GIB:.1f} GiB windows and tensors of {w.ep_world_size * w.bs} tokens, "
            f"{fp.cores / GIB:.1f} GiB cores) but the limit is {how}; allowed: smaller W or BS, "
            "workload.timing_only: true, or --memory GIB|auto on a larger machine")
