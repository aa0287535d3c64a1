"""Where a large-EP run's memory is, by owner: the resident pages of the windows, the cores'
local buffers (UB) and their write marks, and the GM tensors, read from /proc/self/pagemap
at the end of one op (Linux only; pages mapped to the kernel's zero page, which reads of
never-written memory map and RSS does not count, left out).

    python benchmarks/memory.py --ep 256              # the A3 case of benchmarks/run.py, BS 128
    python benchmarks/memory.py --ep 768 --bs 80 --op dispatch
    python benchmarks/memory.py --ep 256 --bs 26 --objects   # and the live Python objects
    python benchmarks/memory.py --ep 64 --bs 80 --keep-local # the local buffers kept

With --objects it also counts the live Python objects by type (their own sizes, from the
collector's list, which holds every container while the run keeps the collector paused)
and the bytes the small-object allocator has handed out; that list costs memory of its
own, so the census is taken after the breakdown and VmRSS.

The op runs in this process (one worker); the breakdown is taken when its launch returns,
before the machine is freed: every record is then resident in the receivers' windows, but
each core's local buffers went back to the OS as its program ended, as in any run, so the
peak RSS (printed first) came earlier, while cores still ran. --keep-local keeps them
(`launch(..., free_local=False)`) to see what they held.
"""

from __future__ import annotations

import argparse
import mmap
import re
import resource
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PAGE = mmap.PAGESIZE


def _zero_pfn() -> int:
    """The page frame a read of never-written anonymous memory maps (the zero page)."""
    probe = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    probe.read(1)
    buf = np.frombuffer(probe, np.uint8)
    pfn = _pfns(buf.ctypes.data, PAGE)[0]
    del buf
    probe.close()
    return pfn


def _pfns(addr: int, nbytes: int) -> list[int]:
    """The page frame numbers of the pages of [addr, addr + nbytes); -1 where not present."""
    first, last = addr // PAGE, (addr + max(nbytes, 1) - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    out = []
    for (entry,) in struct.iter_unpack("<Q", raw):
        out.append(entry & ((1 << 55) - 1) if entry >> 63 & 1 else -1)
    return out


def resident(arr: np.ndarray, zero: int) -> int:
    """Bytes of `arr`'s pages that are backed by memory of their own."""
    if arr.size == 0:
        return 0
    pfns = _pfns(arr.ctypes.data, arr.nbytes)
    return sum(PAGE for p in pfns if p not in (-1, zero))


def breakdown(machine: Any, zero: int) -> dict[str, float]:
    """MiB per owner over every rank of `machine`."""
    out = {"windows": 0, "local buffers (UB, L1, ...)": 0, "their write marks": 0,
           "window page marks": 0, "GM tensors": 0}
    for rank in machine.ranks:
        out["windows"] += resident(rank.window.buf, zero)
        out["window page marks"] += resident(rank.window._written.view(np.uint8), zero)
        maps: dict[int, np.ndarray] = {}
        marks: dict[int, np.ndarray] = {}
        for cores in rank.cores_of.values():
            for core in cores:
                for ub in core.buffers.values():
                    for arr, into in ((ub.data, maps), (ub.written, marks)):
                        base = arr.base if isinstance(arr.base, np.ndarray) else arr
                        into[id(base)] = base
        out["local buffers (UB, L1, ...)"] += sum(resident(a, zero) for a in maps.values())
        out["their write marks"] += sum(resident(a, zero) for a in marks.values())
        for t in rank.tensors.values():
            buf = getattr(t, "buf", None)
            if isinstance(buf, np.ndarray):
                out["GM tensors"] += resident(buf, zero)
    return {k: v / 2**20 for k, v in out.items()}


