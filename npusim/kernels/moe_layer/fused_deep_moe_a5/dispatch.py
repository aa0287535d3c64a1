"""The dispatch half of DispatchMxGmm1Swiglu (G1 = fused_deep_moe/gemm/kernel/
dispatch_mx_gmm1_swiglu.h): odd AIVs send (SendCoreFunc, phase dispatch_send), even AIVs
receive (RecvCoreFunc, phase dispatch_recv), one of each per AIC (isSendCore /
isRecvCore = aivIdx odd / even, G1 262-266).

Send, per core a share of the experts then a share of the (token, k) pairs:
CalAndSendTokenCount (G1 588-641) counts each expert's pairs (CalExpandxIdx's vector
compare and ReduceSum over the pairs) and puts a 32 B status entry (flag 1.0f, count)
into the expert's rank; SendToMoeExpert (G1 664-757) walks the pairs local-expert slot
by slot, and per pair loads the bf16 token, quantises it to MX (QuantDynamicMx), puts the
H FP8 bytes into the receiver's slot, then (PipeBarrier MTE3) the scales with the token
flag after them; last, its pairs' indices in their slots to expand_idx.

Receive (G1 1047-1184): RecvCount polls the W * E_loc status entries until every flag is
up; per local expert the expert's rows split over the receive cores (the start rotating
by the rows), RecvToken spins on each row's flag, copies the record into UB, clears the
flag and stores the codes to x1 and the scales to x1_scale; then an AtomicAdd of
{vToCFlag, group, -, rows} into the group line tells the AIC. Last, ep_send_count: the
running count over (local expert, source) entries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import note_compute, note_remote
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mega_moe.mx import BF16
from npusim.kernels.moe_layer.fused_deep_moe_a5.softsync import SLEEP_CYCLES, write_int
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import A5Tiling
from npusim.kernels.moe_layer.fused_deep_moe_a5.window import A5Window
from npusim.kernels.moe_layer.fused_deep_moe_base.window import (
    STATE_OFFSET,
    STATUS_ONE,
    TOKEN_FLAG_1,
    V_TO_C_FLAG_1,
)
from npusim.kernels.quant import mx_quantize_bf16
from npusim.runtime.conditions import AllEqual, SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align_up

I32, F32 = np.int32, np.float32


def quant_dynamic_mx(ctx: KernelContext, src: Any, dst: Any, n: int, scales: int,
                     mode: str, fn: Any) -> Any:
    """QuantDynamicMx (G1 522-541) of n bf16 in UB: ComputeMaxExp, ComputeScale,
    ComputeFp8Data; `fn` writes the codes and scales."""
    return note_compute(ctx, ctx.vector_seq(
        "quant_dynamic_mx", [("compute_max_exp", n, BF16), ("compute_scale", scales, np.uint16),
                             ("compute_fp8_data", n, F32)],
        reads=[src], writes=[dst], fn=fn), "vector")


def cal_expand_idx(ctx: KernelContext, n: int) -> None:
    """CalExpandxIdx over n pairs (G1 566-586): Duplicate, Sub, Abs, Mins, ReduceSum."""
    if n:
        note_compute(ctx, ctx.vector_seq(
            "cal_expandx_idx", [("duplicate", n, I32), ("sub", n, I32), ("abs", n, F32),
                                ("mins", n, I32), ("reduce_sum", n, F32)]), "vector")


# --------------------------------------------------------------------------- send
def send_core(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int) -> Wait:
    """SendCoreFunc: the expert ids to UB, the counts, then the tokens."""
    ids_t, x_t = ctx.tensor("expert_ids"), ctx.tensor("x")
    ids_buf = ctx.alloc("expert_ids", align_up(t.routes * 4, 32))
    yield from ctx.wait(ctx.copy_in(ids_buf, ids_t, 0, t.routes * 4))
    ids = ids_buf.view(I32, t.routes).copy()
    yield from _send_token_count(ctx, t, w, core, ids)
    yield from ctx.drain()
    yield from _send_to_moe_expert(ctx, t, w, core, ids, x_t)
    yield from ctx.drain()


def _send_token_count(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int,
                      ids: np.ndarray) -> Wait:
    """CalAndSendTokenCount: this core's experts' status entries to their ranks."""
    lo, hi = split_to_core(t.shape.E, t.block_dim, core)
    if lo >= hi:
        return
    status = ctx.alloc("status", 32 * (hi - lo))
    for e in range(lo, hi):
        cal_expand_idx(ctx, t.routes)
        ctx.ub_write(status, 32 * (e - lo), np.array(
            [STATUS_ONE, int(np.count_nonzero(ids == e)), 0, 0, 0, 0, 0, 0], I32))
    yield from ctx.pipe_barrier("vector")
    for e in range(lo, hi):
        dst, le = divmod(e, t.L)
        op = ctx.put(dst, w.dispatch_status(le, ctx.rank_id), status, 32,
                     src_offset=32 * (e - lo), name="send_token_count")
        if dst != ctx.rank_id:
            note_remote(ctx, op, "dispatch")


def _send_to_moe_expert(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int,
                        ids: np.ndarray, x_t: Any) -> Wait:
    """SendToMoeExpert: this core's pairs, local-expert slot by slot, double-buffered."""
    lo, hi = split_to_core(t.routes, t.block_dim, core)
    if lo >= hi:
        return
    row = t.H * 2
    ins = [ctx.alloc(f"x_in{i}", row) for i in range(2)]
    outs = [ctx.alloc(f"y_out{i}", align_up(t.record, 32)) for i in range(2)]
    expand = np.zeros(hi - lo, I32)
    loads: list[Any] = [None, None]
    sends: list[Any] = [None, None]
    sent = 0
    for group in range(t.L):
        for pair in range(lo, hi):
            e = int(ids[pair])
            if e < 0 or e % t.L != group:
                continue
            p = 0 if sent & 1 else 1
            sent += 1
            cal_expand_idx(ctx, pair)
            i = int(np.count_nonzero(ids[:pair] == e))
            expand[pair - lo] = i
            if sends[p] is not None:  # MTE3_MTE2: the buffer's last put has left UB
                yield from ctx.wait(sends[p])
            if loads[p] is not None:  # V_MTE2: its quantisation is done
                yield from ctx.wait(loads[p])
            yield from ctx.wait(ctx.copy_in(ins[p], x_t, (pair // t.K) * row, row,
                                            name="load_token"))

            def quantize(src: Any = ins[p], dst: Any = outs[p]) -> None:
                codes, scales = mx_quantize_bf16(src.view(BF16, t.H).reshape(1, t.H),
                                                 t.mode, zero_subnormal_blocks=True)
                raw = dst.view(np.uint8, t.record)
                raw[:t.H] = codes[0]
                raw[t.H:t.H + t.x1_scales] = scales[0]
                raw[t.H + t.x1_scales:t.H + t.x1_scales + 4] = np.array(
                    [TOKEN_FLAG_1], I32).view(np.uint8)
            loads[p] = quant_dynamic_mx(ctx, ins[p], outs[p], t.H, t.x1_scales, t.mode,
                                        quantize)
            ctx.scalar(1)  # SetValue(0, tokenFlag)
            yield from ctx.wait(loads[p])
            dst, le = divmod(e, t.L)
            at = w.token(dst, ctx.rank_id, le, i)
            data = ctx.put(dst, at, outs[p], t.H, name="send_token")
            yield from ctx.pipe_barrier("mte3")
            sends[p] = ctx.put(dst, at + t.H, outs[p], t.scale_flag_bytes, src_offset=t.H,
                               name="send_scale_flag")
            if dst != ctx.rank_id:
                note_remote(ctx, data, "dispatch")
                note_remote(ctx, sends[p], "dispatch")
    yield from ctx.drain()
    idx = ctx.alloc("expand_idx", align_up(4 * (hi - lo), 32))
    ctx.ub_write(idx, 0, expand, ops=hi - lo)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("expand_idx"), 4 * lo, idx, 4 * (hi - lo),
                                     name="store_expand_idx"))


