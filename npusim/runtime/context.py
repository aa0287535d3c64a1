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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from npusim.engine.stats import CoreStats, TransferStat
from npusim.errors import KernelError
from npusim.hw.cores import config_value, pipe_cap
from npusim.hw.machine import Machine, Rank
from npusim.hw.memory import Region
from npusim.hw.pipe import Op, TransferPipe
from npusim.hw.ub import INF, UBBuffer
from npusim.hw.vf import COUNTERS as VF_COUNTERS
from npusim.hw.vf import VF, VFTiming, membase_vfs
from npusim.runtime.conditions import AtLeast, Wait
from npusim.runtime.crosscore import CrossCoreOps
from npusim.runtime.cube import CubeOps
from npusim.runtime.dcache import DataCache
from npusim.runtime.membase import Api
from npusim.runtime.poll import Poll, PollLoop
from npusim.runtime.sanitiser import Sanitiser
from npusim.runtime.shmem import Shmem
from npusim.runtime.transfer import REAL, Route, Strided, TransferPath
from npusim.units import ceil_div

__all__ = ["COUNTERS", "KernelContext", "Poll", "Route", "Strided"]

COUNTERS = (*VF_COUNTERS, "SCALAR")

_ITEMSIZE: dict[Any, int] = {}


def _itemsize(dtype: Any) -> int:
    """np.dtype(dtype).itemsize, cached (vector instructions ask for it millions of times)."""
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize
    return size


