"""The kernel-facing API: what one AIV core's program can do, close to Ascend C + SHMEM.

A kernel program is a generator function ``program(ctx)`` run once per core. It issues
instructions that return at once (copies, vector ops, puts) and blocks only where the
real kernel blocks, with ``yield from``:

    load = ctx.copy_in(buf, x_gm, row * row_bytes, row_bytes)   # DataCopy GM -> UB (MTE2)
    yield from ctx.wait(load)                                    # WaitFlag<MTE2_V>
    ctx.vector("cast", n, "float16", reads=[buf], writes=[out], fn=...)
    ctx.put(dst_rank, offset, out, nbytes)                       # aclshmemx_mte_put_nbi (MTE3)

Each core keeps a local clock ``t`` (the scalar unit's time). Instructions with a cost
known at issue only advance clocks; the simulator is entered only for transfers, waits
and barriers, which keeps event counts proportional to the data moved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from npusim.errors import KernelError
from npusim.hw.cores import config_value, pipe_cap
from npusim.hw.machine import Machine, Rank
from npusim.hw.memory import Region, SparseRegion, Watcher
from npusim.hw.pipe import Op, TransferPipe
from npusim.hw.ub import INF, UBBuffer, strided_blocks
from npusim.hw.vf import COUNTERS as VF_COUNTERS
from npusim.hw.vf import VF, VFTiming, membase_vfs
from npusim.runtime.conditions import AtLeast, Condition
from npusim.runtime.crosscore import CrossCoreOps
from npusim.runtime.cube import CubeOps
from npusim.runtime.dcache import DataCache
from npusim.runtime.fault import past_time_limit
from npusim.runtime.membase import Api

if TYPE_CHECKING:
    from npusim.runtime.shmem import Shmem

Wait = Generator[Any, Any, None]
COUNTERS = (*VF_COUNTERS, "SCALAR")

_ITEMSIZE: dict[Any, int] = {}


def _itemsize(dtype: Any) -> int:
    """np.dtype(dtype).itemsize, cached (vector instructions ask for it millions of times)."""
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize
    return size


class Route(NamedTuple):
    """Where an MTE3 transfer goes: the links it crosses (the landing die's L2 or HBM is
    added per transfer: Rank.write_path), the issuing port's cap (GB/s) and the latency
    after its last byte (ns)."""

    path: tuple
    cap_gbps: float
    latency_ns: float


# the per-core transfer counters' keys, one tuple per distinct key (interning, no state)
_TRANSFER_KEYS: dict[tuple[str, str, str, bool], tuple[str, str, str, bool]] = {}


class _Send:
    """An MTE3 write from UB, queued on its pipe or in flight: what its start and its
    delivery need, in one slotted object (two closures and their cells cost 1.2 KiB, and a
    W 768 dispatch has hundreds of thousands queued at once)."""

    __slots__ = ("ctx", "op", "pipe", "atomic", "strided", "src", "src_offset", "src_span",
                 "dst", "dst_offset", "dst_span", "nbytes", "path", "cap", "latency")

    def __call__(self) -> None:
        """Start it (the pipe's queue holds the object itself: no bound method each)."""
        op, pipe = self.op, self.pipe
        pipe.began(op)
        self.ctx.machine.net.start(self.nbytes, self.cap, self.path, self.latency, self.done,
                                   self.ctx._on_sent(pipe, op), op.event())

    def done(self, t: float) -> None:
        # the bytes are read from UB at delivery: the hazard checks guarantee nothing
        # wrote them since the issue (src.read_busy holds every writer off until now)
        src, dst, strided, atomic = self.src, self.dst, self.strided, self.atomic
        raw = src.bytes_at(self.src_offset, self.src_span)
        payload = strided.gather(raw) if strided else raw
        if atomic is not None:  # read-add-write at this instant (the GM's atomic unit)
            dst.write(self.dst_offset,
                      atomic_sum(dst.read(self.dst_offset, self.dst_span), payload, atomic))
        elif strided is None or strided.dst_gap == 0:
            dst.write(self.dst_offset, payload)
        else:  # read-modify-write of the span: atomic at this instant
            span = dst.read(self.dst_offset, self.dst_span)
            strided.scatter(span, payload)
            dst.write(self.dst_offset, span)
        src.read_busy = t
        self.ctx._finish(self.pipe, self.op, t, self.nbytes)


@dataclass(frozen=True)
class Strided:
    """A strided DataCopy (Ascend C DataCopyParams, in bytes): `count` blocks of `length`
    bytes, with `src_gap` / `dst_gap` bytes skipped between blocks on each side."""

    count: int
    length: int
    src_gap: int = 0
    dst_gap: int = 0

    @property
    def nbytes(self) -> int:
        return self.count * self.length

    def src_span(self) -> int:
        return self.count * (self.length + self.src_gap) - self.src_gap

    def dst_span(self) -> int:
        return self.count * (self.length + self.dst_gap) - self.dst_gap

    def charged(self, granule: int) -> int:
        """Bytes the MTE moves: each block is rounded up to the burst granule."""
        return self.count * (-(-self.length // granule) * granule)

    def gather(self, src: np.ndarray) -> np.ndarray:
        """The moved bytes, contiguous, from a source span (src_gap = -length repeats one
        block, like a DataCopy with source stride 0)."""
        if self.src_gap == 0:
            return src[: self.nbytes]
        return strided_blocks(src, self.count, self.length, self.length + self.src_gap).reshape(-1)

    def scatter(self, dst: np.ndarray, moved: np.ndarray) -> None:
        """Write moved bytes into a destination span (gaps untouched)."""
        if self.dst_gap == 0:
            dst[: self.nbytes] = moved
            return
        pitch = self.length + self.dst_gap
        if self.dst_gap > 0:  # disjoint blocks: one strided assignment
            strided_blocks(dst, self.count, self.length, pitch)[...] = (
                moved[:self.nbytes].reshape(self.count, self.length))
            return
        for i in range(self.count):  # overlapping blocks land in order
            dst[i * pitch:i * pitch + self.length] = moved[i * self.length:(i + 1) * self.length]


@dataclass
class Poll:
    """One GM area a poll loop reads: contiguous `nbytes` or a strided read, a condition on
    the bytes read, the UB buffer they land in and the vector/scalar check cost (ns).

    `into` None: a scalar read that lands in no UB buffer (a spin); `read_ns`, if given,
    replaces the MTE2 read's cost (SHMEM's signal_wait_until: a dcci and a line fill)."""

    region: Region
    offset: int
    cond: Condition
    into: UBBuffer | None  # None: a scalar spin (the value lands in a register)
    nbytes: int = 0
    into_offset: int = 0
    strided: Strided | None = None
    check_ns: float = 0.0
    read_ns: float | None = None

    @property
    def span(self) -> int:
        return self.strided.src_span() if self.strided else self.nbytes

    def sample(self) -> np.ndarray:
        """The bytes a read would return now (gathered for a strided read)."""
        raw = self.region.read(self.offset, self.span)
        return self.strided.gather(raw) if self.strided else raw


def atomic_sum(current: np.ndarray, payload: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The bytes of current + payload as `dtype` elements (GM AtomicAdd)."""
    return (current.view(dtype) + payload.view(dtype)).astype(dtype).view(np.uint8)


class KernelContext(CubeOps, CrossCoreOps):
    """One core's view of the machine during one kernel call (an AIV's; an AIC's adds the
    cube's calls, npusim.runtime.cube; cross-core flags: npusim.runtime.crosscore)."""

    # a context per core: 412 B of slots instead of a 1.6 KiB dictionary (the 42
    # attributes overflow CPython's shared keys), 45 MiB at W 768; "__dict__" keeps room
    # for what a kernel family notes on its contexts
    __slots__ = ("machine", "env", "cfg", "rank", "rank_id", "core", "core_id", "core_label",
                 "num_cores", "world", "ub", "block_idx", "sub_block_idx", "kind_index",
                 "block_num", "block", "flags", "_atomic", "_polled", "_l0c_dtype",
                 "_mte2_cap", "_mte2_latency", "_burst", "t", "step", "waiting",
                 "phases_open", "cycle_ns", "issue_ns", "trace", "bytes_put", "transfers",
                 "_sent_at", "_poll", "_poll_name", "dcache", "frames", "_shmem", "_local",
                 "counters", "_vf_timing", "t_limit", "__dict__")

    def __init__(self, machine: Machine, rank: Rank, core_index: int, start_ns: float,
                 kind: str | None = None) -> None:
        self.machine = machine
        self.env = machine.env
        self.cfg = machine.cfg
        self.rank = rank
        self.rank_id = rank.index
        cores = rank.cores_of[kind] if kind is not None else rank.cores
        self.core = cores[core_index]
        self.core_id = core_index  # the core's row in the report (a MIX launch: its block order)
        self.core_label: int | str = core_index  # how errors name it ("7 (aiv 4)" in a MIX)
        self.num_cores = len(cores)
        self.world = machine.world
        self.ub = self.core.buffers.get("ub")  # None on a kind without UB (the AIC)
        # a MIX launch fills these in (npusim.runtime.launch): the block, the core's
        # sub-block in it (AIV 0 or 1; the AIC 0), the blocks launched, the block's contexts
        self.block_idx = core_index
        self.sub_block_idx = 0
        self.kind_index = core_index  # among the launched cores of its kind (AIV: 2 b + s)
        self.block_num = 0
        self.block: list[KernelContext] = []
        self.flags: Any = None  # the rank's cross-core flag board (npusim.runtime.crosscore)
        self._atomic: np.dtype | None = None  # SetAtomicAdd<T> in force for MTE3 writes
        self._polled: np.ndarray | None = None  # the bytes the last poll or spin saw
        self._l0c_dtype: dict[int, Any] = {}  # L0C buffer -> its accumulator dtype
        self._mte2_cap, self._mte2_latency = self._port("mte2")
        # the MTE's burst: a strided copy's blocks are charged in whole bursts (32 B, the
        # granule of UB addresses)
        self._burst = self.cfg.ub.alignment
        self.t = start_ns
        self.t_limit = math.inf  # the launch's simulated-time limit: local clocks hold to it
        self.step = "start"
        self.waiting: str | Op | None = None  # what the core is blocked on (an Op: its end)
        self.phases_open: dict[str, float] = {}
        cyc = self.cfg.cycle_ns
        self.cycle_ns = cyc
        self.issue_ns = self.cfg.scalar.cycles_per_op * cyc
        self.trace = machine.trace
        self.bytes_put = 0
        # (phase, pipe, name, remote) -> [count, bytes]: per-core work for the report
        self.transfers: dict[tuple[str, str, str, bool], list[int]] = {}
        self._sent_at: dict[Op, float] = {}
        self._poll: Poll | None = None
        self._poll_name = ""
        self.dcache = DataCache(self)
        self.frames: dict[str, list[float]] = {}  # profiling frames: name -> [start, end]
        self._shmem: Shmem | None = None
        mte = self.cfg.mte  # UB -> local GM or own window: the rank's L2 or HBM (_send)
        self._local = Route((), mte.ub_to_gm_gbps, mte.ub_to_gm_latency_ns)
        # instructions executed, as the sample profiles count them (RVECEX/LD/ST: VF
        # instructions of MemBase calls and VF programs; SCALAR: scalar slots issued)
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._vf_timing: VFTiming | None = None

    # -- bookkeeping -------------------------------------------------------------------
    def error(self, message: str, address: int | None = None, size: int | None = None
              ) -> KernelError:
        return KernelError(message, rank=self.rank_id, core=self.core_label, step=self.step,
                           address=address, size=size)

    def _port(self, pipe: str) -> tuple[float, float]:
        """A transfer pipe's local port cap (GB/s) and latency (ns) from the kind's keys."""
        for pk in self.core.kind.pipes:
            if pk.name == pipe and pk.role == "transfer":
                cap = pipe_cap(self.cfg, pk)
                latency = config_value(self.cfg, pk.latency) if pk.latency else None
                return (cap if cap is not None else math.inf,
                        float(latency) if latency is not None else 0.0)
        return math.inf, 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A kernel phase (send_data, wait_status, ...): its span goes to the report."""
        start = self.t
        prev_step = self.step
        self.step = name
        yield
        self.trace.phase(self.rank_id, self.core_id, name, start, self.t)
        self.step = prev_step

    def alloc(self, name: str, nbytes: int, buffer: str = "ub") -> UBBuffer:
        """A named allocation in one of the core's local buffers (default the UB)."""
        local = self.core.buffers.get(buffer)
        if local is None:
            raise self.error(f"core kind {self.core.kind.name} has no local buffer {buffer!r}; "
                             f"buffers: {', '.join(self.core.buffers)}")
        try:
            return local.alloc(name, nbytes)
        except KernelError as exc:
            raise exc.located(self.rank_id, self.core_label, self.step) from None

    def tensor(self, name: str) -> Region:
        try:
            return self.rank.tensors[name]
        except KeyError:
            raise self.error(f"no GM tensor {name!r} on this rank") from None

    def window(self, rank: int | None = None) -> Region:
        """The symmetric window of a rank (default: this one)."""
        r = self.rank_id if rank is None else rank
        if not 0 <= r < self.world:
            raise self.error(f"rank {r} is outside the world of {self.world} ranks")
        return self.machine.ranks[r].window

    # -- scalar and vector -------------------------------------------------------------
    def scalar(self, ops: float = 1.0) -> None:
        """Scalar work on the core's scalar unit (index maths, loop control, UB loads)."""
        dur = ops * self.issue_ns
        self.counters["SCALAR"] += ops
        start = self.t
        self.t += dur
        if self.t > self.t_limit:  # a loop that only charges its own clock
            raise past_time_limit(self)
        self.core.scalar.busy_ns += dur
        if self.trace.detailed:
            self.trace.activity(self.rank_id, self.core_id, "scalar", self.step, start, self.t)

    def loop(self, iterations: int = 1) -> None:
        """Per-iteration overhead of a scalar loop."""
        self.scalar(iterations * self.cfg.scalar.loop_cycles / max(self.cfg.scalar.cycles_per_op,
                                                                  1e-9))

    def vector(self, name: str, elements: int = 0, dtype: str | np.dtype | type = "uint8",
               reads: Iterable[UBBuffer] = (), writes: Iterable[UBBuffer] = (),
               fn: Any = None, passes: float = 1.0, repeats: int | None = None,
               extra_cycles: float = 0.0, issue_slots: int = 1) -> Op:
        """One vector instruction (or vector function): issue cost + `passes` cycles per
        repeat, a repeat being 256 B of `elements` x `dtype` (or `repeats` given directly,
        e.g. loop iterations of a register-based vector function). `fn` applies the effect
        to UB at issue; the pipe-hazard checks make that equal to applying it at the end."""
        vcfg = self.cfg.vector
        if repeats is None:
            nbytes = elements * _itemsize(dtype)
            repeats = -(-nbytes // vcfg.bytes_per_cycle)
        dur = (vcfg.issue_cycles + (repeats * passes + extra_cycles) * vcfg.cycles_per_repeat
               ) * self.cycle_ns
        return self.fixed("vector", name, dur, reads, writes, fn, issue_slots)

    def fixed(self, pipe: str, name: str, duration_ns: float, reads: Iterable[UBBuffer] = (),
              writes: Iterable[UBBuffer] = (), fn: Any = None, issue_slots: int = 1) -> Op:
        """One instruction of known cost on a fixed pipe of the core's kind (vector, or a
        kind's own: cube, FixPipe): issued by the scalar unit, run in pipe order, with the
        UB hazard checks of every instruction (a read waits for its writer, a write for
        every transfer still using the buffer)."""
        p = self._pipe(pipe)
        self.t += self.issue_ns
        if self.t > self.t_limit:
            raise past_time_limit(self)
        self.counters["SCALAR"] += issue_slots
        start, end = p.reserve(self.t, duration_ns)
        if issue_slots > 1:  # a run: the scalar issues the rest while the first executes
            self.t += (issue_slots - 1) * self.issue_ns
        reads = tuple(reads)
        writes = tuple(writes)
        for b in reads:
            if b.write_ready > start:
                raise self.error(
                    f"{pipe} {name!r} reads {b.ub.label} buffer {b.name!r} before the copy into "
                    f"it ({b.writer}) completes: missing wait", address=b.offset, size=b.nbytes)
        for b in writes:
            if b.write_ready > start or b.read_busy > start:
                raise self.error(
                    f"{pipe} {name!r} overwrites {b.ub.label} buffer {b.name!r} while a "
                    f"transfer still uses it: missing wait", address=b.offset, size=b.nbytes)
        if fn is not None:
            fn()
        for b in writes:
            b.mark_written()
            b.write_ready = end
            b.writer = f"{pipe} {name}"
        for b in reads:
            if b.read_busy < end:
                b.read_busy = end
        op = Op(self.env, name, pipe)
        op.start_at = start
        op.done_at = end
        p.last = op
        if self.trace.detailed:
            self.trace.activity(self.rank_id, self.core_id, pipe, name, start, end)
        return op

    def membase(self, name: str, calls: Sequence[Api | str]) -> Op:
        """MemBase API calls in program order (`membase.BARRIER` for PipeBarrier<PIPE_V>).
        RegBase (the 950): the calls compile to fused VFs, timed and counted by hw/vf.py.
        MemBase (A2/A3): each call is one instruction, issue cost + one cycle per repeat."""
        apis = [c for c in calls if not isinstance(c, str)]
        reads = {id(s.buf): s.buf for a in apis for s in a.srcs}
        writes = {id(a.dst): a.dst for a in apis}
        vcfg = self.cfg.vector
        if vcfg.model == "regbase":
            vfs = membase_vfs([c if isinstance(c, str) else c.call() for c in calls],
                              vcfg.bytes_per_cycle)
            return self._run_vfs(name, vfs, reads.values(), writes.values(),
                                 lambda: [a.apply() for a in apis])
        cycles = 0.0
        for a in apis:
            widest = max([a.dst_dtype.itemsize, *(s.dtype.itemsize for s in a.srcs)])
            repeats = -(-(a.count * widest) // vcfg.bytes_per_cycle)
            cycles += vcfg.issue_cycles + repeats * vcfg.cycles_per_repeat
        return self.fixed("vector", name, cycles * self.cycle_ns, reads.values(), writes.values(),
                          lambda: [a.apply() for a in apis], max(len(apis), 1))

    def vf(self, name: str, vfs: VF | Sequence[VF], reads: Iterable[UBBuffer] = (),
           writes: Iterable[UBBuffer] = (), fn: Any = None) -> Op:
        """Register-based vector functions (asc_vf_call of a __simd_vf__ function), issued
        back to back; timed and counted by their instructions (hw/vf.py). `fn` applies
        their effect. Only a RegBase vector unit (vector.model: regbase) runs them."""
        if self.cfg.vector.model != "regbase":
            raise self.error(f"vector function {name!r} needs a RegBase vector unit "
                             f"(vector.model: regbase); this preset has "
                             f"{self.cfg.vector.model!r}")
        return self._run_vfs(name, [vfs] if isinstance(vfs, VF) else list(vfs), reads,
                             writes, fn)

    def _run_vfs(self, name: str, vfs: Sequence[VF], reads: Iterable[UBBuffer],
                 writes: Iterable[UBBuffer], fn: Any) -> Op:
        if self._vf_timing is None:
            self._vf_timing = VFTiming.from_config(self.cfg.vector)
        timing = self._vf_timing
        cycles = 0.0
        for v in vfs:
            cycles += timing.cycles(v)
            for k, n in v.counts().items():
                self.counters[k] += n
        return self.fixed("vector", name, cycles * self.cycle_ns, reads, writes, fn,
                          max(len(vfs), 1))

    def vector_function(self, name: str, instructions: int | Sequence[int],
                        reads: Iterable[UBBuffer] = (), writes: Iterable[UBBuffer] = (),
                        fn: Any = None) -> Op:
        """A register-based vector function (__VEC_SCOPE__): its micro-instructions, counted
        from the kernel source, cost `vector.vf_cycles_per_instr` cycles each. A sequence
        of counts is a run of functions issued back to back, timed as one by one (like
        vector_seq); `fn` applies the whole run's effect."""
        vcfg = self.cfg.vector
        counts = (instructions,) if isinstance(instructions, int) else tuple(instructions)
        n = len(counts)
        return self.vector(name, reads=reads, writes=writes, fn=fn, repeats=0,
                           extra_cycles=(sum(counts) * vcfg.vf_cycles_per_instr
                                         + (n - 1) * vcfg.issue_cycles)
                           / vcfg.cycles_per_repeat, issue_slots=n)

    def vector_seq(self, name: str, instrs: Iterable[tuple[str, int, Any]],
                   reads: Iterable[UBBuffer] = (), writes: Iterable[UBBuffer] = (),
                   fn: Any = None) -> Op:
        """A run of vector instructions, each (name, elements, dtype), issued back to back;
        the same time as issuing them one by one (each costs more than its issue slot),
        with one call. `fn` applies the whole run's effect."""
        vcfg = self.cfg.vector
        bpc = vcfg.bytes_per_cycle
        n = 0
        cycles = 0.0
        for _, elements, dtype in instrs:
            n += 1
            cycles += -(-(elements * _itemsize(dtype)) // bpc)
        # n issue costs in all: one in vector(), n - 1 as extra repeat-free cycles
        extra = cycles + (n - 1) * vcfg.issue_cycles / vcfg.cycles_per_repeat
        return self.vector(name, reads=reads, writes=writes, fn=fn, repeats=0,
                           extra_cycles=extra, issue_slots=n)

    def ub_write(self, buf: UBBuffer, byte_offset: int, values: np.ndarray, ops: float = 1.0
                 ) -> None:
        """Scalar stores into UB (e.g. a triplet or a flag): cost `ops` scalar slots."""
        if buf.write_ready > self.t or buf.read_busy > self.t:
            raise self.error(f"scalar store into UB buffer {buf.name!r} while a transfer or "
                             "vector op still uses it: missing wait", address=buf.offset)
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
        if byte_offset < 0 or byte_offset + raw.size > buf.nbytes:
            raise self.error(f"scalar store of {raw.size} B at +{byte_offset} overruns UB "
                             f"buffer {buf.name!r} ({buf.nbytes} B)",
                             address=buf.offset + byte_offset, size=raw.size)
        buf.bytes_at(byte_offset, raw.size)[:] = raw
        buf.ub.mark(buf.offset + byte_offset, raw.size)
        self.scalar(ops)
        buf.write_ready = max(buf.write_ready, self.t)
        buf.writer = "scalar store"

    def ub_read(self, buf: UBBuffer, dtype: str | np.dtype | type, count: int,
                byte_offset: int = 0, ops: float = 1.0) -> np.ndarray:
        """Scalar loads from UB: a copy of the values, after checking they have landed."""
        if buf.write_ready > self.t:
            raise self.error(f"scalar load from UB buffer {buf.name!r} before the copy into "
                             f"it ({buf.writer}) completes: missing wait", address=buf.offset)
        self._check_written(buf, byte_offset, count * np.dtype(dtype).itemsize, None,
                            "scalar load")
        self.scalar(ops)
        return buf.view(dtype, count, byte_offset).copy()

    def gm_read_scalar(self, region: Region, offset: int, dtype: str | np.dtype | type) -> Any:
        """A scalar load from GM (GetValue) through the core's data cache: a miss costs a
        line fill (`dcache.miss_ns`), a hit one scalar slot (npusim.runtime.dcache)."""
        return self.dcache.load(region, offset, dtype)

    def gm_write_scalar(self, region: Region, offset: int, value: Any,
                        dtype: str | np.dtype | type) -> None:
        """A scalar store into this rank's GM (SetValue): one slot (npusim.runtime.dcache)."""
        self.dcache.store(region, offset, value, dtype)

    # -- profiling frames and SHMEM ----------------------------------------------------
    def prof_start(self, frame: str) -> None:
        """Open a profiling frame at the core's clock (SHMEMI_PROF_START: GetSystemCycle)."""
        self.frames[frame] = [self.t, self.t]

    def prof_end(self, frame: str) -> None:
        """Close a profiling frame (SHMEMI_PROF_END); the report reads the frames through
        Kernel.profile_fields."""
        if frame not in self.frames:
            raise self.error(f"profiling frame {frame!r} ended but never started")
        self.frames[frame][1] = self.t

    @property
    def shmem(self) -> Shmem:
        """The SHMEM device API of this core (npusim.runtime.shmem)."""
        if self._shmem is None:
            from npusim.runtime.shmem import Shmem
            self._shmem = Shmem(self)
        return self._shmem

    # -- data movement -----------------------------------------------------------------
    def _check_ub(self, buf: UBBuffer, byte_offset: int, nbytes: int, what: str) -> None:
        """In range of the buffer and aligned to its local buffer (UB, L1, L0A/B/C)."""
        local = buf.ub
        if byte_offset < 0 or byte_offset + nbytes > buf.nbytes:
            raise self.error(f"{what} of {nbytes} B at +{byte_offset} overruns {local.label} "
                             f"buffer {buf.name!r} ({buf.nbytes} B)",
                             address=buf.offset + byte_offset, size=nbytes)
        if (buf.offset + byte_offset) % local.alignment:
            raise self.error(f"{what}: {local.label} address is not {local.alignment} B "
                             "aligned", address=buf.offset + byte_offset, size=nbytes)

    def _mark(self, at: int, span: int, strided: Strided | None, dst_side: bool,
              local: Any = None) -> None:
        """Record local-buffer bytes as written (the blocks only, for a strided landing)."""
        local = local if local is not None else self.ub
        gap = (strided.dst_gap if dst_side else strided.src_gap) if strided else 0
        if strided is None or gap <= 0:
            local.mark(at, span)
            return
        local.mark_blocks(at, strided.count, strided.length, strided.length + gap)

    def _check_written(self, buf: UBBuffer, byte_offset: int, span: int,
                       strided: Strided | None, what: str) -> None:
        """A transfer or scalar load must not read UB bytes this call never wrote."""
        if buf.all_written:
            return
        at = buf.offset + byte_offset
        local = buf.ub
        if strided is None or strided.src_gap <= 0:
            first = local.unwritten(at, strided.length if strided and strided.src_gap < 0
                                    else span)
        else:
            pitch = strided.length + strided.src_gap
            first = -1
            for i in range(strided.count):
                first = local.unwritten(at + i * pitch, strided.length)
                if first >= 0:
                    break
        if first >= 0:
            raise self.error(f"{what} reads {local.label} buffer {buf.name!r} at "
                             f"+{first - buf.offset}, which nothing wrote in this call",
                             address=first, size=span)

    def _claim(self, dst: SparseRegion, offset: int, span: int, strided: Strided | None
               ) -> str | None:
        """Claim a put's destination bytes for the race check: its blocks when strided
        with gaps (a strided put may interleave with another writer's blocks)."""
        who = (self.rank_id, self.core_id, self.step)
        if strided is None or strided.dst_gap <= 0:
            return dst.claim(offset, span, who)
        pitch = strided.length + strided.dst_gap
        for i in range(strided.count):
            other = dst.claim(offset + i * pitch, strided.length, who)
            if other:
                return other
        return None

    def _check_gm(self, region: Region, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or offset + nbytes > region.nbytes:
            raise self.error(f"{what} of {nbytes} B at offset {offset} is outside "
                             f"{region.name!r} of rank {region.rank} ({region.nbytes} B)",
                             address=offset, size=nbytes)

    def copy_in(self, dst: UBBuffer, src: Region, src_offset: int, nbytes: int,
                dst_offset: int = 0, name: str = "copy_in", strided: Strided | None = None
                ) -> Op:
        """DataCopy GM -> a local buffer on MTE2 (the AIV's UB, the AIC's L1). The bytes are
        read from GM when the copy completes. From another rank's window it is a remote
        pull: the read crosses the fabric from that rank to this one (the reverse of a put's
        path), at the pipe's remote cap (`mte.put_gbps`), with the read latency plus the
        level's latency both ways (request out, data back)."""
        self.t += self.issue_ns
        if self.t > self.t_limit:
            raise past_time_limit(self)
        self.counters["SCALAR"] += 1
        src_span = strided.src_span() if strided else nbytes
        dst_span = strided.dst_span() if strided else nbytes
        local = dst.ub
        moved = strided.charged(self._burst) if strided else nbytes
        self._check_local(dst, name)
        self._check_ub(dst, dst_offset, dst_span, name)
        self._check_gm(src, src_offset, src_span, name)
        cap, latency = self._mte2_cap, self._mte2_latency
        remote = src.rank != self.rank_id
        if remote:
            cap, latency, path = self._pull_route(src, src_offset, moved, name)
        else:
            path = self.rank.read_path(moved)
        self._claim_landing(dst, dst_span, name)
        op = Op(self.env, name, "mte2")
        pipe = self.core.mte2
        pipe.issue(op)
        ub_data = local.data
        at = dst.offset + dst_offset

        def done(t: float) -> None:
            if strided is None:
                src.read_into(src_offset, ub_data[at:at + nbytes])
            else:
                strided.scatter(ub_data[at:at + dst_span],
                                strided.gather(src.peek(src_offset, src_span)))
            if strided is None and dst_offset == 0 and nbytes == dst.nbytes:
                dst.mark_written()
            elif not dst.all_written:
                self._mark(at, dst_span, strided, dst_side=True, local=local)
            dst.write_ready = t
            self._finish(pipe, op, t, moved)

        def begin() -> None:
            pipe.began(op)
            self.machine.net.start(moved, cap, path, latency, done, self._on_sent(pipe, op),
                                   op.event())

        self._count(pipe, name, moved, remote)
        pipe.submit(self.t, begin)
        return op

    def copy_out(self, dst: Region, dst_offset: int, src: UBBuffer, nbytes: int,
                 src_offset: int = 0, name: str = "copy_out", strided: Strided | None = None
                 ) -> Op:
        """DataCopy UB -> local GM (a tensor or the own window) on MTE3."""
        if dst.rank != self.rank_id:
            raise self.error(f"{name}: writing rank {dst.rank}'s memory needs a put")
        return self._send(dst, dst_offset, src, src_offset, nbytes, name, self._local, strided)

    def _claim_landing(self, dst: UBBuffer, span: int, name: str) -> None:
        """A transfer into a local buffer: nothing may still use it, and nothing may read
        it until the bytes land (write_ready is set at the landing)."""
        if dst.read_busy > self.t or dst.write_ready > self.t:
            raise self.error(f"{name} into {dst.ub.label} buffer {dst.name!r} while a transfer "
                             "or vector op still uses it: missing wait", address=dst.offset,
                             size=span)
        dst.write_ready = INF
        dst.writer = name

    def _check_local(self, buf: UBBuffer, what: str) -> None:
        """A transfer's local buffer must be one of this core's."""
        local = buf.ub
        if local is not self.ub and all(local is not b for b in self.core.buffers.values()):
            raise self.error(f"{what}: {local.label} buffer {buf.name!r} is not a local buffer "
                             f"of this core", address=buf.offset, size=buf.nbytes)

    def _pull_route(self, src: Region, offset: int, nbytes: int, what: str
                    ) -> tuple[float, float, tuple]:
        """A remote MTE2 read's (cap, latency, path): from the owner's HBM over the links
        a put from the owner to this rank crosses."""
        if not isinstance(src, SparseRegion):
            raise self.error(f"{what}: another rank's memory is read through its symmetric "
                             f"window only ({src.name!r} of rank {src.rank} is a GM tensor)",
                             address=offset)
        cap = next((pipe_cap(self.cfg, pk, remote=True) for pk in self.core.kind.pipes
                    if pk.name == "mte2"), None)
        if cap is None:
            raise self.error(f"{what}: core kind {self.core.kind.name} has no remote MTE2 "
                             "reads", address=offset)
        links, level_latency = self.machine.fabric.route(src.rank, self.rank_id)
        owner = self.machine.ranks[src.rank]
        owner.bytes_out += nbytes
        self.rank.bytes_in += nbytes
        return cap, self._mte2_latency + 2 * level_latency, (*owner.read_path(nbytes), *links)

    def set_atomic_add(self, dtype: str | np.dtype | type) -> None:
        """SetAtomicAdd<T>: later MTE3 writes (copy_out, put) add their `dtype` elements to
        the destination's when they land, instead of overwriting them (one read-add-write
        at the landing instant: concurrent adds from many cores all count)."""
        self._atomic = np.dtype(dtype)

    def set_atomic_none(self) -> None:
        """SetAtomicNone: MTE3 writes overwrite again."""
        self._atomic = None

    def put(self, pe: int, offset: int, src: UBBuffer, nbytes: int, src_offset: int = 0,
            name: str = "put", strided: Strided | None = None) -> Op:
        """Non-blocking one-sided put of UB bytes into rank `pe`'s window (MTE3).

        A put to the own rank is a local HBM write; otherwise it crosses the fabric."""
        dst = self.window(pe)
        if pe == self.rank_id:
            return self._send(dst, offset, src, src_offset, nbytes, name, self._local, strided,
                              claim=True)
        route = self.route(pe)
        moved = strided.nbytes if strided else nbytes
        self.bytes_put += moved
        self.rank.bytes_out += moved
        self.machine.ranks[pe].bytes_in += moved
        return self._send(dst, offset, src, src_offset, nbytes, name, route, strided,
                          remote=True, claim=True)

    def route(self, pe: int) -> Route:
        """The path of a write from this core into rank `pe`'s memory, up to its landing:
        nothing more for its own rank (UB->GM figures), the links crossed for another
        (put figures)."""
        if pe == self.rank_id:
            return self._local
        links, link_latency = self.machine.fabric.route(self.rank_id, pe)
        mte = self.cfg.mte
        return Route(tuple(links), mte.put_gbps,
                     mte.put_latency_ns + link_latency)

    def _send(self, dst: Region, dst_offset: int, src: UBBuffer, src_offset: int, nbytes: int,
              name: str, route: Route, strided: Strided | None = None, remote: bool = False,
              claim: bool = False) -> Op:
        self.t += self.issue_ns
        if self.t > self.t_limit:
            raise past_time_limit(self)
        self.counters["SCALAR"] += 1
        src_span = strided.src_span() if strided else nbytes
        dst_span = strided.dst_span() if strided else nbytes
        self._check_ub(src, src_offset, src_span, name)
        self._check_gm(dst, dst_offset, dst_span, name)
        if src.write_ready > self.t:
            raise self.error(f"{name} reads UB buffer {src.name!r} before its data is ready "
                             f"({src.writer}): missing wait", address=src.offset, size=src_span)
        self._check_written(src, src_offset, src_span, strided, name)
        atomic = self._atomic
        if atomic is not None:
            claim = False  # adds from many writers onto the same bytes are the point
            if strided is not None or nbytes % atomic.itemsize or dst_offset % atomic.itemsize:
                raise self.error(f"{name}: an AtomicAdd write must be contiguous whole "
                                 f"{atomic.name} elements", address=dst_offset, size=dst_span)
        if isinstance(dst, SparseRegion):
            problem = dst.zone_problem(dst_offset, dst_span)
            if problem:
                raise self.error(f"{name} of {dst_span} B to the window of rank {dst.rank} "
                                 f"{problem}", address=dst_offset, size=dst_span)
            if claim:
                other = self._claim(dst, dst_offset, dst_span, strided)
                if other:
                    raise self.error(f"{name} to the window of rank {dst.rank} overlaps the "
                                     f"bytes an earlier put of this call wrote ({other}): "
                                     "a race", address=dst_offset, size=dst_span)
        nbytes = strided.charged(self._burst) if strided else src_span
        src.read_busy = INF
        op = Op(self.env, name, "mte3")
        pipe = self.core.mte3
        pipe.issue(op)
        path, cap, latency = route
        landing = self.machine.ranks[dst.rank].write_path(nbytes)
        if landing:
            path = (*path, *landing)
        send = _Send()
        send.ctx, send.op, send.pipe, send.atomic, send.strided = self, op, pipe, atomic, strided
        send.src, send.src_offset, send.src_span = src, src_offset, src_span
        send.dst, send.dst_offset, send.dst_span = dst, dst_offset, dst_span
        send.nbytes, send.path, send.cap, send.latency = nbytes, path, cap, latency
        self._count(pipe, name, nbytes, remote)
        pipe.submit(self.t, send)
        return op

    def _count(self, pipe: TransferPipe, name: str, nbytes: int, remote: bool) -> None:
        key = (self.step, pipe.name, name, remote)
        c = self.transfers.get(key)
        if c is None:  # one key object for every core (W 768: 36,864 cores, ~10 keys each)
            self.transfers[_TRANSFER_KEYS.setdefault(key, key)] = [1, nbytes]
        else:
            c[0] += 1
            c[1] += nbytes

    def _on_sent(self, pipe: TransferPipe, op: Op) -> Any:
        """pipe.sent, and with detailed tracing also note when the pipe became free."""
        if not self.trace.detailed:
            return pipe.sent

        def sent() -> None:
            self._sent_at[op] = self.env.now
            pipe.sent()
        return sent

    def _finish(self, pipe: TransferPipe, op: Op, t: float, nbytes: int) -> None:
        pipe.landed(op, t)
        if self.trace.detailed:
            sent = self._sent_at.pop(op, t)
            self.trace.activity(self.rank_id, self.core_id, pipe.name, op.name, op.start_at,
                                sent, nbytes, delivered_ns=t)
        op.complete(t)
        pipe.delivered(op)

    # -- synchronisation ---------------------------------------------------------------
    def sync(self) -> Wait:
        """Bring the simulator up to this core's clock (before touching shared state)."""
        now = self.env.now
        if self.t > now:
            yield self.env.timeout(self.t - now)
        elif self.t < now:
            self.t = now

    def _block(self, event: Any, why: str | Op, label: str = "") -> Wait:
        """Block on `event`; `why` (text, or the op waited for) and `label` say what for,
        formatted only when asked (a deadlock report, the detailed trace)."""
        start = self.t
        self.waiting = why
        yield event
        self.waiting = None
        if self.env.now > self.t:
            self.t = self.env.now
        if self.trace.detailed:
            if not label:
                label = f"wait {why.name}" if isinstance(why, Op) else "wait"
            self.trace.activity(self.rank_id, self.core_id, "wait", label, start, self.t)

    def wait(self, *ops: Op) -> Wait:
        """Block until the ops complete (WaitFlag / DeQue between pipes)."""
        for op in ops:
            if op.done_at is None:
                yield from self._block(op.event(), op)
            elif op.done_at > self.t:
                if self.trace.detailed:
                    self.trace.activity(self.rank_id, self.core_id, "wait", f"wait {op.name}",
                                        self.t, op.done_at)
                self.t = op.done_at

    def mte_fence(self, pipe: str) -> None:
        """PipeBarrier<PIPE_MTE2/3> as the hardware does it: the pipe (not the scalar unit)
        waits for its earlier transfers to complete before starting the next one."""
        self._pipe(pipe).fence()

    def _pipe(self, pipe: str) -> Any:
        p = self.core.pipes.get(pipe)
        if p is None:
            raise self.error(f"core kind {self.core.kind.name} has no pipe {pipe!r}; pipes: "
                             f"{', '.join(self.core.pipes)}")
        return p

    def pipe_barrier(self, pipe: str) -> Wait:
        """Wait until every instruction issued on `pipe` has completed (the scalar unit
        blocks: SyncFunc<X_S>, or PipeBarrier<PIPE_ALL> for every pipe). On an MTE pipe
        that is every open transfer, not only the last issued: with per-peer latencies
        an earlier put can land after it, and it reads its UB bytes until it lands."""
        p = self._pipe(pipe)
        if isinstance(p, TransferPipe):
            while p.open:
                yield from self.wait(next(iter(p.open)))
        elif p.last is not None:
            yield from self.wait(p.last)

    def drain(self) -> Wait:
        """Wait for every pipe the core's kind declares (PipeBarrier<PIPE_ALL>, kernel end)."""
        for pipe in self.core.kind.drained():
            yield from self.pipe_barrier(pipe)

    def sync_all(self, all_kinds: bool = False) -> Wait:
        """SyncAll across this rank's cores: leave together after the last arrival. In a
        MIX launch the cores of the caller's kind (SyncAll<isAIVOnly=true> on the AIVs), or
        every core of the launch with `all_kinds` (SyncAll<false>: AIC and AIV)."""
        yield from self.sync()
        if self.block:
            barrier = self.rank.barriers["all" if all_kinds else self.core.kind.name]
        else:
            barrier = self.rank.barrier
        ev = barrier.arrive()
        yield from self._block(ev, "SyncAll (barrier of all cores of the rank)", "sync_all")

    def spin_until(self, region: Region, offset: int, cond: Condition, nbytes: int = 4,
                   delay_cycles: float = 0.0, name: str = "spin") -> Generator[Any, Any, Any]:
        """A scalar spin on GM (ReadGmByPassDCache in a loop, `delay_cycles` between
        reads): event driven like wait_until, each read costing one slot + the GM read
        latency (`mte.gm_to_ub_latency_ns`) + the delay (none after the read that sees
        `cond` hold). Returns the bytes it saw."""
        delay = delay_cycles * self.cycle_ns
        yield from self.poll_round_robin([Poll(region, offset, cond, None, nbytes, 0, None,
                                               delay)], 0, name)
        self.t -= delay  # the loop leaves at the read that saw it, without the delay
        return self._polled

    def store_remote(self, pe: int, offset: int, values: np.ndarray, name: str = "store"
                     ) -> None:
        """A scalar store (and its cache-line flush) into rank `pe`'s window: one slot, then
        the bytes land after `mte.put_latency_ns` and the level's latency (own rank:
        `mte.ub_to_gm_latency_ns`); a few bytes, so no bandwidth is charged."""
        dst = self.window(pe)
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8).copy()
        self._check_gm(dst, offset, raw.size, name)
        problem = dst.zone_problem(offset, raw.size)
        if problem:
            raise self.error(f"{name} of {raw.size} B to the window of rank {pe} {problem}",
                             address=offset, size=raw.size)
        self.scalar(1)
        mte = self.cfg.mte
        if pe == self.rank_id:
            latency = mte.ub_to_gm_latency_ns
        else:
            latency = mte.put_latency_ns + self.machine.fabric.route(self.rank_id, pe)[1]
        at = self.t + latency
        self.env.timeout(max(0.0, at - self.env.now)).callbacks.append(
            lambda _e: dst.write(offset, raw))

    def rank_barrier(self, base: int, generation: int, stride: int = 64,
                     delay_cycles: float = 0.0, name: str = "rank_barrier") -> Wait:
        """The generation-counter barrier across ranks (MegaMoE's SynchronizeRanks): core
        i < W stores `generation` (int32) into rank i's window at base + my rank * stride,
        then spins on its own window's slot of rank i until it holds at least
        `generation`. The other cores return at once (a SyncAll after it holds them)."""
        if self.block and self.core.kind.name != "aiv":
            raise self.error(f"{name}: the rank barrier runs on the AIV cores of a MIX launch")
        i = self.kind_index
        if i >= self.world:
            return
        self.store_remote(i, base + self.rank_id * stride, np.array([generation], np.int32),
                          name)
        yield from self.spin_until(self.window(), base + i * stride,
                                   AtLeast(np.int32, generation), 4, delay_cycles, name)

    def wait_until(self, region: Region, offset: int, nbytes: int, cond: Condition,
                   into: UBBuffer, into_offset: int = 0, name: str = "poll",
                   strided: Strided | None = None, check_ns: float = 0.0) -> Wait:
        """Poll GM until `cond` holds: loop { copy GM -> UB; check } (event driven).

        The wait ends at the first poll whose read lands after the watched bytes satisfy
        `cond`; no event is spent per poll while nothing changes. The last polled bytes
        are left in `into`."""
        yield from self.poll_round_robin(
            [Poll(region, offset, cond, into, nbytes, into_offset, strided, check_ns)], 0, name)

    def poll_round_robin(self, polls: list[Poll], start: int = 0, name: str = "poll",
                         observe: Callable[[int, float, np.ndarray], None] | None = None
                         ) -> Generator[Any, Any, int]:
        """Poll several GM areas in turn, starting at polls[start], until one satisfies its
        condition; return its index. Models the kernels' round-robin poll loops: each poll
        costs its read (latency + bytes / port) plus its check; the winner is the first
        poll, in rotation order and time, that sees its condition hold.

        observe(i, at, data), if given, hears of every content poll i will read: at the
        start and after each write into its area, with the time `at` of the first read that
        sees it (possibly after the winner's: the caller drops those)."""
        m = len(polls)
        if m == 0:
            raise self.error(f"{name}: nothing to poll")
        for p in polls:
            span = p.strided.src_span() if p.strided else p.nbytes
            self._check_gm(p.region, p.offset, span, name)
            if p.region.rank != self.rank_id:
                raise self.error(f"{name}: polling another rank's memory is not modelled",
                                 address=p.offset)
            if p.into is None:  # a scalar spin: the value goes to a register
                continue
            self._check_ub(p.into, p.into_offset,
                           p.strided.dst_span() if p.strided else p.nbytes, name)
            if p.into.read_busy > self.t or p.into.write_ready > self.t:
                raise self.error(f"{name} into UB buffer {p.into.name!r} while a transfer or "
                                 "vector op still uses it: missing wait", address=p.into.offset)
        yield from self.sync()
        env = self.env
        mte = self.cfg.mte
        tail = self.cfg.sync.poll_cycles * self.cycle_ns
        order = [(start + j) % m for j in range(m)]
        landing = [0.0] * m  # offset from t0 at which poll i's first read lands
        acc = 0.0
        for i in order:
            p = polls[i]
            read = (p.read_ns if p.read_ns is not None
                    else mte.gm_to_ub_latency_ns + self._charged(p) / mte.gm_to_ub_gbps)
            landing[i] = acc + self.issue_ns + read
            acc += self.issue_ns + read + p.check_ns + tail
        cycle = acc
        t0 = self.t

        def first_poll_after(i: int, t: float) -> float:
            q = math.ceil(max(0.0, t - t0 - landing[i]) / cycle - 1e-9)
            return t0 + landing[i] + q * cycle

        best: list[Any] = [math.inf, -1, 0]  # wake time, poll index, version
        woke = env.event()
        # fire -> on_change -> arm -> fire is a reference cycle; it goes through this
        # list, emptied when the wait ends, so the closures are freed without the collector
        handlers: list[Any] = []

        def arm(i: int, at: float) -> None:
            best[0], best[1] = at, i
            best[2] += 1
            version = best[2]
            env.timeout(max(0.0, at - env.now)).callbacks.append(
                lambda _e, v=version: handlers and handlers[0](v))

        def fire(version: int) -> None:
            if version != best[2] or woke.triggered:
                return
            i = best[1]
            sample = polls[i].sample()
            if polls[i].cond(sample):
                for w in watchers:
                    w.region.unwatch(w)
                woke.succeed((i, sample))
                return
            best[0], best[1] = math.inf, -1  # changed back meanwhile: look again
            for j in range(m):
                on_change(j)

        def on_change(i: int) -> None:
            if woke.triggered:
                return
            if observe is not None:
                observe(i, first_poll_after(i, env.now), polls[i].sample())
            if polls[i].cond(polls[i].sample()):
                at = first_poll_after(i, env.now)
                if at < best[0]:
                    arm(i, at)

        handlers.append(fire)
        watchers = []
        for i, p in enumerate(polls):
            w = Watcher(p.offset, p.span, lambda i=i: on_change(i))
            w.region = p.region
            p.region.watch(w)
            watchers.append(w)
        for i in range(m):
            on_change(i)
        self._poll, self._poll_name = polls[start], name
        yield from self._block(woke, f"{name} on the window of rank {self.rank_id}", name)
        handlers.clear()
        watchers.clear()
        self._poll = None
        i, data = woke.value
        self.t = max(self.t, env.now) + polls[i].check_ns + tail
        p = polls[i]
        self._polled = data
        if p.into is None:
            return i
        at = p.into.offset + p.into_offset
        if p.strided is None:
            self.ub.data[at:at + p.nbytes] = data
        else:
            p.strided.scatter(self.ub.data[at:at + p.strided.dst_span()], data)
        self._mark(at, p.strided.dst_span() if p.strided else p.nbytes, p.strided,
                   dst_side=True)
        p.into.write_ready = self.t
        p.into.writer = name
        return i

    def _charged(self, p: Poll) -> int:
        return p.strided.charged(self._burst) if p.strided else p.nbytes

    def wait_parts(self) -> tuple[str, str, int | None]:
        """What this core waits for, split for grouping many blocked cores: the part
        common to cores stopped at the same place in the program (pipe and instruction,
        poll name), the part about this core's bytes ('' if none) and their address."""
        why = self.waiting
        if why is None:
            return "no wait (computing or issuing)", "", None
        if isinstance(why, Op):
            return f"wait for {why.pipe} {why.name!r}", "", None
        poll = self._poll
        if poll is not None:
            return (f"{self._poll_name} on its own window",
                    f"{poll.span} B, {poll.cond.describe(poll.sample())}", poll.offset)
        return why, "", None

    def describe_wait(self) -> str:
        """What this core is blocked on, with the current value for a poll."""
        if self.waiting is None:
            return "not waiting"
        if isinstance(self.waiting, Op):
            return f"{self.waiting.pipe} {self.waiting.name!r} to complete"
        poll = self._poll
        if poll is not None:
            return (f"{self.waiting}: {poll.span} B at window offset 0x{poll.offset:x}, "
                    f"{poll.cond.describe(poll.sample())}")
        return self.waiting