def _mallinfo_mib() -> tuple[float, float]:
    """glibc's heap: MiB allocated by malloc outside mmapped chunks, and in mmapped chunks
    (NaN where glibc's mallinfo2 is missing)."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                                                     "hblkhd", "usmblks", "fsmblks",
                                                     "uordblks", "fordblks", "keepcost")]
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return float("nan"), float("nan")
    fn.restype = Info
    info = fn()
    return info.uordblks / 2**20, info.hblkhd / 2**20


def census(top: int = 14) -> tuple[dict[str, float], list[tuple[str, int, float]]]:
    """The allocators' figures (MiB), and the `top` container types by their own size:
    (name, count, MiB)."""
    import gc
    import os
    import tempfile

    by: dict[str, list[int]] = {}
    for o in gc.get_objects():
        e = by.setdefault(type(o).__name__, [0, 0])
        e[0] += 1
        e[1] += sys.getsizeof(o)
    rows = sorted(((k, n, b / 2**20) for k, (n, b) in by.items()), key=lambda r: -r[2])
    with tempfile.TemporaryFile("w+") as f:  # _debugmallocstats writes to the C stderr
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read()
    def field(label: str) -> float:
        m = re.search(rf"^{re.escape(label)}\s*=\s*([\d,]+)", text, re.M)
        return float(m.group(1).replace(",", "")) if m else float("nan")

    heap, mapped = _mallinfo_mib()
    arena = field("Total") / max(field("# arenas allocated current"), 1.0)  # bytes each
    return {"pymalloc blocks in use": field("# bytes in allocated blocks") / 2**20,
            "pymalloc arenas": field("Total") / 2**20,
            "pymalloc arenas at most": field("# arenas highwater mark") * arena / 2**20,
            "malloc heap in use": heap, "malloc mmapped chunks": mapped}, rows[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ep", type=int, default=64, help="ranks (W)")
    ap.add_argument("--bs", type=int, default=128)
    ap.add_argument("--op", default="dispatch", choices=("dispatch", "combine"))
    ap.add_argument("--keep-local", action="store_true",
                    help="keep each core's local buffers to the end, to count them")
    ap.add_argument("--objects", action="store_true",
                    help="also count the live Python objects by type (slower, more memory)")
    args = ap.parse_args()
    if not Path("/proc/self/pagemap").exists():
        print("memory.py: needs Linux's /proc/self/pagemap", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    from run import _a3_ep

    import npusim.runtime.launch as launch_mod
    import npusim.sim as sim_mod
    from npusim.scenario import scenario_from_doc

    workload = _a3_ep(args.ep, args.bs)
    workload["op"] = args.op
    doc = {"name": f"a3_w{args.ep}_bs{args.bs}", "hardware": workload.pop("hardware"),
           "workload": workload}
    sc = scenario_from_doc(doc, "memory", ROOT)
    zero = _zero_pfn()
    inner = launch_mod.launch
    seen: list[dict[str, float]] = []
    cores: list[int] = []
    objects: list[tuple[dict[str, float], list[tuple[str, int, float]]]] = []

    def measured(machine: Any, *a: Any, **kw: Any) -> Any:
        if args.keep_local:
            kw["free_local"] = False
        res = inner(machine, *a, **kw)
        seen.append(breakdown(machine, zero))
        seen[-1]["VmRSS"] = _vmrss_mib()
        cores.append(sum(len(c) for r in machine.ranks for c in r.cores_of.values()))
        if args.objects:
            objects.append(census())
        return res

    sim_mod.launch = measured
    r = sim_mod.simulate(sc, workers=1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"W {args.ep} BS {args.bs} {args.op}: {r.events} events, peak RSS {peak:.0f} MiB")
    for k, v in seen[-1].items():
        print(f"  {k:28s} {v:9.1f} MiB")
    ub = seen[-1]["local buffers (UB, L1, ...)"]
    print(f"  local buffers per core     {ub * 1024 / cores[-1]:9.1f} KiB ({cores[-1]} cores)")
    if objects:
        alloc, rows = objects[-1]
        for k, v in alloc.items():
            print(f"  {k:28s} {v:9.1f} MiB")
        for name, n, mib in rows:
            print(f"    {name:24s} {n:11d} {mib:9.1f} MiB")
    return 0


def _vmrss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
