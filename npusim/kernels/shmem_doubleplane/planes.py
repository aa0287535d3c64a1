"""Stage 1 of dispatch_doubleplane and combine_doubleplane (hicann/shmem
examples/{dispatch,combine}/*_doubleplane/*_doubleplane_kernel.cpp): the classic kernels'
stage 1 with the large remote segments moved onto the SDMA plane. Stages 2 and 3 (and
combine's reduction) are classic's own, so the outputs are the classic outputs.

Dispatch, core c serving dst_rank c: a first scan counts the segments and this rank's
remote pairs; the segment rule marks sdma_flags; then, in the source's order,
  1. SDMA payloads: an sdma_put_nbi per pair of the SDMA segments (64 B of UB at 191 KiB),
     an sdma_quiet after every 256 and one after the last;
  2. MTE payloads: classic's mte_put_nbi + quiet per pair of the other segments;
  3. assist, ready and count entries of the MTE segments (classic's, on MTE);
  4. the same for the SDMA segments, so their flags follow their quiet data.
Combine, core c serving src_rank c: the threshold from ep_recv_count; SDMA payloads of
the SDMA segments; MTE rows (payload + status) of the others; sdma_quiet; then the
status puts of the SDMA rows and a quiet. All control goes on MTE.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.shmem_classic import combine as classic_combine
from npusim.kernels.shmem_classic import dispatch as classic_dispatch
from npusim.kernels.shmem_classic.layout import UB_TMP_OFFSET, ClassicTiling
from npusim.kernels.shmem_doubleplane.rule import SDMA_ISSUE_LIMIT, threshold_den, use_sdma
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.runtime.sdma import LINE, Sdma
from npusim.units import KiB

SDMA_UB_OFFSET = 191 * KiB  # sdma_tmp = (__ubuf__ T *)(191 KiB), SDMA_UB_SIZE 64 B
RULE_OPS = 6  # DispatchUseSdma / CombineUseSdma: the compares, the product, the flag


def _sdma(ctx: KernelContext, t: ClassicTiling) -> Sdma:
    """The core's SDMA calls, staging in 64 B of UB at 191 KiB (after tmp_buff)."""
    pad = SDMA_UB_OFFSET - (UB_TMP_OFFSET + t.ub_size)
    if pad > 0:
        ctx.alloc("sdma_pad", pad)
    return Sdma(ctx, ctx.alloc("sdma_tmp", LINE))


class Quota:
    """sdma_outstanding: an sdma_quiet after every SDMA_ISSUE_LIMIT puts."""

    def __init__(self, sdma: Sdma) -> None:
        self.sdma = sdma
        self.outstanding = 0
        self.quiets = 0

    def put(self, ctx: KernelContext, *args: Any) -> Wait:
        yield from self.sdma.put_nbi(*args)
        self.outstanding += 1
        ctx.scalar(2)  # ++sdma_outstanding; >= SDMA_ISSUE_LIMIT
        if self.outstanding >= SDMA_ISSUE_LIMIT:
            yield from self.quiet()

    def quiet(self) -> Wait:
        yield from self.sdma.quiet()
        self.outstanding = 0
        self.quiets += 1


