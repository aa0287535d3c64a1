"""CamMoeDispatchNormal (csrc/deepep/ops/op_kernel/cam_moe_dispatch_normal.h) as a per-core
program, step by step with the source's names.

Init reads and flips the core's dataState (windowsExp + 950 KiB + core * 512); the data
window is half dataState, after the combine area. Per round (Process 764-786):

- InputToShare (378-475): the round's BS * K pairs split over the cores; per pair the token
  row GM -> UB (INT8: Cast, Abs, ReduceMax, Muls, the casts; the scale after Align32(H);
  the 950 first sets FP overflow to saturate and has its own quantisers),
  FillTriple (rank, token, k), one DataCopyPad of the record into the **own** window at slot
  sendOffset[e] + sendTokenIdx (two queue buffers);
- SetStatus (477-505): PipeBarrier, SyncAll, then the core's experts: a 32 B entry with 1.0
  to the expert's rank at windowsExp + dataState * 500 KiB + (me + le * W) * 32;
- WaitStatus (528-633): the core's entries le * W + src polled until their ReduceSum equals
  their count, then cleared; SyncAll;
- ShareToOutputLongSeq (684-762): per entry, `count` records **pulled** from the source's
  window (GM -> UB), then the triple to expand_idx, the scale, the row to recv_x at
  expert_global_offset + srcrank_in_expert_offset + r_in_srcrank_offset + j;
- with more than one round: SyncAll, core 0 puts a 1.0 round flag to every rank and waits
  for all W (450 KiB + roundMagic * 4 KiB), roundMagic flips, SyncAll.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.dispatch_quant_a5 import quantise_a5
from npusim.kernels.deepep.quant_process import INT8_CASTS, quant_process
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.kernels.deepep.window import STATE_OFFSET
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I32, F32 = np.int32, np.float32
ONE_ENTRY = np.array([1.0] + [0.0] * 7, F32)  # Duplicate(0x3F800000) on the first lane
NO_TRIPLE = np.zeros(3, I32)


def dispatch_program(t: DeepepTiling):
    def program(ctx: KernelContext) -> Wait:
        state = init_data_state(ctx, t)
        round_magic = 0
        for r in range(t.real_round):
            with ctx.phase("input_to_share"):
                yield from input_to_share(ctx, t, state, r)
            with ctx.phase("set_status"):
                yield from set_status(ctx, t, state)
            with ctx.phase("wait_status"):
                counts = yield from wait_status(ctx, t, state, r)
            with ctx.phase("share_to_output"):
                yield from share_to_output(ctx, t, state, r, counts)
            if t.real_round > 1:
                with ctx.phase("round_sync"):
                    yield from ctx.sync_all()
                    if ctx.core_id == 0:
                        magic = state if t.window.round_flags_by_state else round_magic
                        yield from round_status(
                            ctx, t, lambda src, m=magic: t.window.round_status(m, src),
                            ctx.alloc("round_status", 32), ctx.alloc("round_poll", 32 * t.W))
                    round_magic ^= 1
                    yield from ctx.sync_all()

    return program


def init_data_state(ctx: KernelContext, t: DeepepTiling) -> int:
    return flip_core_flag(ctx, t.window.dispatch_state(ctx.core_id))


def flip_core_flag(ctx: KernelContext, at: int) -> int:
    """A core's 0/1 word in the status window, read and flipped (dataState, magic_: which
    half of the window this call uses): the value before the flip."""
    win = ctx.window()
    ctx.dcache.dcci_line(win, at)
    value = int(ctx.gm_read_scalar(win, at, I32))
    ctx.gm_write_scalar(win, at, 0 if value else 1, I32)
    ctx.dcache.dcci_line(win, at)
    return value


def _status_range(ctx: KernelContext, t: DeepepTiling) -> tuple[int, int]:
    return split_to_core(t.E, ctx.num_cores, ctx.core_id)


def _share_queues(ctx: KernelContext, t: DeepepTiling) -> tuple[list[Any], list[Any]]:
    """InputToShare's two-deep UB queues: (token loads, quantised only; the records)."""
    row_ub = align_up(t.record_bytes, 32)
    xin = []
    if t.quant != "bf16":
        xin = [ctx.alloc(f"x_in{p}", align_up(t.H * t.shape.np_dtype.itemsize, 32))
               for p in range(2)]
        outs = [ctx.alloc(f"x_out{p}", row_ub) for p in range(2)]
        ctx.alloc("token_cast_float", 4 * t.H)
        ctx.alloc("token_abs_float", 4 * t.H)
    else:
        outs = [ctx.alloc(f"x_queue{p}", row_ub) for p in range(2)]
    for out in outs:  # the scale lane (garbage on the device) starts as zeros here
        ctx.ub_write(out, t.scale_offset, np.zeros(8, F32), ops=0)
    return xin, outs


