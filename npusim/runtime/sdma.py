"""SHMEM's SDMA calls of one AIV core: aclshmemx_sdma_put_nbi and aclshmemx_sdma_quiet.

The core does not move the bytes: it writes a STARS SQE into its own queue in GM and rings
the engine's doorbell, and the die's SDMA engine (npusim.hw.sdma) copies GM to GM from
then on. Each call is made of the modelled units it uses in hicann/shmem
(src/device/gm2gm/engine/shmem_device_sdma.hpp), so its cost comes from the preset:

    set_value(addr, x)   SetValue into the 64 B UB staging buffer, PipeBarrier<PIPE_ALL>,
                         a 4 B MTE3 DataCopyPad to GM, SetFlag/WaitFlag<MTE3_MTE2>
    put_nbi              set_value(send flag, 1); dcci + load of the SQ tail; per 1 MiB
                         block an SQE (SQE_LOADS + SQE_STORES scalar GM accesses, then
                         PipeBarrier<PIPE_ALL>); dcci_entire_cache; the doorbell (a
                         set_value to the SQ tail register: the engine sees the SQEs when
                         it lands); set_value of the SQ tail; PipeBarrier<PIPE_ALL>
    quiet                a flag SQE (8 B from the send flag to this core's receive slot)
                         posted the same way, fenced behind every SQE of its engine; then
                         poll { copy_gm_to_gm 4 B through UB; dcci; load } until it is
                         non-zero (event driven), and two set_values to clear the slots

All these GM words live in a per-rank SDMA workspace (SHMEM's sdma_workspace_addr: the
channel info, the queues, the flag slots; one 64 B line each). Nothing here knows of
dispatch or combine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from npusim.hw import sdma as engine
from npusim.hw.memory import Region
from npusim.hw.ub import UBBuffer
from npusim.runtime.conditions import Condition, Wait

if TYPE_CHECKING:
    from npusim.runtime.context import KernelContext


BLOCK_BYTES = 1 << 20  # sdma_config_t.block_bytes: one SQE per 1 MiB of a put
QUEUE_NUM = 1  # queues (SQs) per core
LINE = 64  # ACLSHMEM_SDMA_FLAG_LENGTH, sizeof(stars_channel_info_t), sizeof(an SQE)
MAX_AIV = 48  # ACLSHMEM_MAX_AIV_PER_NPU: the workspace's slots per kind
# aclshmemi_fill_sdma_sqe: the channel fields it reads (sq_base, sq_depth, stream_id, and
# sq_head, sq_depth for the task id and the tail) and the SQE fields it stores
SQE_LOADS = 5
SQE_STORES = 21
FLAG_BYTES = 8  # the flag SQE's length
WORKSPACE = "shmem.sdma_workspace"
# the workspace's lines: the send flag, then per core its receive slot, its remote receive
# slot (where the flag SQE writes), its channel info, its doorbell register, its SQE slot
_SEND, _RECV, _REMOTE, _CHANNEL, _DOORBELL, _SQE = range(6)


def _line(area: int, core: int = 0) -> int:
    return 0 if area == _SEND else (1 + (area - 1) * MAX_AIV + core) * LINE


class NonZero(Condition):
    """The completion flag (a uint32) has been written."""

    def __call__(self, data: np.ndarray) -> bool:
        return bool(data[:4].view(np.uint32)[0] != 0)

    def describe(self, data: np.ndarray) -> str:
        return f"expects the SDMA completion flag != 0; it is {data[:4].view(np.uint32)[0]}"


class Sdma:
    """aclshmemx_sdma_put_nbi / aclshmemx_sdma_quiet of one core, staging in `buf` (the
    kernel's 64 B SDMA UB buffer)."""

    def __init__(self, ctx: KernelContext, buf: UBBuffer) -> None:
        if ctx.cfg.sdma is None:
            raise ctx.error(f"the {ctx.cfg.name} preset has no SDMA engine (hardware.sdma)")
        if engine.KIND not in ctx.rank.cores_of:
            raise ctx.error("the kernel posts SDMA copies but its machine has no SDMA engine: "
                            "declare Kernel.engines = ('sdma',)")
        if ctx.core_id >= MAX_AIV:
            raise ctx.error(f"SHMEM's SDMA workspace serves {MAX_AIV} cores per rank")
        if buf.nbytes < LINE:
            raise ctx.error(f"the SDMA staging buffer {buf.name!r} has {buf.nbytes} B; SHMEM "
                            f"needs {LINE} B", address=buf.offset)
        self.ctx = ctx
        self.buf = buf
        self.engine = ctx.core_id % ctx.cfg.sdma.engines
        self.ws = ctx.rank.workspace(WORKSPACE, _line(_SQE, MAX_AIV))
        self.issued = 0  # SQEs posted since the last quiet

    # -- the pieces ---------------------------------------------------------------------
    def _set_value(self, offset: int, value: int, name: str) -> Wait:
        """aclshmemi_set_value: UB SetValue, PipeBarrier<PIPE_ALL>, 4 B MTE3 to GM, then
        WaitFlag<MTE3_MTE2>; returns the MTE3 op (landed)."""
        ctx = self.ctx
        ctx.ub_write(self.buf, 0, np.array([value], dtype=np.uint32))
        yield from ctx.drain()
        op = ctx.copy_out(self.ws, offset, self.buf, 4, name=name)
        yield from ctx.wait(op)
        return op

    def _sq_tail(self) -> None:
        """dcci_cacheline(channel + 4) and the load of sq_tail (a line fill)."""
        ctx = self.ctx
        at = _line(_CHANNEL, ctx.core_id) + 4
        ctx.dcache.dcci_line(self.ws, at)
        ctx.gm_read_scalar(self.ws, at, np.uint32)

    def _fill_sqe(self) -> Wait:
        """aclshmemi_fill_sdma_sqe into this core's queue, then PipeBarrier<PIPE_ALL>."""
        ctx = self.ctx
        chan, slot = _line(_CHANNEL, ctx.core_id), _line(_SQE, ctx.core_id)
        for i in range(SQE_LOADS):
            ctx.gm_read_scalar(self.ws, chan + 8 + 4 * i, np.uint32)
        for i in range(SQE_STORES):
            ctx.gm_write_scalar(self.ws, slot + (i % (LINE // 4)) * 4, i, np.uint32)
        yield from ctx.drain()

    def _ring(self, post: Callable[[float], None]) -> Wait:
        """Flush the SQEs (dcci_entire_cache), ring the doorbell, then store the new tail;
        the engine sees the SQEs when the doorbell lands: post(t) hands them over then."""
        ctx = self.ctx
        yield from ctx.dcache.dcci_entire()
        bell = yield from self._set_value(_line(_DOORBELL, ctx.core_id), 1, "sdma doorbell")
        post(bell.done_at)
        yield from self._set_value(_line(_CHANNEL, ctx.core_id) + 4, 1, "sdma sq_tail")

    # -- the calls ----------------------------------------------------------------------
    def put_nbi(self, pe: int, dst_offset: int, src: Region, src_offset: int, nbytes: int,
                name: str = "sdma_put_nbi") -> Wait:
        """aclshmemx_sdma_put_nbi(dst, src, buf, 64, n, pe): `nbytes` of this rank's GM
        `src` into rank `pe`'s window at `dst_offset`, one SQE per 1 MiB. Returns when
        the doorbell is rung; the bytes land later (sdma quiet waits for them)."""
        ctx = self.ctx
        if src.rank != ctx.rank_id:
            raise ctx.error(f"{name}: the source must be this rank's GM (a put)",
                            address=src_offset)
        ctx._check_gm(src, src_offset, nbytes, name)
        dst = ctx.window(pe)
        ctx._check_engine_put(dst, dst_offset, nbytes, name)
        yield from self._set_value(_line(_SEND), QUEUE_NUM, "sdma send flag")
        self._sq_tail()
        blocks = [(off, min(BLOCK_BYTES, nbytes - off)) for off in range(0, nbytes, BLOCK_BYTES)]
        for _ in blocks:
            yield from self._fill_sqe()
        pipe = engine.engine_pipe(ctx.machine, ctx.rank_id, self.engine)

        def post(at: float) -> None:
            for off, n in blocks:
                engine.sqe(ctx.machine, ctx.rank_id, src, src_offset + off, dst,
                           dst_offset + off, n, at, name, self.engine, core=ctx.core_id)
                ctx._count(pipe, name, n, pe != ctx.rank_id)
                if pe != ctx.rank_id:  # the core's remote puts, on either plane
                    ctx.bytes_put += n

        yield from self._ring(post)
        self.issued += len(blocks)
        yield from ctx.drain()

    def quiet(self, name: str = "sdma_quiet") -> Wait:
        """aclshmemx_sdma_quiet: a flag SQE behind this engine's SQEs, then the poll for
        its flag and the clearing of both flag slots."""
        ctx = self.ctx
        c = ctx.core_id
        self._sq_tail()
        yield from self._fill_sqe()
        remote = _line(_REMOTE, c)
        yield from self._ring(lambda at: engine.sqe(
            ctx.machine, ctx.rank_id, self.ws, _line(_SEND), self.ws, remote, FLAG_BYTES, at,
            f"{name} flag", self.engine, fenced=True, core=c))
        yield from self._poll(remote, name)
        yield from self._set_value(remote, 0, "sdma flag clear")
        yield from self._set_value(_line(_RECV, c), 0, "sdma flag clear")
        self.issued = 0

    def _poll(self, remote: int, name: str) -> Wait:
        """aclshmemi_sdma_poll_for_completion, event driven: each iteration reads the
        remote slot into UB (MTE2, the poll's read), writes it to the local slot (4 B
        MTE3 and its wait), dcci's and loads the local slot (a line fill) and compares."""
        from npusim.runtime.context import Poll

        ctx = self.ctx
        mte, d = ctx.cfg.mte, ctx.cfg.dcache
        rest = (ctx.issue_ns + 4 / mte.ub_to_gm_gbps + mte.ub_to_gm_latency_ns
                + d.dcci_ns + ctx.issue_ns + d.miss_ns + ctx.issue_ns)
        yield from ctx.poll_round_robin(
            [Poll(self.ws, remote, NonZero(), self.buf, 4, check_ns=rest)], 0, name)

