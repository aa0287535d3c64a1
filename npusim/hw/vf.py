"""The Ascend 950's vector-function (VF) unit: what a VF executes and how many cycles it takes.

On the 950 vector code runs as Vector Functions (the RegBase model of hicann/cann-samples
`Samples/0_Introduction/vector_function_getting_started`): a VF loads 256 B registers from
UB, computes register to register and stores back. The guide gives the mechanism, and this
module times it from the instructions alone:

* Issue: each cycle the unit completes either two instructions of one kind that allows it
  (two Adds) or one instruction (a kind that does not pair, such as ReduceSum). In a
  hardware loop (VLOOP) it issues out of order across iterations, so a pairing kind costs
  half a cycle per instruction even when an iteration holds one of it; in straight-line
  code or a software loop only the instructions of one iteration can pair.
* Loads and stores go through their own ports (`vf_loads_per_cycle`, `vf_stores_per_cycle`).
* Dependencies: every instruction's result is ready `vf_latency_cycles` after it issues.
  A chain inside one iteration costs its latency once per loop (fill); a chain that runs
  from one iteration into the next (an accumulator) bounds every iteration.
* A VF call costs `vf_call_cycles` on top (issue from the scalar unit, start, drain).

MemBase (basic API) calls are VFs too on the 950: each call loads its sources, applies its
operation and stores its destination, one register at a time. Consecutive calls with the
same control flow (element count and register lanes) and no PipeBarrier<PIPE_V> between
them fuse into one VF, as the compiler does: a source already held in a register is not
loaded again, and a store that a later call of the same VF overwrites is dropped.

Instruction counts follow the counters of the sample's profiles: RVECEX (compute), RVECLD
(loads), RVECST (stores), each instruction of each executed iteration counted once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from npusim.units import ceil_div

# kind -> (unit, pairs): unit "ex" (compute), "ld" or "st"; pairs: two of this kind
# complete in one cycle. Sources: the RegBase guide names Add as pairing and ReduceSum as
# not pairing. Assumed (and checked against the GeLU and RmsNormQuant figures, see
# docs/model.md): simple arithmetic pairs; conversions, transcendental functions,
# divisions and reductions do not.
KINDS: dict[str, tuple[str, bool]] = {
    **{k: ("ex", True) for k in ("add", "sub", "mul", "muls", "adds", "mula", "max", "min",
                                 "abs", "dup", "maxs", "mins", "select", "cmps", "and", "or")},
    **{k: ("ex", False) for k in ("cast", "exp", "ln", "div", "sqrt", "rsqrt",
                                  "reduce_sum", "reduce_max")},
    **{k: ("ld", False) for k in ("load", "load_brc", "load_unpack")},
    **{k: ("st", False) for k in ("store", "store_pack", "store_first")},
}
REDUCTIONS = frozenset({"reduce_sum", "reduce_max"})
COUNTERS = ("RVECEX", "RVECLD", "RVECST")
_COUNTER = {"ex": "RVECEX", "ld": "RVECLD", "st": "RVECST"}


@dataclass(frozen=True)
class VInstr:
    """One register instruction: `kind`, the register it writes, the registers it reads."""

    kind: str
    dst: str | None = None
    srcs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown vector instruction kind {self.kind!r}; "
                             f"known: {', '.join(sorted(KINDS))}")

    @property
    def unit(self) -> str:
        return KINDS[self.kind][0]


def vi(kind: str, dst: str | None = None, *srcs: str) -> VInstr:
    """Shorthand: vi("add", "acc", "acc", "sq")."""
    return VInstr(kind, dst, tuple(srcs))


@dataclass(frozen=True)
class VLoop:
    """A loop of a VF: `body` run `iterations` times. A hardware loop (VLOOP) overlaps
    iterations; a software loop does not. Straight-line code is a loop of one iteration."""

    body: tuple[VInstr, ...]
    iterations: int = 1
    hardware: bool = True


@dataclass(frozen=True)
class VF:
    """A vector function: its loops (and straight-line parts) in program order."""

    name: str
    loops: tuple[VLoop, ...]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(COUNTERS, 0)
        for loop in self.loops:
            for ins in loop.body:
                out[_COUNTER[ins.unit]] += loop.iterations
        return out


@dataclass(frozen=True)
class VFTiming:
    """The VF unit's figures (preset keys vector.vf_*)."""

    call_cycles: float
    latency_cycles: float
    pair_issue: int
    loads_per_cycle: float
    stores_per_cycle: float

    @classmethod
    def from_config(cls, vcfg: Any) -> VFTiming:
        return cls(vcfg.vf_call_cycles, vcfg.vf_latency_cycles, vcfg.vf_pair_issue,
                   vcfg.vf_loads_per_cycle, vcfg.vf_stores_per_cycle)

    def issue_cycles(self, loop: VLoop) -> float:
        """Cycles per iteration that issue and the ports need, ignoring dependencies."""
        per_kind: dict[str, int] = {}
        ld = st = 0
        for ins in loop.body:
            if ins.unit == "ld":
                ld += 1
            elif ins.unit == "st":
                st += 1
            else:
                per_kind[ins.kind] = per_kind.get(ins.kind, 0) + 1
        overlap = loop.hardware and loop.iterations > 1
        ex = 0.0
        for kind, n in per_kind.items():
            if KINDS[kind][1]:
                ex += n / self.pair_issue if overlap else math.ceil(n / self.pair_issue)
            else:
                ex += n
        return max(ex, ld / self.loads_per_cycle, st / self.stores_per_cycle)

    def chains(self, loop: VLoop) -> tuple[float, float]:
        """(critical path of one iteration, longest chain carried into the next)."""
        lat = self.latency_cycles
        body = loop.body
        writer: dict[str, int] = {}
        preds: list[list[int]] = []
        carried: list[tuple[int, int]] = []  # (reader, writer later in the body)
        for i, ins in enumerate(body):
            preds.append([writer[r] for r in ins.srcs if r in writer])
            if ins.dst is not None:
                writer[ins.dst] = i
        for i, ins in enumerate(body):
            for r in ins.srcs:
                j = writer.get(r)
                if j is not None and j >= i and not any(
                        body[k].dst == r for k in range(i)):
                    carried.append((i, j))
        depth = [0.0] * len(body)
        for i in range(len(body)):
            depth[i] = lat + max((depth[p] for p in preds[i]), default=0.0)
        critical = max(depth, default=0.0)
        recurrence = 0.0
        for start, end in carried:
            dist = [-math.inf] * len(body)
            dist[start] = lat
            for i in range(start + 1, end + 1):
                best = max((dist[p] for p in preds[i]), default=-math.inf)
                if best > -math.inf:
                    dist[i] = lat + best
            recurrence = max(recurrence, dist[end])
        return critical, recurrence

    def loop_cycles(self, loop: VLoop) -> float:
        if loop.iterations <= 0 or not loop.body:
            return 0.0
        issue = self.issue_cycles(loop)
        critical, recurrence = self.chains(loop)
        if not loop.hardware:  # each iteration waits for the previous one to drain
            return loop.iterations * max(issue, critical)
        return loop.iterations * max(issue, recurrence) + critical

    def cycles(self, vf: VF) -> float:
        """Cycles of one VF call, from its call to its last store."""
        return self.call_cycles + sum(self.loop_cycles(lp) for lp in vf.loops)


