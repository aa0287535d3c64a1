"""dispatch_classic (hicann/shmem examples/dispatch/dispatch_classic/dispatch_kernel.cpp) as
a per-core program, step by step with the source's names.

block_dim = W AIV cores; core c serves destination rank dst_rank = c. Stage 1 (every
core) scans expert_ids five times on the scalar unit: counts per local expert, then per
(token, k) routed to dst_rank an mte_put_nbi of the row (GM -> UB -> dst's window) and a
quiet, then the assist triplet as three signal_op SETs and a quiet, then a 32 B ready put
per slot and a quiet, then per local expert a 32 B count entry [1, count, 0..] and a
quiet; end of frame comm_only; barrier_core_soft. Stage 2 (core 0) waits for every count
entry and writes the cumulative ep_recv_count and expert_token_nums; barrier. Stage 3
(core 0) compacts the window into expand_x and assist_info element by element with
scalar GM loads and stores, after waiting for each slot's eight ready ints, and re-arms
the flags (ready -> 0, count -> -1); barrier; end of frame full_op.

Scalar work is charged per C++ statement of the loops (one issue slot each, a loop
iteration `scalar.loop_cycles`), GM loads and stores through the data cache
(npusim.runtime.dcache).
"""

from __future__ import annotations

from collections.abc import Callable
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

I32 = np.int32
READY_VALUE = 1  # DISPATCH_READY_VALUE
COUNT_READY = 1  # DISPATCH_COUNT_READY
COUNT_INIT = -1  # DISPATCH_COUNT_INIT
PHASES = ("send", "counts", "compact")


def dispatch_program(t: ClassicTiling):
    def program(ctx: KernelContext) -> Wait:
        yield from dispatch_classic(ctx, t)

    return program


def dispatch_classic(ctx: KernelContext, t: ClassicTiling, send: Any = None) -> Wait:
    """The kernel; `send` replaces stage 1 (the doubleplane's two planes)."""
    sh = ctx.shmem
    status_ub = ctx.alloc("status_ub", 32)
    ctx.alloc("pad", UB_TMP_OFFSET - 32)
    tmp_buff = ctx.alloc("tmp_buff", t.ub_size)
    ctx.scalar(12)  # block index, pe, local_expert_num, the window bases
    with ctx.phase("send"):
        ctx.prof_start("full_op")
        ctx.prof_start("comm_only")
        if ctx.core_id < t.W:  # active_core
            yield from (send or stage1)(ctx, t, ctx.core_id, status_ub, tmp_buff)
        yield from sh.quiet()
        ctx.prof_end("comm_only")
        yield from sh.barrier_core_soft()
    with ctx.phase("counts"):
        if ctx.core_id == 0:
            yield from stage2(ctx, t)
        yield from sh.barrier_core_soft()
    with ctx.phase("compact"):
        if ctx.core_id == 0:
            yield from stage3(ctx, t)
        yield from sh.barrier_core_soft()
        ctx.prof_end("full_op")


def _routed(ctx: KernelContext, t: ClassicTiling, dst_rank: int) -> Any:
    """One scan of expert_ids: per (token, k), load the id, route_dst_rank = id / L and
    compare; yields (flat, expert_id) of the pairs routed to dst_rank."""
    ids = ctx.tensor("expert_ids")
    L = t.shape.L
    for flat in range(t.shape.BS * t.shape.K):
        ctx.loop(1)
        expert_id = int(ctx.gm_read_scalar(ids, 4 * flat, I32))
        ctx.scalar(2)  # route_dst_rank = expert_id / local_expert_num; != dst_rank
        if expert_id // L == dst_rank:
            yield flat, expert_id


Keep = Callable[[int], bool] | None  # which local experts' segments a piece serves


def stage1(ctx: KernelContext, t: ClassicTiling, dst_rank: int, status_ub: Any,
           tmp_buff: Any) -> Wait:
    segment_counts = count_segments(ctx, t, dst_rank)
    yield from put_payloads(ctx, t, dst_rank, tmp_buff)
    yield from send_control(ctx, t, dst_rank, status_ub, segment_counts)


def count_segments(ctx: KernelContext, t: ClassicTiling, dst_rank: int) -> list[int]:
    """The first scan: segment_counts[le] of the pairs routed to dst_rank."""
    L = t.shape.L
    segment_counts = [0] * L
    ctx.loop(L)
    ctx.scalar(2 * L)  # segment_counts[le] = slot_offsets[le] = 0
    for _flat, expert_id in _routed(ctx, t, dst_rank):
        segment_counts[expert_id % L] += 1
        ctx.scalar(2)  # dst_local_expert = expert_id % L; ++segment_counts
    return segment_counts


