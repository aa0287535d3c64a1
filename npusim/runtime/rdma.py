"""AIVRDMAPostSend of one AIV core: an RDMA WRITE posted from the core to the die's NIC.

The A2 kernels that cross servers (sgl-kernel-npu csrc/deepep/ops2, the layered
dispatch and combine) do not hand their RDMA to an AICPU: the AIV writes an hns_roce WQE
and its SGE into the queue pair's send queue in GM and rings the NIC's doorbell, and the
NIC (npusim.hw.rdma) sends the bytes from then on. The call is made of the modelled units
the kernel's AIVRDMAPostSend uses, so its cost comes from the preset:

    QP context   QP_LOADS scalar GM loads (qpNum, sqPtr, the WQ and mem-info strides,
                 curRankId; the peer's QP entry: bufAddr, wqeSize, headAddr, tailAddr,
                 depth); cacheWriteThrough of the head (a dcci) and its load;
                 PipeBarrier<PIPE_ALL>
    SQ space     cacheWriteThrough of the tail and its load (one pass of the spin: the
                 model's SQ never fills)
    WQE and SGE  WQE_LOADS scalar GM loads (the peer's mem-info entries for rkey and lkey)
                 and WQE_STORES scalar GM stores into the SQ slot; cacheWriteThrough of
                 the WQE and SGE (two 64 B lines); PipeBarrier<PIPE_ALL>
    doorbell     the QP's wqn and sl loaded, SetValue into UB, PipeBarrier<PIPE_ALL>, an
                 8 B DataCopyPad UB -> the doorbell register, PipeBarrier<PIPE_ALL>: the
                 NIC takes the WQE when it lands
    head         SetValue, PipeBarrier<PIPE_ALL>, a 4 B DataCopyPad to the SQ head,
                 PipeBarrier<PIPE_ALL>

The GM words live in a per-rank workspace (HCCL's HcclAiRMAInfo and the QPs' send
queues: one 64 B line each, two for a WQE slot). Nothing here knows of dispatch or
combine. The WRITE is not signalled to the peer: a kernel that needs the peer to see the
bytes writes a flag after them with another post, as the layered kernels do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from npusim.hw import rdma as nic
from npusim.hw.memory import Region
from npusim.hw.pipe import Op
from npusim.hw.ub import UBBuffer
from npusim.runtime.conditions import Wait

if TYPE_CHECKING:
    from npusim.runtime.context import KernelContext


LINE = 64  # the workspace's unit; sizeof(hns_roce_rc_sq_wqe)
WQE_LINES = 2  # the WQE (64 B) and its SGE (16 B)
QP_LOADS = 11  # HcclAiRMAInfo's six fields and the QP entry's five
WQE_LOADS = 6  # the mem-info table entries read for rkey and lkey (three each)
WQE_STORES = 10  # seven WQE words and three SGE words
DOORBELL_BYTES = 8
HEAD_BYTES = 4
WORKSPACE = "hccl.airma_workspace"
# the workspace's areas, one block of lines per peer rank: the QP entry, its head and
# tail words, its doorbell register, its WQE slot
_QP, _HEAD, _TAIL, _DOORBELL, _WQE = range(5)
_AREAS = 4 + WQE_LINES


class AivRdma:
    """AIVRDMAPostSend of one core, staging the doorbell and head words in `buf` (the
    kernel's ubLocal, at least 32 B)."""

    def __init__(self, ctx: KernelContext, buf: UBBuffer) -> None:
        if ctx.cfg.rdma is None:
            raise ctx.error(f"the {ctx.cfg.name} preset has no RDMA NIC (hardware.rdma)")
        if nic.KIND not in ctx.rank.cores_of:
            raise ctx.error("the kernel posts RDMA WRITEs but its machine has no NIC: "
                            "declare Kernel.engines = ('rdma',)")
        if buf.nbytes < 32:
            raise ctx.error(f"the RDMA staging buffer {buf.name!r} has {buf.nbytes} B; the "
                            "doorbell needs 32 B", address=buf.offset)
        self.ctx = ctx
        self.buf = buf
        self.world = len(ctx.machine.ranks)
        self.ws = ctx.rank.workspace(WORKSPACE, _AREAS * self.world * LINE)

    def _line(self, area: int, peer: int) -> int:
        return (peer * _AREAS + area) * LINE

    def _word(self, at: int, value: int, nbytes: int, name: str) -> Wait:
        """SetValue into UB, PipeBarrier<PIPE_ALL>, a DataCopyPad of `nbytes` to GM `at`,
        PipeBarrier<PIPE_ALL>; returns the MTE3 op."""
        ctx = self.ctx
        ctx.ub_write(self.buf, 0, np.array([value], dtype=np.uint64 if nbytes == 8
                                           else np.uint32))
        yield from ctx.drain()
        op = ctx.copy_out(self.ws, at, self.buf, nbytes, name=name)
        yield from ctx.drain()
        return op

    def post_send(self, pe: int, dst_offset: int, src: Region, src_offset: int, nbytes: int,
                  name: str = "rdma_write") -> Wait:
        """AIVRDMAPostSend(src, dst, pe, nbytes, qp_info): an RDMA WRITE of `nbytes` of this
        rank's GM `src` into rank `pe`'s window at `dst_offset`, on the NIC's send queue
        for `pe`. Returns (the generator's value) the WQE's op, which completes when the
        bytes have landed; the call itself returns once the doorbell and head are
        written."""
        ctx = self.ctx
        if src.rank != ctx.rank_id:
            raise ctx.error(f"{name}: the source must be this rank's GM (a WRITE)",
                            address=src_offset)
        if pe == ctx.rank_id:
            raise ctx.error(f"{name}: an RDMA WRITE goes to another rank, not {pe}")
        ctx._check_gm(src, src_offset, nbytes, name)
        dst = ctx.window(pe)
        ctx._check_engine_put(dst, dst_offset, nbytes, name)
        ws, qp = self.ws, self._line(_QP, pe)
        for i in range(QP_LOADS):
            ctx.gm_read_scalar(ws, qp + 4 * (i % (LINE // 4)), np.uint32)
        for area in (_HEAD, _TAIL):  # cacheWriteThrough and the load of head, then tail
            at = self._line(area, pe)
            ctx.dcache.dcci_line(ws, at)
            ctx.gm_read_scalar(ws, at, np.uint32)
            if area == _HEAD:
                yield from ctx.drain()
        wqe = self._line(_WQE, pe)
        for i in range(WQE_LOADS):
            ctx.gm_read_scalar(ws, qp + 4 * i, np.uint32)
        for i in range(WQE_STORES):
            ctx.gm_write_scalar(ws, wqe + 4 * i, i, np.uint32)
        for k in range(WQE_LINES):
            ctx.dcache.dcci_line(ws, wqe + k * LINE)
        yield from ctx.drain()
        ctx.gm_read_scalar(ws, qp, np.uint32)  # wqn
        ctx.gm_read_scalar(ws, qp + 4, np.uint32)  # sl
        bell = yield from self._word(self._line(_DOORBELL, pe), 1, DOORBELL_BYTES,
                                     "rdma doorbell")
        machine = ctx.machine
        queue = nic.send_queue(machine, ctx.rank_id, pe)
        op: Op = nic.post_send(machine, ctx.rank_id, src, src_offset, dst, dst_offset, nbytes,
                               bell.done_at, name, queue=pe, core=ctx.core_id)
        ctx._count(queue, name, nbytes, True)
        ctx.bytes_put += nbytes
        yield from self._word(self._line(_HEAD, pe), 1, HEAD_BYTES, "rdma sq head")
        return op