# -- MemBase calls as VFs ------------------------------------------------------------------

BARRIER = "barrier"  # PipeBarrier<PIPE_V> in a list of MemBase calls


@dataclass(frozen=True)
class Operand:
    """A UB tensor operand of a MemBase call: buffer name, element size, and whether only
    its first element is read (broadcast, e.g. Duplicate from a reduced value)."""

    buffer: str
    itemsize: int
    first_only: bool = False


@dataclass(frozen=True)
class Call:
    """One MemBase API call on UB operands, as timed: kind, destination, sources, count."""

    kind: str
    dst: Operand
    srcs: tuple[Operand, ...]
    count: int
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def lanes(self, reg_bytes: int) -> int:
        """Elements per register: the widest operand fills one 256 B register."""
        widest = max([self.dst.itemsize, *(s.itemsize for s in self.srcs)])
        return reg_bytes // widest

    def iterations(self, reg_bytes: int) -> int:
        return ceil_div(self.count, self.lanes(reg_bytes))


def fuse(calls: Sequence[Call | str], reg_bytes: int) -> list[list[Call]]:
    """Group consecutive calls into VFs: same iterations and lanes, no barrier between,
    reductions alone (their result leaves the loop)."""
    groups: list[list[Call]] = []
    cur: list[Call] = []
    for c in calls:
        if isinstance(c, str):
            if c != BARRIER:
                raise ValueError(f"unknown marker {c!r} in a MemBase call list")
            if cur:
                groups.append(cur)
            cur = []
            continue
        alone = c.kind in REDUCTIONS
        if cur and (alone or cur[0].kind in REDUCTIONS
                    or c.count != cur[0].count or c.lanes(reg_bytes) != cur[0].lanes(reg_bytes)):
            groups.append(cur)
            cur = []
        cur.append(c)
    if cur:
        groups.append(cur)
    return groups


def membase_vf(group: Sequence[Call], reg_bytes: int) -> VF:
    """The VF one fused group of MemBase calls compiles to (per register: loads of the
    sources not yet in registers, the operations, the stores that survive)."""
    first = group[0]
    iterations = first.iterations(reg_bytes)
    if first.kind in REDUCTIONS:
        src = first.srcs[0].buffer
        body = (vi("load", "v", src), vi("add", "acc", "acc", "v"))
        tail = (vi(first.kind, "r", "acc"), vi("store_first", None, "r"))
        return VF(first.kind, (VLoop((vi("dup", "acc"),)), VLoop(body, iterations),
                               VLoop(tail)))
    held: dict[tuple[str, int], str] = {}  # (buffer, itemsize) -> register holding it
    prologue: list[VInstr] = []
    body: list[VInstr | None] = []
    stores: dict[tuple[str, int], int] = {}  # pending store per destination -> body index
    for n, c in enumerate(group):
        regs = []
        for s in c.srcs:
            key = (s.buffer, s.itemsize)
            if key not in held:
                reg = f"{s.buffer}:{s.itemsize}"
                if s.first_only:
                    prologue.append(vi("load_brc", reg, s.buffer))
                else:
                    body.append(vi("load", reg, s.buffer))
                held[key] = reg
            regs.append(held[key])
        out = f"t{n}"
        body.append(vi(c.kind, out, *regs))
        for key in [k for k in held if k[0] == c.dst.buffer]:
            del held[key]  # the buffer changes: registers loaded from it are stale
        dkey = (c.dst.buffer, c.dst.itemsize)
        held[dkey] = out
        if dkey in stores:  # overwritten in this VF: the earlier store is dead
            body[stores[dkey]] = None
        stores[dkey] = len(body)
        body.append(vi("store", None, out))
    kept = tuple(i for i in body if i is not None)
    name = "+".join(c.kind for c in group)
    loops = [VLoop(tuple(prologue))] if prologue else []
    loops.append(VLoop(kept, iterations))
    return VF(name, tuple(loops))


def membase_vfs(calls: Sequence[Call | str], reg_bytes: int) -> list[VF]:
    return [membase_vf(g, reg_bytes) for g in fuse(calls, reg_bytes)]