def kept(ctx: KernelContext, t: ClassicTiling, dst_rank: int, keep: Keep) -> Any:
    """_routed, and with `keep` (the doubleplane's sdma_flags test, a slot per pair) only
    the pairs of the segments kept."""
    L = t.shape.L
    for flat, expert_id in _routed(ctx, t, dst_rank):
        if keep is not None:
            ctx.scalar(1)  # if (sdma_flags[dst_local_expert] ...) continue
            if not keep(expert_id % L):
                continue
        yield flat, expert_id


def put_payloads(ctx: KernelContext, t: ClassicTiling, dst_rank: int, tmp_buff: Any,
                 keep: Keep = None) -> Wait:
    """Payload: one mte_put_nbi of the row and a quiet per routed (token, k)."""
    sh = ctx.shmem
    win = t.window
    L, K, me = t.shape.L, t.shape.K, ctx.rank_id
    x = ctx.tensor("x")
    slot_offsets = [0] * L
    ctx.loop(L)
    for flat, expert_id in kept(ctx, t, dst_rank, keep):
        token_id, le = flat // K, expert_id % L
        slot = slot_offsets[le]
        slot_offsets[le] += 1
        ctx.scalar(5)  # token_id, dst_local_expert, slot++, data_block, global_slot
        gslot = win.global_slot(me, le, slot)
        yield from sh.mte_put_nbi(dst_rank, win.payload_at(gslot), x, token_id * t.row_bytes,
                                  t.row_bytes, tmp_buff, t.ub_size, t.elem)
        yield from sh.quiet()


def send_control(ctx: KernelContext, t: ClassicTiling, dst_rank: int, status_ub: Any,
                 segment_counts: list[int], keep: Keep = None) -> Wait:
    """Assist signals, ready puts and count entries of the segments kept (all: classic).
    With `keep` the ready puts come only if some assist was written, as the doubleplane
    source nests them."""
    wrote = signal_assist(ctx, t, dst_rank, keep)
    if wrote:
        yield from ctx.shmem.quiet()
    if wrote or keep is None:
        yield from put_ready(ctx, t, dst_rank, status_ub, keep)
    yield from put_counts(ctx, t, dst_rank, status_ub, segment_counts, keep)


def signal_assist(ctx: KernelContext, t: ClassicTiling, dst_rank: int, keep: Keep = None
                  ) -> bool:
    """SignalDispatchAssist: three signal_op SETs [my_rank, token_id, topk_id] per pair;
    returns whether any was written."""
    sh = ctx.shmem
    win = t.window
    L, K, me = t.shape.L, t.shape.K, ctx.rank_id
    slot_offsets = [0] * L
    ctx.loop(L)
    ctx.scalar(L)
    wrote = False
    for flat, expert_id in kept(ctx, t, dst_rank, keep):
        token_id, topk_id, le = flat // K, flat % K, expert_id % L
        slot = slot_offsets[le]
        slot_offsets[le] += 1
        ctx.scalar(6)  # token_id, topk_id, dst_local_expert, slot++, data_block, global_slot
        at = win.assist_at(win.global_slot(me, le, slot))
        for j, value in enumerate((me, token_id, topk_id)):
            ctx.scalar(1)  # the signal address
            sh.signal_op(dst_rank, at + 4 * j, value)
        wrote = True
    return wrote


def put_ready(ctx: KernelContext, t: ClassicTiling, dst_rank: int, status_ub: Any,
              keep: Keep = None) -> Wait:
    """DispatchFillReadyStatus, then a 32 B put per slot and a quiet."""
    sh = ctx.shmem
    win = t.window
    L, me = t.shape.L, ctx.rank_id
    slot_offsets = [0] * L
    ctx.loop(L)
    ctx.scalar(L)
    ctx.loop(SLOT_INT32)
    ctx.ub_write(status_ub, 0, np.full(SLOT_INT32, READY_VALUE, I32), ops=SLOT_INT32)
    wrote = False
    for _flat, expert_id in kept(ctx, t, dst_rank, keep):
        le = expert_id % L
        slot = slot_offsets[le]
        slot_offsets[le] += 1
        ctx.scalar(4)  # dst_local_expert, slot++, data_block, global_slot
        sh.put_ub(dst_rank, win.ready_at(win.global_slot(me, le, slot)), status_ub, 32)
        wrote = True
    if wrote:
        yield from sh.quiet()