def input_to_share(ctx: KernelContext, t: DeepepTiling, state: int, r: int) -> Wait:
    ctx.ub.reset()
    if t.platform == "a5":
        ctx.scalar(1)  # SetCtrlSpr<60, 60>(0): FP overflow saturates
    E, K, H = t.E, t.K, t.H
    item = t.shape.np_dtype.itemsize
    quant = t.quant != "bf16"
    rec = t.record_bytes
    xin, outs = _share_queues(ctx, t)
    off_buf = ctx.alloc("send_offset", align_up(4 * E, 32))
    yield from ctx.wait(ctx.copy_in(off_buf, ctx.tensor("send_data_offset"), 4 * r * E, 4 * E))
    send_offset = ctx.ub_read(off_buf, I32, E, ops=0)
    n_pairs = t.round_tokens(r) * K
    p0, p1 = split_to_core(n_pairs, ctx.num_cores, ctx.core_id)
    if p1 <= p0:
        return
    n = p1 - p0
    ids_buf = ctx.alloc("expert_ids", align_up(4 * n, 32))
    idx_buf = ctx.alloc("send_token_idx", align_up(4 * n, 32))
    first = r * t.per_round_tokens * K + p0
    ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 4 * first, 4 * n)
    ctx.copy_in(idx_buf, ctx.tensor("send_token_idx_small"), 4 * first, 4 * n)
    yield from ctx.pipe_barrier("mte2")
    ids = ctx.ub_read(ids_buf, I32, n, ops=0)
    slot_in = ctx.ub_read(idx_buf, I32, n, ops=0)
    x = ctx.tensor("x")
    win = t.window
    last: list[Any] = [None, None]
    q = 0
    for i in range(n):
        ctx.loop(1)
        e = int(ids[i])
        ctx.scalar(2)
        if e < 0 or e >= E:
            continue
        ctx.scalar(4)  # curExpertCnt, dstExpertOffset, rankGM
        flat = first + i
        token, k = flat // K, flat % K
        p = q & 1
        q += 1
        out = outs[p]
        if last[p] is not None:  # the queue's FreeTensor: its copy out has read it
            yield from ctx.wait(last[p])
        if quant:
            yield from ctx.wait(ctx.copy_in(xin[p], x, token * H * item, H * item,
                                            name="load_token"))
            quantise(ctx, t, xin[p], out)
            yield from ctx.pipe_barrier("vector")
        else:
            yield from ctx.wait(ctx.copy_in(out, x, token * H * item, H * item,
                                            name="load_token"))
        ctx.ub_write(out, t.triple_offset, fill_triple(t, ctx.rank_id, token, k), ops=3)
        at = win.dispatch_data(state, int(send_offset[e]) + int(slot_in[i]))
        last[p] = ctx.copy_out(ctx.window(), at, out, rec, name="input_to_share")


def fill_triple(t: DeepepTiling, rank: int, token: int, k: int) -> np.ndarray:
    """FillTriple's (rank, token, k); zeros in a timing-only run, which computes no row or
    scale either: the record then holds only zeros and backs no window page (a rank's
    records at 4096 tokens, top-8, H 7168 are 236 MB). Only the combine reads the triples,
    and a timing-only combine takes them from the routing (Normal.op_inputs)."""
    if t.timing_only:
        return NO_TRIPLE
    return np.array([rank, token, k], I32)


