"""combine_classic (hicann/shmem examples/combine/combine_classic/combine_kernel.cpp) as a
per-core program, step by step with the source's names.

block_dim = W AIV cores; core c serves source rank target_src_rank = c. combine_classic
opens frame full_op and calls combine_classic_once: fill status_ub with ones; stage 1
(frame comm_only): for each local expert, the rows of segment (le, c) from ep_recv_count,
each row's slot token * K + k from its assist triplet, an mte_put_nbi of the row into the
owner's window and a quiet, then a 32 B status put and a quiet; a final quiet ends
comm_only. Stage 2, tokens strided over the cores: wait for the K * 8 status ints, reduce
element by element on the scalar unit (acc += float(data[slot][j]) * scale[slot] over k,
x_out = T(acc)), clear the status; barrier_core_soft; end of full_op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.shmem_classic.layout import (
    ASSIST_FIELDS,
    SLOT_INT32,
    UB_TMP_OFFSET,
    ClassicTiling,
)
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

I32, F32 = np.int32, np.float32
STATUS_READY = 1  # COMBINE_STATUS_READY
PHASES = ("send", "reduce")
# scalar slots per (element, k) of the reduction: the id's two range compares, the
# float conversion, the multiply and the add (the loads are charged as loads)
REDUCE_OPS_PER_TERM = 5
REDUCE_OPS_PER_ELEMENT = 2  # acc = 0; x_out = static_cast<T>(acc) (the store is a store)


def combine_program(t: ClassicTiling):
    def program(ctx: KernelContext) -> Wait:
        yield from combine_classic(ctx, t)

    return program


def combine_classic(ctx: KernelContext, t: ClassicTiling, send: Any = None) -> Wait:
    """The kernel; `send` replaces stage 1 (the doubleplane's two planes)."""
    ctx.prof_start("full_op")
    yield from combine_classic_once(ctx, t, send)
    ctx.prof_end("full_op")


def combine_classic_once(ctx: KernelContext, t: ClassicTiling, send: Any = None) -> Wait:
    sh = ctx.shmem
    status_ub = ctx.alloc("status_ub", 32)
    ctx.alloc("pad", UB_TMP_OFFSET - 32)
    tmp_buff = ctx.alloc("tmp_buff", t.ub_size)
    ctx.scalar(10)  # block index, pe, local_expert_num, strides, the window bases
    ctx.loop(SLOT_INT32)
    ctx.ub_write(status_ub, 0, np.full(SLOT_INT32, STATUS_READY, I32), ops=SLOT_INT32)
    with ctx.phase("send"):
        ctx.prof_start("comm_only")
        if ctx.core_id < t.W:  # active_core
            yield from (send or send_back)(ctx, t, ctx.core_id, status_ub, tmp_buff)
        yield from sh.quiet()
        ctx.prof_end("comm_only")
    with ctx.phase("reduce"):
        for token_id in range(ctx.core_id, t.shape.BS, ctx.num_cores):
            ctx.loop(1)
            yield from reduce_token(ctx, t, token_id)
        yield from sh.barrier_core_soft()


def send_back(ctx: KernelContext, t: ClassicTiling, target_src_rank: int, status_ub: Any,
              tmp_buff: Any) -> Wait:
    """Stage 1: every row of segments (le, target_src_rank) back to its token's slot."""
    for le in range(t.shape.L):
        ctx.loop(1)
        begin, end = segment_rows(ctx, t, le, target_src_rank)
        yield from send_rows(ctx, t, target_src_rank, begin, end, status_ub, tmp_buff)


def segment_rows(ctx: KernelContext, t: ClassicTiling, le: int, src: int) -> tuple[int, int]:
    """CombineSegmentBegin / End of segment le * W + src from ep_recv_count."""
    ep_recv_count = ctx.tensor("ep_recv_count")
    segment = le * t.W + src
    ctx.scalar(1)
    begin = 0 if segment == 0 else int(ctx.gm_read_scalar(ep_recv_count, 4 * (segment - 1), I32))
    return begin, int(ctx.gm_read_scalar(ep_recv_count, 4 * segment, I32))


def row_slot(ctx: KernelContext, t: ClassicTiling, i: int, src_field: bool = True
             ) -> tuple[int, int]:
    """Row i's (src_rank, slot = token_id * k + topk_id) from its assist triplet; the
    doubleplane kernel loads only token_id and topk_id (src_rank -1: the core's peer)."""
    assist = ctx.tensor("assist_info")
    src_rank = int(ctx.gm_read_scalar(assist, 4 * i * ASSIST_FIELDS, I32)) if src_field else -1
    token_id, topk_id = (int(ctx.gm_read_scalar(assist, 4 * (i * ASSIST_FIELDS + f), I32))
                         for f in (1, 2))
    ctx.scalar(2)  # slot = token_id * k + topk_id
    return src_rank, token_id * t.shape.K + topk_id


def send_rows(ctx: KernelContext, t: ClassicTiling, peer: int, begin: int, end: int,
              status_ub: Any, tmp_buff: Any, src_field: bool = True) -> Wait:
    """Rows [begin, end): per row an mte_put_nbi into its slot and a quiet, then a 32 B
    status put and a quiet."""
    sh = ctx.shmem
    win = t.window
    expand_x = ctx.tensor("expand_x")
    for i in range(begin, end):
        ctx.loop(1)
        src_rank, slot = row_slot(ctx, t, i, src_field)
        pe = src_rank if src_field else peer
        yield from sh.mte_put_nbi(pe, win.data_at(slot), expand_x, i * t.row_bytes,
                                  t.row_bytes, tmp_buff, t.ub_size, t.elem)
        yield from sh.quiet()
        sh.put_ub(pe, win.status_at(slot), status_ub, 32)
        yield from sh.quiet()


def reduce_token(ctx: KernelContext, t: ClassicTiling, token_id: int) -> Wait:
    """Stage 2 for one token: its K * 8 status ints, the scalar reduction, the clear."""
    sh = ctx.shmem
    win = t.window
    dc = ctx.dcache
    K, H, E = t.shape.K, t.shape.H, t.shape.E
    window = ctx.window()
    for topk_id in range(K):
        ctx.loop(1)
        slot = token_id * K + topk_id
        for i in range(SLOT_INT32):
            ctx.loop(1)
            yield from sh.signal_wait_until(win.status_at(slot) + 4 * i, "eq", STATUS_READY)

    # for j < h: acc = 0; for k: if id valid: acc += float(data[slot][j]) * scale[slot]
    ids_at, scales_at = 4 * token_id * K, 4 * token_id * K
    ids = dc.load_run(ctx.tensor("expert_ids"), ids_at, K, I32)  # their first loads
    ctx.scalar((H - 1) * K)  # the other H - 1 loads of each id hit the cache
    ctx.loop(H * (K + 1))
    ctx.scalar(H * (K * 2 + REDUCE_OPS_PER_ELEMENT))  # range compares, acc = 0, the cast
    valid = (ids >= 0) & (ids < E)
    scales = None
    if valid.any():
        scales = dc.load_run(ctx.tensor("expert_scales"), scales_at, K, F32)
        ctx.scalar(H * int(valid.sum()) - K)
    acc = np.zeros(H, F32)
    for topk_id in range(K):
        if not valid[topk_id]:
            continue
        slot = token_id * K + topk_id
        data = dc.load_run(window, win.data_at(slot), H, t.np_dtype)
        ctx.scalar(H * (REDUCE_OPS_PER_TERM - 2))  # the conversion, multiply and add
        acc = (acc + data.astype(F32) * scales[topk_id]).astype(F32)
    dc.store_run(ctx.tensor("x_out"), token_id * t.row_bytes, acc.astype(t.np_dtype))

    for topk_id in range(K):  # status_base[slot * 8 + i] = 0
        ctx.loop(1 + SLOT_INT32)
        dc.store_run(window, win.status_at(token_id * K + topk_id), np.zeros(SLOT_INT32, I32))