def put_counts(ctx: KernelContext, t: ClassicTiling, dst_rank: int, status_ub: Any,
               segment_counts: list[int], keep: Keep = None) -> Wait:
    """Per local expert kept, DispatchFillCountStatus [1, count, 0 ...], a put, a quiet."""
    sh = ctx.shmem
    me = ctx.rank_id
    for le in range(t.shape.L):
        ctx.loop(1)
        if keep is not None:
            ctx.scalar(1)  # if (sdma_flags[dst_local_expert] ...) continue
            if not keep(le):
                continue
        ctx.scalar(1)  # status_segment = le * pe_size + my_rank
        entry = np.zeros(SLOT_INT32, I32)
        entry[0], entry[1] = COUNT_READY, segment_counts[le]
        ctx.loop(SLOT_INT32 - 2)
        ctx.ub_write(status_ub, 0, entry, ops=SLOT_INT32)
        sh.put_ub(dst_rank, t.window.count_at(le, me), status_ub, 32)
        yield from sh.quiet()


def stage2(ctx: KernelContext, t: ClassicTiling) -> Wait:
    """Core 0: signal_wait_until(count == 1) per (le, src), cumulative ep_recv_count and
    expert_token_nums."""
    sh = ctx.shmem
    win = t.window
    W, L = t.W, t.shape.L
    ep_recv_count = ctx.tensor("ep_recv_count")
    expert_token_nums = ctx.tensor("expert_token_nums")
    running = 0
    for le in range(L):
        ctx.loop(1)
        expert_count = 0
        for src in range(W):
            ctx.loop(1)
            ctx.scalar(1)  # segment = le * pe_size + src_rank
            at = win.count_at(le, src)
            yield from sh.signal_wait_until(at, "eq", COUNT_READY)
            count = int(ctx.gm_read_scalar(ctx.window(), at + 4, I32))
            running += count
            expert_count += count
            ctx.scalar(2)  # running += count; expert_count += count
            ctx.gm_write_scalar(ep_recv_count, 4 * (le * W + src), running, I32)
        ctx.gm_write_scalar(expert_token_nums, 4 * le, expert_count, I32)


def stage3(ctx: KernelContext, t: ClassicTiling) -> Wait:
    """Core 0: compact the window into expand_x / assist_info ordered by (le, src), by
    scalar GM loads and stores, after each slot's eight ready ints; re-arm the flags."""
    sh = ctx.shmem
    win = t.window
    dc = ctx.dcache
    s = t.shape
    W, L, H = t.W, s.L, s.H
    window = ctx.window()
    ep_recv_count = ctx.tensor("ep_recv_count")
    expand_x = ctx.tensor("expand_x")
    assist_info = ctx.tensor("assist_info")
    for le in range(L):
        ctx.loop(1)
        for src in range(W):
            ctx.loop(1)
            segment = le * W + src
            begin = 0 if segment == 0 else int(ctx.gm_read_scalar(ep_recv_count,
                                                                  4 * (segment - 1), I32))
            count = int(ctx.gm_read_scalar(window, win.count_at(le, src) + 4, I32))
            ctx.scalar(3)  # segment, begin, data_block
            for i in range(count):
                ctx.loop(1)
                ctx.scalar(1)  # global_slot
                gslot = win.global_slot(src, le, i)
                ready = win.ready_at(gslot)
                for r in range(SLOT_INT32):
                    ctx.loop(1)
                    yield from sh.signal_wait_until(ready + 4 * r, "eq", READY_VALUE)
                row = begin + i
                # expand_x[(begin + i) * h + j] = payload_base[global_slot * stride + j]
                ctx.loop(H)
                values = dc.load_run(window, win.payload_at(gslot), H, t.np_dtype)
                dc.store_run(expand_x, row * t.row_bytes, values)
                ctx.loop(ASSIST_FIELDS)
                triplet = dc.load_run(window, win.assist_at(gslot), ASSIST_FIELDS, I32)
                dc.store_run(assist_info, row * 4 * ASSIST_FIELDS, triplet)
                ctx.loop(SLOT_INT32)
                dc.store_run(window, ready, np.zeros(SLOT_INT32, I32))
            ctx.loop(SLOT_INT32)
            dc.store_run(window, win.count_at(le, src), np.full(SLOT_INT32, COUNT_INIT, I32))
