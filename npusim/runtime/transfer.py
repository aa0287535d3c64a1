"""The transfer path of a kernel context: DataCopy GM <-> UB on MTE2 / MTE3 and puts.

An instruction returns its Op at once; the bytes move when the pipe and the flow network
(npusim.engine.flow) deliver them, and the sanitiser (npusim.runtime.sanitiser) checks
every access at issue. This is the hot path of a run: one slotted ``_Send`` per queued
write, no closure. :class:`TransferPath` holds these calls of
:class:`npusim.runtime.context.KernelContext`, with the calls every instruction makes (the
scalar unit's issue slots on the core's clock, fixed-cost instructions and their UB hazard
checks, waits, the sanitiser's checks of a transfer) and the per-core state they touch:
in the compiled build (`_transfer.pxd`) C fields and C calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from npusim.engine.compiled import adopt
from npusim.hw.cores import pipe_cap
from npusim.hw.memory import Region, SparseRegion, land, lands_unchanged
from npusim.hw.pipe import Op, TransferPipe
from npusim.hw.ub import INF, UBBuffer, strided_blocks
from npusim.runtime.conditions import Wait
from npusim.runtime.fault import past_time_limit
from npusim.units import align_up


class Route(NamedTuple):
    """Where an MTE3 transfer goes: the links it crosses (the landing die's L2 or HBM is
    added per transfer: Rank.write_path), the issuing port's cap (GB/s), the latency
    after its last byte up to the landing (ns), and for a write to another die the time
    its write response takes back (ns): the MTE retires the write, and a barrier or
    SyncFunc<MTE3_S> on it returns, only when the response is in."""

    path: tuple
    cap_gbps: float
    latency_ns: float
    ack_ns: float = 0.0

REAL = frozenset((int, float))  # the argument types the hot calls check inline

# the per-core transfer counters' keys, one tuple per distinct key (interning, no state)
_TRANSFER_KEYS: dict[tuple[str, str, str, bool], tuple[str, str, str, bool]] = {}

class _Send:
    """An MTE3 write from UB, queued on its pipe or in flight: what its start and its
    delivery need, in one slotted object (two closures and their cells cost 1.2 KiB, and a
    W 768 dispatch has hundreds of thousands queued at once)."""

    __slots__ = ("ctx", "op", "pipe", "atomic", "strided", "src", "src_offset", "src_span",
                 "dst", "dst_offset", "dst_span", "nbytes", "path", "cap", "latency", "ack")

    def __call__(self) -> None:
        """Start it (the pipe's queue holds the object itself: no bound method each).
        Without a write response the delivery event is the op's own; with one the op
        completes later (retire), so the delivery gets no event of its own."""
        op, pipe = self.op, self.pipe
        pipe.began(op)
        self.ctx.machine.net.start(self.nbytes, self.cap, self.path, self.latency, self.done,
                                   self.ctx._on_sent(pipe, op),
                                   None if self.ack else op.event())

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
        if self.ack:  # the bytes are in; the write completes when its response is back
            self.pipe.later(t + self.ack, self.retire)
        else:
            self.ctx._finish(self.pipe, self.op, t, self.nbytes)

    def retire(self) -> None:
        """The write response is back: the op completes (waiters and fences go on)."""
        ctx = self.ctx
        ctx._finish(self.pipe, self.op, ctx.env.now, self.nbytes)

class _Copy:
    """A DataCopy GM -> local buffer (MTE2), queued on its pipe or in flight: like _Send,
    one slotted object instead of two closures and their cells."""

    __slots__ = ("ctx", "op", "pipe", "strided", "src", "src_offset", "src_span", "dst",
                 "dst_offset", "dst_span", "nbytes", "moved", "path", "cap", "latency")

    def __call__(self) -> None:
        """Start it (the pipe's queue holds the object itself)."""
        op, pipe = self.op, self.pipe
        pipe.began(op)
        self.ctx.machine.net.start(self.moved, self.cap, self.path, self.latency, self.done,
                                   self.ctx._on_sent(pipe, op), op.event())

    def done(self, t: float) -> None:
        """The bytes land: read from GM now, then mark the landing bytes written."""
        dst, strided, nbytes = self.dst, self.strided, self.nbytes
        local = dst.ub
        at = dst.offset + self.dst_offset
        if strided is None:
            self.src.land(self.src_offset, local.data[at:at + nbytes], at)
        else:
            span = local.data[at:at + self.dst_span]
            moved = strided.gather(self.src.peek(self.src_offset, self.src_span))
            if strided.dst_gap == 0:  # (the blocks land back to back)
                land(span[:strided.nbytes], moved, at)
            elif not lands_unchanged(span, moved):
                strided.scatter(span, moved)
        if strided is None and self.dst_offset == 0 and nbytes == dst.nbytes:
            dst.mark_written()
        elif not dst.all_written:
            self.ctx._mark(at, self.dst_span, strided, dst_side=True, local=local)
        dst.write_ready = t
        self.ctx._finish(self.pipe, self.op, t, self.moved)


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
        return self.count * align_up(self.length, granule)

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

def atomic_sum(current: np.ndarray, payload: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The bytes of current + payload as `dtype` elements (GM AtomicAdd)."""
    return (current.view(dtype) + payload.view(dtype)).astype(dtype).view(np.uint8)


class TransferPath:
    """The calls a kernel program makes on every instruction (KernelContext derives from
    it): the scalar unit's issue slots on the core's clock, fixed-cost instructions with
    their UB hazard checks, waits, copies and puts with the sanitiser's access checks.
    It holds the state these calls touch, so that the compiled build keeps it as C fields
    (the core's clock and limits as C doubles) and calls between them as C calls."""

    # the per-core state of the hot calls (the rest is KernelContext's)
    __slots__ = ("env", "machine", "rank", "core", "ub", "trace", "t", "t_limit", "issue_ns",
                 "step", "waiting", "counters", "transfers", "_sent_at", "_atomic", "_local",
                 "_burst", "_mte2_cap", "_mte2_latency")

    # -- the scalar unit and fixed-cost instructions -------------------------------------
    def scalar(self, ops: float = 1.0) -> None:
        """Scalar work on the core's scalar unit (index maths, loop control, UB loads)."""
        if ops.__class__ not in REAL or not 0 <= ops < INF:
            ops = self._amount(ops, "ctx.scalar", "ops")
        dur = ops * self.issue_ns
        self.counters["SCALAR"] += ops
        start = self.t
        self.t += dur
        if self.t > self.t_limit:  # a loop that only charges its own clock
            raise past_time_limit(self)
        self.core.scalar.busy_ns += dur
        if self.trace.detailed:
            self.trace.activity(self.rank_id, self.core_id, "scalar", self.step, start, self.t)

    def fixed(self, pipe: str, name: str, duration_ns: float, reads: Iterable[UBBuffer] = (),
              writes: Iterable[UBBuffer] = (), fn: Any = None, issue_slots: int = 1) -> Op:
        """One instruction of known cost on a fixed pipe of the core's kind (vector, or a
        kind's own: cube, FixPipe): issued by the scalar unit, run in pipe order, with the
        UB hazard checks of every instruction (a read waits for its writer, a write for
        every transfer still using the buffer)."""
        p = self.core.pipes.get(pipe) or self._pipe(pipe)  # (the lookup inlined: hot)
        if (duration_ns.__class__ not in REAL or not 0 <= duration_ns < INF
                or issue_slots.__class__ is not int or issue_slots < 1):
            self._amount(duration_ns, f"{pipe} {name!r}", "duration_ns")
            if self._whole(issue_slots, f"{pipe} {name!r}", "issue_slots") < 1:
                raise self._refused(f"{pipe} {name!r}", "issue_slots", issue_slots,
                                    "a whole number >= 1")
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
        if writes:
            writer = f"{pipe} {name}"
            for b in writes:
                b.mark_written()
                b.write_ready = end
                b.writer = writer
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

    # -- waits -------------------------------------------------------------------------
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
        now = self.env._now
        if now > self.t:
            self.t = now
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

    # -- the sanitiser's checks of every transfer (the others: npusim.runtime.sanitiser) -
    def _check_ub(self, buf: UBBuffer, byte_offset: int, nbytes: int, what: str) -> None:
        """In range of the buffer and aligned to its local buffer (UB, L1, L0A/B/C)."""
        if (byte_offset.__class__ is not int or nbytes.__class__ is not int or byte_offset < 0
                or nbytes < 0):
            byte_offset = self._whole(byte_offset, what, "the local buffer offset")
            nbytes = self._whole(nbytes, what, "nbytes")
        local = buf.ub
        if byte_offset < 0 or byte_offset + nbytes > buf.nbytes:
            raise self.error(f"{what} of {nbytes} B at +{byte_offset} overruns {local.label} "
                             f"buffer {buf.name!r} ({buf.nbytes} B)",
                             address=buf.offset + byte_offset, size=nbytes)
        if (buf.offset + byte_offset) % local.alignment:
            raise self.error(f"{what}: {local.label} address is not {local.alignment} B "
                             "aligned", address=buf.offset + byte_offset, size=nbytes)

    def _check_source(self, src: UBBuffer, offset: int, span: int, strided: Strided | None,
                      what: str) -> None:
        """The UB bytes a write out of UB reads: in the buffer, their copy in complete and
        every one of them written."""
        self._check_ub(src, offset, span, what)
        if src.write_ready > self.t:
            raise self.error(f"{what} reads UB buffer {src.name!r} before its data is ready "
                             f"({src.writer}): missing wait", address=src.offset, size=span)
        self._check_written(src, offset, span, strided, what)

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

    def _check_gm(self, region: Region, offset: int, nbytes: int, what: str) -> None:
        if offset.__class__ is not int or nbytes.__class__ is not int or offset < 0 or nbytes < 0:
            offset = self._whole(offset, what, "offset")
            nbytes = self._whole(nbytes, what, "nbytes")
        if offset < 0 or offset + nbytes > region.nbytes:
            raise self.error(f"{what} of {nbytes} B at offset {offset} is outside "
                             f"{region.name!r} of rank {region.rank} ({region.nbytes} B)",
                             address=offset, size=nbytes)

    def _check_local(self, buf: UBBuffer, what: str) -> None:
        """A transfer's local buffer must be one of this core's."""
        local = buf.ub
        if local is self.ub:
            return
        for b in self.core.buffers.values():  # (a loop: no closure in the compiled call)
            if local is b:
                return
        raise self.error(f"{what}: {local.label} buffer {buf.name!r} is not a local buffer of "
                         "this core", address=buf.offset, size=buf.nbytes)

    # -- copies and puts ---------------------------------------------------------------

    def _issue_transfer(self, nbytes: int, strided: Strided | None, name: str
                        ) -> tuple[int, int]:
        """The scalar unit issues one MTE instruction: a slot on the core's clock (held to
        the launch's time limit); the bytes it spans at its source and its destination."""
        self.t += self.issue_ns
        if self.t > self.t_limit:
            raise past_time_limit(self)
        self.counters["SCALAR"] += 1
        if strided is None:
            return nbytes, nbytes
        self._check_strided(strided, name)
        return strided.src_span(), strided.dst_span()

    def copy_in(self, dst: UBBuffer, src: Region, src_offset: int, nbytes: int,
                dst_offset: int = 0, name: str = "copy_in", strided: Strided | None = None
                ) -> Op:
        """DataCopy GM -> a local buffer on MTE2 (the AIV's UB, the AIC's L1). The bytes are
        read from GM when the copy completes. From another rank's window it is a remote
        pull: the read crosses the fabric from that rank to this one (the reverse of a put's
        path), at the pipe's remote cap (`mte.put_gbps`), with the read latency plus the
        level's latency both ways (request out, data back)."""
        src_span, dst_span = self._issue_transfer(nbytes, strided, name)
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
        copy = _Copy()
        copy.ctx, copy.op, copy.pipe, copy.strided = self, op, pipe, strided
        copy.src, copy.src_offset, copy.src_span = src, src_offset, src_span
        copy.dst, copy.dst_offset, copy.dst_span, copy.nbytes = dst, dst_offset, dst_span, nbytes
        copy.moved, copy.path, copy.cap, copy.latency = moved, path, cap, latency
        self._count(pipe, name, moved, remote)
        pipe.submit(self.t, copy)
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
        return Route(tuple(links), mte.put_gbps, mte.put_latency_ns + link_latency,
                     link_latency if mte.put_completion == "acked" else 0.0)

    def _send(self, dst: Region, dst_offset: int, src: UBBuffer, src_offset: int, nbytes: int,
              name: str, route: Route, strided: Strided | None = None, remote: bool = False,
              claim: bool = False) -> Op:
        src_span, dst_span = self._issue_transfer(nbytes, strided, name)
        self._check_gm(dst, dst_offset, dst_span, name)
        self._check_source(src, src_offset, src_span, strided, name)
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
        path, cap, latency, ack = route
        landing = self.machine.ranks[dst.rank].write_path(nbytes)
        if landing:
            path = (*path, *landing)
        send = _Send()
        send.ctx, send.op, send.pipe, send.atomic, send.strided = self, op, pipe, atomic, strided
        send.src, send.src_offset, send.src_span = src, src_offset, src_span
        send.dst, send.dst_offset, send.dst_span = dst, dst_offset, dst_span
        send.nbytes, send.path, send.cap, send.latency = nbytes, path, cap, latency
        send.ack = ack
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


if __name__ == "npusim.runtime.transfer":  # this module, not its build: use the build
    adopt(globals(), "npusim.runtime._transfer", ("Route", "_Send", "_Copy", "TransferPath"))