# --------------------------------------------------------------------------- receive
def recv_core(ctx: KernelContext, t: A5Tiling, w: A5Window, core: int) -> Any:
    """RecvCoreFunc; returns the rows of each local expert (every AIV reads them later
    from the group lines; the receive core knows them from the status)."""
    n = t.senders
    status = ctx.alloc("status", align_up(32 * n, 256))
    yield from ctx.wait_until(ctx.window(), w.dispatch_status(0, 0), 32 * n,
                              SumEquals(F32, float(n), stride=32), status,
                              strided=Strided(n, 32, STATE_OFFSET - 32, 0),
                              name="recv_count", check_ns=ctx.check_ns(n, 2))
    entries = status.view(I32, 8 * n).reshape(n, 8)
    counts = entries[:, 1].astype(np.int64)  # entry j = le * W + src
    record = ctx.alloc("record", align_up(t.record, 32))
    line = ctx.alloc("notify_cube", 32)
    x1, x1s = ctx.tensor("x1"), ctx.tensor("x1_scale")
    start = before = 0
    store: Any = None
    for g in range(t.L):
        ctx.vector("gather_mask", n, F32, reads=[status])
        ctx.vector("reduce_sum", (g + 1) * t.W, F32)
        yield from ctx.pipe_barrier("vector")
        mine = counts[g * t.W:(g + 1) * t.W]
        m = int(mine.sum())
        new_idx = (core + t.block_dim - start) % t.block_dim
        lo, hi = split_to_core(m, t.block_dim, new_idx)
        for row in range(lo, hi):
            src = int(np.searchsorted(np.cumsum(mine), row, side="right"))
            i = row - int(mine[:src].sum())
            at = w.token(ctx.rank_id, src, g, i)
            yield from ctx.spin_until(ctx.window(), at + t.H + t.x1_scales,
                                      AllEqual(I32, TOKEN_FLAG_1, stride=32), 32, SLEEP_CYCLES,
                                      name="wait_token_flag")
            if store is not None:  # MTE3_MTE2: the record buffer has been stored
                yield from ctx.wait(store)
            yield from ctx.wait(ctx.copy_in(record, ctx.window(), at, t.record,
                                            name="recv_token"))
            write_int(ctx, at + t.H + t.x1_scales, 0)
            dst_row = before + row
            ctx.copy_out(x1s, dst_row * t.x1_scales, record, t.x1_scales, src_offset=t.H,
                         name="store_x1_scale")
            store = ctx.copy_out(x1, dst_row * t.H, record, t.H, name="store_x1")
        yield from ctx.drain()
        ctx.ub_write(line, 0, np.array([V_TO_C_FLAG_1, g, 0, hi - lo, 0, 0, 0, 0], I32))
        ctx.set_atomic_add(I32)
        op = ctx.copy_out(ctx.window(), w.group_line(g), line, 32, name="notify_cube")
        ctx.set_atomic_none()
        yield from ctx.wait(op)
        start = (start + m) % t.block_dim
        before += m
    yield from _store_send_counts(ctx, t, core, counts)
    return [int(counts[g * t.W:(g + 1) * t.W].sum()) for g in range(t.L)]


def _store_send_counts(ctx: KernelContext, t: A5Tiling, core: int, counts: np.ndarray
                       ) -> Wait:
    """ep_send_count[j]: the running count through entry j, this core's share."""
    lo, hi = split_to_core(t.senders, t.block_dim, core)
    if lo >= hi:
        return
    ctx.vector("reduce_sum", lo + 1, F32)
    yield from ctx.pipe_barrier("vector")
    run = np.cumsum(counts).astype(I32)[lo:hi]
    buf = ctx.alloc("send_counts", align_up(4 * (hi - lo), 32))
    ctx.ub_write(buf, 0, run, ops=hi - lo)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("ep_send_count"), 4 * lo, buf, 4 * (hi - lo),
                                     name="store_ep_send_count"))