class KernelContext(CubeOps, CrossCoreOps, TransferPath, PollLoop, Sanitiser):
    """One core's view of the machine during one kernel call (an AIV's; an AIC's adds the
    cube's calls, npusim.runtime.cube; cross-core flags: npusim.runtime.crosscore; copies
    and puts: npusim.runtime.transfer; polls: npusim.runtime.poll; access checks:
    npusim.runtime.sanitiser). The clock, the scalar and fixed-cost instructions, the
    waits and the state they touch are TransferPath's (npusim.runtime.transfer), C fields
    and C calls in its compiled build."""

    # a context per core: slots (with TransferPath's, 42 attributes) instead of a 1.6 KiB
    # dictionary (42 attributes overflow CPython's shared keys), 45 MiB at W 768;
    # "__dict__" keeps room for what a kernel family notes on its contexts
    __slots__ = ("cfg", "rank_id", "core_id", "core_label", "num_cores", "world", "block_idx",
                 "sub_block_idx", "kind_index", "block_num", "block", "flags", "_polled",
                 "_l0c_dtype", "phases_open", "cycle_ns", "bytes_put", "_poll", "_poll_name",
                 "dcache", "frames", "_shmem", "_vf_timing", "notes", "__dict__")

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
        # what the kernel's program notes on this core for its figures after the launch
        # (a family's own object; Kernel.fields reads it as CoreTiming.notes)
        self.notes: Any = None
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
        """A named allocation in one of the core's local buffers (default the UB); 0 B is
        a buffer no access fits."""
        nbytes = self._whole(nbytes, "ctx.alloc", "nbytes")
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
        if r.__class__ is not int:
            r = self._whole(r, "ctx.window", "rank")
        if not 0 <= r < self.world:
            raise self.error(f"rank {r} is outside the world of {self.world} ranks")
        return self.machine.ranks[r].window

    # -- scalar and vector -------------------------------------------------------------
    def loop(self, iterations: int = 1) -> None:
        """Per-iteration overhead of a scalar loop."""
        iterations = self._amount(iterations, "ctx.loop", "iterations")
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
        if (elements.__class__ is not int or elements < 0 or passes.__class__ not in REAL
                or not 0 <= passes < INF or extra_cycles.__class__ not in REAL
                or not 0 <= extra_cycles < INF
                or (repeats is not None and (repeats.__class__ not in REAL
                                             or not 0 <= repeats < INF))):
            self._vector_args(name, elements, passes, repeats, extra_cycles)
        if repeats is None:
            nbytes = elements * _itemsize(dtype)
            repeats = ceil_div(nbytes, vcfg.bytes_per_cycle)
        dur = (vcfg.issue_cycles + (repeats * passes + extra_cycles) * vcfg.cycles_per_repeat
               ) * self.cycle_ns
        return self.fixed("vector", name, dur, reads, writes, fn, issue_slots)

    def _vector_args(self, name: str, elements: Any, passes: Any, repeats: Any,
                     extra_cycles: Any) -> None:
        """vector()'s counts whole and its cycle terms finite, each >= 0."""
        call = f"ctx.vector({name!r})"
        self._whole(elements, call, "elements")
        self._amount(passes, call, "passes")
        self._amount(extra_cycles, call, "extra_cycles")
        if repeats is not None:
            self._amount(repeats, call, "repeats")

    def membase(self, name: str, calls: Sequence[Api | str]) -> Op:
        """MemBase API calls in program order (`membase.BARRIER` for PipeBarrier<PIPE_V>).
        RegBase (the 950): the calls compile to fused VFs, timed and counted by hw/vf.py.
        MemBase (A2/A3): each call is one instruction, issue cost + one cycle per repeat."""
        apis = [c for c in calls if not isinstance(c, str)]
        for a in apis:
            if a.count.__class__ is not int or a.count < 0:
                self._whole(a.count, f"ctx.membase({name!r}) {a.kind}", "count")
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
            repeats = ceil_div(a.count * widest, vcfg.bytes_per_cycle)
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
        for c in counts:
            if c.__class__ is not int or c < 0:
                self._whole(c, f"ctx.vector_function({name!r})", "instructions")
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
            if elements.__class__ is not int or elements < 0:
                self._whole(elements, f"ctx.vector_seq({name!r})", "elements")
            n += 1
            cycles += ceil_div(elements * _itemsize(dtype), bpc)
        # n issue costs in all: one in vector(), n - 1 as extra repeat-free cycles
        extra = cycles + (n - 1) * vcfg.issue_cycles / vcfg.cycles_per_repeat
        return self.vector(name, reads=reads, writes=writes, fn=fn, repeats=0,
                           extra_cycles=extra, issue_slots=n)

    def ub_write(self, buf: UBBuffer, byte_offset: int, values: np.ndarray, ops: float = 1.0
                 ) -> None:
        """Scalar stores into UB (e.g. a triplet or a flag): cost `ops` scalar slots."""
        if (byte_offset.__class__ is not int or byte_offset < 0 or ops.__class__ not in REAL
                or not 0 <= ops < INF):
            byte_offset = self._whole(byte_offset, "ctx.ub_write", "byte_offset")
            ops = self._amount(ops, "ctx.ub_write", "ops")
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
        count = self._whole(count, "ctx.ub_read", "count")
        byte_offset = self._whole(byte_offset, "ctx.ub_read", "byte_offset")
        ops = self._amount(ops, "ctx.ub_read", "ops")
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

    # -- what the core reports -------------------------------------------------------
    def stats(self) -> CoreStats:
        """What this core did in its launch: puts, transfers, its pipes' busy time and
        its instruction counters."""
        return CoreStats(f"{self.core.kind.name} {self.kind_index}", self.bytes_put,
                         [TransferStat(*key, *val) for key, val in self.transfers.items()],
                         self.core.busy_ns(), dict(self.counters))

    def release(self) -> None:
        """Drop what points back to this context (its data cache, its MIX block, its
        shmem view) once the op is over and read, so reference counting frees it and its
        machine."""
        del self.dcache
        self.block = []
        self._shmem = None

    def frames_from(self, start_ns: float) -> dict[str, tuple[float, float]]:
        """The profiling frames this core recorded, from `start_ns` (the op's start)."""
        return {f: (a - start_ns, b - start_ns) for f, (a, b) in self.frames.items()}

    # -- profiling frames and SHMEM ----------------------------------------------------
    def prof_start(self, frame: str) -> None:
        """Open a profiling frame at the core's clock (SHMEMI_PROF_START: GetSystemCycle)."""
        self.frames[frame] = [self.t, self.t]

    def prof_end(self, frame: str) -> None:
        """Close a profiling frame (SHMEMI_PROF_END); the report reads the frames through
        Kernel.fields (Call.frames)."""
        if frame not in self.frames:
            raise self.error(f"profiling frame {frame!r} ended but never started")
        self.frames[frame][1] = self.t

    @property
    def shmem(self) -> Shmem:
        """The SHMEM device API of this core (npusim.runtime.shmem)."""
        if self._shmem is None:
            self._shmem = Shmem(self)
        return self._shmem

    # -- data movement -----------------------------------------------------------------


    # -- synchronisation ---------------------------------------------------------------
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
        p = self.core.pipes.get(pipe) or self._pipe(pipe)
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