# -- dispatch ---------------------------------------------------------------------------
def dispatch_send(ctx: KernelContext, t: ClassicTiling, dst_rank: int, status_ub: Any,
                  tmp_buff: Any) -> Wait:
    """dispatch_doubleplane's stage 1 for one destination rank."""
    s = t.shape
    me, L, K = ctx.rank_id, s.L, s.K
    quota = Quota(_sdma(ctx, t))
    counts = classic_dispatch.count_segments(ctx, t, dst_rank)
    ids = ctx.tensor("expert_ids").read(0, 4 * s.BS * K).view(np.int32)
    remote_tokens = int((ids // L != me).sum())
    ctx.scalar(s.BS * K + remote_tokens)  # route_dst_rank != my_rank; ++remote_tokens
    num, den = remote_tokens * t.row_bytes, threshold_den(t.W, L)
    ctx.scalar(2)  # threshold_num, threshold_den
    flags = [use_sdma(dst_rank, me, counts[le], t.row_bytes, num, den) for le in range(L)]
    ctx.loop(L)
    ctx.scalar(RULE_OPS * L)
    sdma_segment = flags.__getitem__

    def mte_segment(le: int) -> bool:
        return not flags[le]

    win = t.window
    x = ctx.tensor("x")
    slot_offsets = [0] * L
    for flat, expert_id in classic_dispatch.kept(ctx, t, dst_rank, sdma_segment):
        token_id, le = flat // K, expert_id % L
        slot = slot_offsets[le]
        slot_offsets[le] += 1
        ctx.scalar(5)  # token_id, slot++, data_block, global_slot
        yield from quota.put(ctx, dst_rank, win.payload_at(win.global_slot(me, le, slot)), x,
                             token_id * t.row_bytes, t.row_bytes)
    if any(flags) and quota.outstanding > 0:
        yield from quota.quiet()
    yield from classic_dispatch.put_payloads(ctx, t, dst_rank, tmp_buff, mte_segment)
    yield from classic_dispatch.send_control(ctx, t, dst_rank, status_ub, counts, mte_segment)
    yield from classic_dispatch.send_control(ctx, t, dst_rank, status_ub, counts, sdma_segment)


# -- combine ----------------------------------------------------------------------------
def combine_send(ctx: KernelContext, t: ClassicTiling, src_rank: int, status_ub: Any,
                 tmp_buff: Any) -> Wait:
    """combine_doubleplane's stage 1 for one source rank."""
    sh = ctx.shmem
    win = t.window
    me, L, W = ctx.rank_id, t.shape.L, t.W
    quota = Quota(_sdma(ctx, t))
    # CombineThresholdNum: every segment's rows from ep_recv_count
    remote = 0
    for le in range(L):
        ctx.loop(1)
        for src in range(W):
            ctx.loop(1)
            begin, end = classic_combine.segment_rows(ctx, t, le, src)
            ctx.scalar(1)  # src_rank != my_rank
            if src != me:
                remote += end - begin
                ctx.scalar(1)
    num, den = remote * t.row_bytes, threshold_den(W, L)
    ctx.scalar(2)
    expand_x = ctx.tensor("expand_x")
    segments = []
    for le in range(L):  # the SDMA loop: each segment's rule, then its rows if SDMA
        ctx.loop(1)
        begin, end = classic_combine.segment_rows(ctx, t, le, src_rank)
        ctx.scalar(RULE_OPS)
        sdma = use_sdma(src_rank, me, end - begin, t.row_bytes, num, den)
        segments.append(sdma)
        if not sdma:
            continue
        for i in range(begin, end):
            ctx.loop(1)
            _src, slot = classic_combine.row_slot(ctx, t, i, src_field=False)
            yield from quota.put(ctx, src_rank, win.data_at(slot), expand_x, i * t.row_bytes,
                                 t.row_bytes)
    for le in range(L):  # the second loop recomputes each segment's rule
        ctx.loop(1)
        begin, end = classic_combine.segment_rows(ctx, t, le, src_rank)
        ctx.scalar(RULE_OPS)
        if not segments[le]:
            yield from classic_combine.send_rows(ctx, t, src_rank, begin, end, status_ub,
                                                 tmp_buff, src_field=False)
    if any(segments) and quota.outstanding > 0:
        yield from quota.quiet()
    for le in range(L):
        ctx.loop(1)
        begin, end = classic_combine.segment_rows(ctx, t, le, src_rank)
        ctx.scalar(RULE_OPS)
        if not segments[le]:
            continue
        for i in range(begin, end):
            ctx.loop(1)
            _src, slot = classic_combine.row_slot(ctx, t, i, src_field=False)
            sh.put_ub(src_rank, win.status_at(slot), status_ub, 32)
        if end > begin:
            yield from sh.quiet()
