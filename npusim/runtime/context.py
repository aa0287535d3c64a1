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
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from npusim.errors import KernelError
from npusim.hw.machine import Machine, Rank
from npusim.hw.memory import Region, Watcher
from npusim.hw.pipe import Op, TransferPipe
from npusim.hw.ub import INF, UBBuffer
from npusim.runtime.conditions import Condition

Wait = Generator[Any, Any, None]


class KernelContext:
    """One core's view of the machine during one kernel call."""

    def __init__(self, machine: Machine, rank: Rank, core_index: int, start_ns: float) -> None:
        self.machine = machine
        self.env = machine.env
        self.cfg = machine.cfg
        self.rank = rank
        self.rank_id = rank.index
        self.core = rank.cores[core_index]
        self.core_id = core_index
        self.num_cores = len(rank.cores)
        self.world = machine.world
        self.ub = self.core.ub
        self.t = start_ns
        self.step = "start"
        self.waiting: str | None = None
        self.phases_open: dict[str, float] = {}
        cyc = self.cfg.cycle_ns
        self.cycle_ns = cyc
        self.issue_ns = self.cfg.scalar.cycles_per_op * cyc
        self.trace = machine.trace
        self.bytes_put = 0
        self._poll: tuple[Region, int, int, Condition] | None = None

    # -- bookkeeping -------------------------------------------------------------------
    def error(self, message: str, address: int | None = None, size: int | None = None
              ) -> KernelError:
        return KernelError(message, rank=self.rank_id, core=self.core_id, step=self.step,
                           address=address, size=size)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A kernel phase (send_data, wait_status, ...): its span goes to the report."""
        start = self.t
        prev_step = self.step
        self.step = name
        yield
        self.trace.phase(self.rank_id, self.core_id, name, start, self.t)
        self.step = prev_step

    def alloc(self, name: str, nbytes: int) -> UBBuffer:
        try:
            return self.ub.alloc(name, nbytes)
        except KernelError as exc:
            raise exc.located(self.rank_id, self.core_id, self.step) from None

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
        start = self.t
        self.t += dur
        self.core.scalar.busy_ns += dur
        self.trace.activity(self.rank_id, self.core_id, "scalar", self.step, start, self.t)

    def loop(self, iterations: int = 1) -> None:
        """Per-iteration overhead of a scalar loop."""
        self.scalar(iterations * self.cfg.scalar.loop_cycles / max(self.cfg.scalar.cycles_per_op,
                                                                  1e-9))

    def vector(self, name: str, elements: int, dtype: str | np.dtype | type,
               reads: Iterable[UBBuffer] = (), writes: Iterable[UBBuffer] = (),
               fn: Any = None, passes: float = 1.0) -> Op:
        """One vector instruction over `elements` of `dtype`: issue cost + one cycle per
        256 B repeat per pass. `fn` applies the effect to UB now; hazards are checked."""
        vcfg = self.cfg.vector
        nbytes = elements * np.dtype(dtype).itemsize
        repeats = -(-nbytes // vcfg.bytes_per_cycle)
        dur = (vcfg.issue_cycles + repeats * passes) * self.cycle_ns
        self.t += self.issue_ns
        start, end = self.core.vector.reserve(self.t, dur)
        reads = tuple(reads)
        writes = tuple(writes)
        for b in reads:
            if b.write_ready > start:
                raise self.error(
                    f"vector {name!r} reads UB buffer {b.name!r} before the copy into it "
                    f"({b.writer}) completes: missing wait", address=b.offset, size=b.nbytes)
        for b in writes:
            if b.write_ready > start or b.read_busy > start:
                raise self.error(
                    f"vector {name!r} overwrites UB buffer {b.name!r} while a transfer still "
                    f"uses it: missing wait", address=b.offset, size=b.nbytes)
        if fn is not None:
            fn()
        for b in writes:
            b.write_ready = end
            b.writer = f"vector {name}"
        for b in reads:
            if b.read_busy < end:
                b.read_busy = end
        op = Op(self.env, name, "vector")
        op.start_at = start
        op.done_at = end
        self.core.vector.last = op
        self.trace.activity(self.rank_id, self.core_id, "vector", name, start, end)
        return op

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
        self.scalar(ops)
        buf.write_ready = max(buf.write_ready, self.t)
        buf.writer = "scalar store"

    def ub_read(self, buf: UBBuffer, dtype: str | np.dtype | type, count: int,
                byte_offset: int = 0, ops: float = 1.0) -> np.ndarray:
        """Scalar loads from UB: a copy of the values, after checking they have landed."""
        if buf.write_ready > self.t:
            raise self.error(f"scalar load from UB buffer {buf.name!r} before the copy into "
                             f"it ({buf.writer}) completes: missing wait", address=buf.offset)
        self.scalar(ops)
        return buf.view(dtype, count, byte_offset).copy()

    # -- data movement -----------------------------------------------------------------
    def _check_ub(self, buf: UBBuffer, byte_offset: int, nbytes: int, what: str) -> None:
        if byte_offset < 0 or byte_offset + nbytes > buf.nbytes:
            raise self.error(f"{what} of {nbytes} B at +{byte_offset} overruns UB buffer "
                             f"{buf.name!r} ({buf.nbytes} B)",
                             address=buf.offset + byte_offset, size=nbytes)
        if (buf.offset + byte_offset) % self.ub.alignment:
            raise self.error(f"{what}: UB address is not {self.ub.alignment} B aligned",
                             address=buf.offset + byte_offset, size=nbytes)

    def _check_gm(self, region: Region, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or offset + nbytes > region.nbytes:
            raise self.error(f"{what} of {nbytes} B at offset {offset} is outside "
                             f"{region.name!r} of rank {region.rank} ({region.nbytes} B)",
                             address=offset, size=nbytes)

    def copy_in(self, dst: UBBuffer, src: Region, src_offset: int, nbytes: int,
                dst_offset: int = 0, name: str = "copy_in") -> Op:
        """DataCopy GM -> UB on MTE2. The bytes are read from GM when the copy completes."""
        self.t += self.issue_ns
        self._check_ub(dst, dst_offset, nbytes, name)
        self._check_gm(src, src_offset, nbytes, name)
        if src.rank != self.rank_id:
            raise self.error(f"{name}: reading another rank's memory (rank {src.rank}) is not "
                             "modelled; use put on the owner", address=src_offset)
        if dst.read_busy > self.t or dst.write_ready > self.t:
            raise self.error(f"{name} into UB buffer {dst.name!r} while a transfer or vector op "
                             "still uses it: missing wait", address=dst.offset, size=nbytes)
        dst.write_ready = INF
        dst.writer = name
        mte = self.cfg.mte
        op = Op(self.env, name, "mte2")
        pipe = self.core.mte2
        pipe.last = op
        ub_data = self.ub.data
        at = dst.offset + dst_offset
        path = (self.rank.hbm,)

        def done(t: float) -> None:
            ub_data[at:at + nbytes] = src.read(src_offset, nbytes)
            dst.write_ready = t
            self._finish(pipe, op, t, nbytes)

        def begin() -> None:
            op.start_at = self.env.now
            self.machine.net.start(nbytes, mte.gm_to_ub_gbps, path, mte.gm_to_ub_latency_ns, done)

        pipe.submit(self.t, begin)
        return op

    def copy_out(self, dst: Region, dst_offset: int, src: UBBuffer, nbytes: int,
                 src_offset: int = 0, name: str = "copy_out") -> Op:
        """DataCopy UB -> local GM (a tensor or the own window) on MTE3."""
        if dst.rank != self.rank_id:
            raise self.error(f"{name}: writing rank {dst.rank}'s memory needs a put")
        mte = self.cfg.mte
        return self._send(dst, dst_offset, src, src_offset, nbytes, name, (self.rank.hbm,),
                          mte.ub_to_gm_gbps, mte.ub_to_gm_latency_ns)

    def put(self, pe: int, offset: int, src: UBBuffer, nbytes: int, src_offset: int = 0,
            name: str = "put") -> Op:
        """Non-blocking one-sided put of UB bytes into rank `pe`'s window (MTE3).

        A put to the own rank is a local HBM write; otherwise it crosses the fabric."""
        dst = self.window(pe)
        mte = self.cfg.mte
        if pe == self.rank_id:
            return self._send(dst, offset, src, src_offset, nbytes, name, (self.rank.hbm,),
                              mte.ub_to_gm_gbps, mte.ub_to_gm_latency_ns)
        links, link_latency = self.machine.fabric.route(self.rank_id, pe)
        path = (*links, self.machine.ranks[pe].hbm)
        self.bytes_put += nbytes
        return self._send(dst, offset, src, src_offset, nbytes, name, path, mte.put_gbps,
                          mte.put_latency_ns + link_latency)

    def _send(self, dst: Region, dst_offset: int, src: UBBuffer, src_offset: int, nbytes: int,
              name: str, path: tuple, cap: float, latency: float) -> Op:
        self.t += self.issue_ns
        self._check_ub(src, src_offset, nbytes, name)
        self._check_gm(dst, dst_offset, nbytes, name)
        if src.write_ready > self.t:
            raise self.error(f"{name} reads UB buffer {src.name!r} before its data is ready "
                             f"({src.writer}): missing wait", address=src.offset, size=nbytes)
        payload = src.bytes_at(src_offset, nbytes).copy()
        src.read_busy = INF
        op = Op(self.env, name, "mte3")
        pipe = self.core.mte3
        pipe.last = op

        def done(t: float) -> None:
            dst.write(dst_offset, payload)
            src.read_busy = t
            self._finish(pipe, op, t, nbytes)

        def begin() -> None:
            op.start_at = self.env.now
            self.machine.net.start(nbytes, cap, path, latency, done)

        pipe.submit(self.t, begin)
        return op

    def _finish(self, pipe: TransferPipe, op: Op, t: float, nbytes: int) -> None:
        pipe.busy_ns += t - op.start_at
        self.trace.activity(self.rank_id, self.core_id, pipe.name, op.name, op.start_at, t,
                            nbytes)
        op.complete(t)
        pipe.release()

    # -- synchronisation ---------------------------------------------------------------
    def sync(self) -> Wait:
        """Bring the simulator up to this core's clock (before touching shared state)."""
        now = self.env.now
        if self.t > now:
            yield self.env.timeout(self.t - now)
        elif self.t < now:
            self.t = now

    def _block(self, event: Any, why: str) -> Wait:
        start = self.t
        self.waiting = why
        yield event
        self.waiting = None
        if self.env.now > self.t:
            self.t = self.env.now
        self.trace.activity(self.rank_id, self.core_id, "wait", self.step, start, self.t)

    def wait(self, *ops: Op) -> Wait:
        """Block until the ops complete (WaitFlag / DeQue between pipes)."""
        for op in ops:
            if op.done_at is None:
                yield from self._block(op.event(), f"{op.pipe} {op.name!r} to complete")
            elif op.done_at > self.t:
                self.t = op.done_at

    def pipe_barrier(self, pipe: str) -> Wait:
        """PipeBarrier: wait until every instruction issued on `pipe` has completed."""
        p = getattr(self.core, pipe)
        if p.last is not None:
            yield from self.wait(p.last)

    def drain(self) -> Wait:
        """Wait for all pipes (end of a kernel)."""
        for pipe in ("vector", "mte2", "mte3"):
            yield from self.pipe_barrier(pipe)

    def sync_all(self) -> Wait:
        """SyncAll across this rank's cores: leave together after the last arrival."""
        yield from self.sync()
        barrier = self.rank.barrier
        ev = barrier.arrive()
        yield from self._block(ev, "SyncAll (barrier of all cores of the rank)")

    def wait_until(self, region: Region, offset: int, nbytes: int, cond: Condition,
                   into: UBBuffer, into_offset: int = 0, name: str = "poll") -> Wait:
        """Poll GM until `cond` holds: loop { copy nbytes GM -> UB; check } (event driven).

        Polls happen every `period` from the call; the wait ends at the first poll whose
        read lands after the watched bytes satisfy `cond`. No event is spent per poll
        while nothing changes. The last polled bytes are left in `into`."""
        self._check_ub(into, into_offset, nbytes, name)
        self._check_gm(region, offset, nbytes, name)
        if region.rank != self.rank_id:
            raise self.error(f"{name}: polling another rank's memory is not modelled",
                             address=offset)
        if into.read_busy > self.t or into.write_ready > self.t:
            raise self.error(f"{name} into UB buffer {into.name!r} while a transfer or vector "
                             "op still uses it: missing wait", address=into.offset)
        yield from self.sync()
        mte = self.cfg.mte
        read_ns = mte.gm_to_ub_latency_ns + nbytes / mte.gm_to_ub_gbps
        period = read_ns + self.issue_ns + self.cfg.sync.poll_cycles * self.cycle_ns
        first = self.t + self.issue_ns + read_ns  # when the first poll's data lands
        data = region.read(offset, nbytes)
        if cond(data):
            self.t = first + self.cfg.sync.poll_cycles * self.cycle_ns
        else:
            env = self.env
            woke = env.event()
            pending = [False]

            def check_now(_e: Any = None) -> None:
                pending[0] = False
                if woke.triggered:
                    return
                sample = region.read(offset, nbytes)
                if cond(sample):
                    region.unwatch(watcher)
                    woke.succeed(sample)

            def on_change() -> None:
                if pending[0] or woke.triggered:
                    return
                polls = math.ceil(max(0.0, env.now - first) / period - 1e-9)
                at = first + polls * period
                pending[0] = True
                if at <= env.now:
                    check_now()
                else:
                    env.timeout(at - env.now).callbacks.append(check_now)

            watcher = Watcher(offset, nbytes, on_change)
            region.watch(watcher)
            self._poll = (region, offset, nbytes, cond)
            yield from self._block(woke, f"{name} on {region.name} of rank {region.rank}")
            self._poll = None
            data = woke.value
            self.t = max(self.t, env.now) + self.cfg.sync.poll_cycles * self.cycle_ns
        at = into.offset + into_offset
        self.ub.data[at:at + nbytes] = data
        into.write_ready = self.t
        into.writer = name
        self.trace.activity(self.rank_id, self.core_id, "mte2", name, self.t - read_ns, self.t,
                            nbytes)

    def describe_wait(self) -> str:
        """What this core is blocked on, with the current value for a poll."""
        if self.waiting is None:
            return "not waiting"
        poll = self._poll
        if poll is not None:
            region, offset, nbytes, cond = poll
            return (f"{self.waiting}: {nbytes} B at window offset 0x{offset:x}, "
                    f"{cond.describe(region.read(offset, nbytes))}")
        return self.waiting