def quantise(ctx: KernelContext, t: DeepepTiling, xin: Any, out: Any) -> None:
    """QuantProcess: 127 / (max + 1e-12), the three casts (the 950: its own quantisers,
    dispatch_quant_a5.py)."""
    if t.platform == "a5":
        quantise_a5(ctx, t, xin, out)
        return
    quant_process(ctx, t, xin, out, INT8_CASTS, ref.int8_quantize)


def set_status(ctx: KernelContext, t: DeepepTiling, state: int) -> Wait:
    e0, e1 = _status_range(ctx, t)
    n = max(1, e1 - e0)
    status = ctx.alloc("status", align_up(n, 8) * 32)
    ctx.vector("duplicate", 8 * n, I32, writes=[status],
               fn=lambda: status.bytes_at(0, 32 * n).view(F32).reshape(n, 8).__setitem__(
                   slice(None), ONE_ENTRY))
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>: the records are in the window
    yield from ctx.sync_all()
    for i in range(e0, e1):
        ctx.loop(1)
        ctx.scalar(3)  # targetRankId, offset, rankGM
        target = i // t.L
        entry = ctx.rank_id + (i % t.L) * t.W
        ctx.put(target, t.window.dispatch_status(state, entry), status, 32,
                src_offset=32 * (i - e0), name="set_status")
    yield from ctx.pipe_barrier("mte3")


def wait_status(ctx: KernelContext, t: DeepepTiling, state: int, r: int) -> Wait:
    ctx.ub.reset()
    E = t.E
    e0, e1 = _status_range(ctx, t)
    n = e1 - e0
    poll = ctx.alloc("wait_status", max(32 * n, 256))
    ctx.alloc("gather_mask_out", align_up(4 * E, 32))
    ctx.alloc("scalar", 96)
    off_buf = ctx.alloc("recv_offset", align_up(4 * E, 32))
    cnt_buf = ctx.alloc("recv_count", align_up(4 * E, 32))
    ctx.copy_in(off_buf, ctx.tensor("recv_offset"), 4 * r * E, 4 * E)
    ctx.copy_in(cnt_buf, ctx.tensor("recv_count"), 4 * r * E, 4 * E)
    if n <= 0:
        yield from ctx.sync_all()
        return None
    win = t.window
    at = win.dispatch_status(state, e0)
    yield from ctx.wait_until(ctx.window(), at, 32 * n, SumEquals(F32, float(n), stride=32),
                              poll, name="wait_status")
    ctx.vector("duplicate", 8 * n, I32, writes=[poll],
               fn=lambda: poll.bytes_at(0, 32 * n).fill(0))
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(ctx.window(), at, poll, STATE_OFFSET * n, name="clear_status")
    ctx.window().release(at, STATE_OFFSET * n)  # re-armed: the next round puts them again
    yield from ctx.pipe_barrier("mte3")
    yield from ctx.sync_all()
    yield from ctx.pipe_barrier("mte2")
    return (ctx.ub_read(off_buf, I32, E, ops=0), ctx.ub_read(cnt_buf, I32, E, ops=0))


def share_to_output(ctx: KernelContext, t: DeepepTiling, state: int, r: int, counts: Any
                    ) -> Wait:
    if counts is None:
        return
    recv_offset, recv_count = counts
    W, L, E = t.W, t.L, t.E
    e0, e1 = _status_range(ctx, t)
    geo = ctx.alloc("expert_global_offset", align_up(4 * L, 32))
    sro = ctx.alloc("srcrank_in_expert_offset", align_up(4 * E, 32))
    whole = t.platform == "a2"  # ops2 reads every round's offsets with one DataCopyPad
    rso = ctx.alloc("r_in_srcrank_offset", align_up(4 * E * (t.round if whole else 1), 32))
    ctx.copy_in(geo, ctx.tensor("expert_global_offset"), 0, 4 * L)
    ctx.copy_in(sro, ctx.tensor("srcrank_in_expert_offset"), 0, 4 * E)
    rso_gm = ctx.tensor("r_in_srcrank_offset")
    if whole:
        ctx.copy_in(rso, rso_gm, 0, 4 * E * t.round)
    yield from ctx.pipe_barrier("mte2")
    if whole:
        r_all = ctx.ub_read(rso, I32, E * t.round, ops=0).reshape(E, t.round)[:, r].copy()
    else:
        # GetRInSrcrankOffsetForRound: E scalar GM loads (stride round) and UB stores
        r_all = np.array([ctx.gm_read_scalar(rso_gm, 4 * (i * t.round + r), I32)
                          for i in range(E)], I32)
        ctx.ub_write(rso, 0, r_all, ops=E)
    g_off = ctx.ub_read(geo, I32, L, ops=0)
    s_off = ctx.ub_read(sro, I32, E, ops=0)
    rows = ctx.tensor("recv_x")
    payload, scale = t.payload_bytes, t.scale_bytes
    rec = t.record_bytes
    bufs = [ctx.alloc(f"x_queue{p}", align_up(rec, 32)) for p in range(2)]
    last: list[list[Any]] = [[], []]
    q = 0
    win = t.window
    for i in range(e0, e1):
        ctx.loop(1)
        ctx.scalar(10)  # preCount, fromRank, local_e, count, offsets, writeOffset
        pre = int(recv_count[i - 1]) if i else 0
        count = int(recv_count[i]) - pre
        src, le = i % W, i // W
        write = int(g_off[le]) + int(s_off[i]) + int(r_all[le * W + src])
        start = win.dispatch_data(state, int(recv_offset[i]))
        for j in range(count):
            ctx.loop(1)
            p = q & 1
            q += 1
            if last[p]:
                yield from ctx.wait(*last[p])
            buf = bufs[p]
            yield from ctx.wait(ctx.copy_in(buf, ctx.window(src), start + j * win.disp, rec,
                                            name="pull_record"))
            row = write + j
            ops = [ctx.copy_out(ctx.tensor("expand_idx"), 12 * row, buf, 12,
                                src_offset=t.triple_offset, name="expand_idx")]
            if t.quant != "bf16":
                ops.append(ctx.copy_out(ctx.tensor("dynamic_scales"), scale * row, buf, scale,
                                        src_offset=t.scale_offset, name="dynamic_scales"))
            ops.append(ctx.copy_out(rows, row * payload, buf, payload, name="recv_x"))
            last[p] = ops


def round_status(ctx: KernelContext, t: DeepepTiling, flag_at: Callable[[int], int],
                 buf: Any, poll: Any) -> Wait:
    """SetRoundStatus and WaitRoundStatus (core 0): a 1.0 flag at flag_at(me) of every rank,
    then the W flags at flag_at(0) of the own window polled until all are set, cleared.
    The dispatch's and the multi-round combine's are the same steps at their own offsets."""
    W = t.W
    ctx.vector("duplicate", 8, F32, writes=[buf],
               fn=lambda: buf.bytes_at(0, 32).view(F32).fill(1.0))
    yield from ctx.pipe_barrier("vector")
    for i in range(W):
        ctx.scalar(2)
        ctx.put(i, flag_at(ctx.rank_id), buf, 32, name="set_round_status")
    yield from ctx.pipe_barrier("mte3")
    at = flag_at(0)
    yield from ctx.wait_until(ctx.window(), at, 32 * W, SumEquals(F32, 8.0 * W), poll,
                              name="wait_round_status")
    ctx.vector("duplicate", 8 * W, F32, writes=[poll], fn=lambda: poll.bytes_at(0, 32 * W).fill(0))
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(ctx.copy_out(ctx.window(), at, poll, 32 * W, name="clear_round_status"))
    ctx.window().release(at, 32 * W)
