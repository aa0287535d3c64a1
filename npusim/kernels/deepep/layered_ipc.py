"""The layered dispatch's intra-server side: Win2Ipc (arrived tokens to the IPC areas of
their experts' ranks over HCCS), SetIpcFlag / WaitIpcFlag, Ipc2Out and CleanUp."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.deepep.layered_arrivals import Arrivals
from npusim.kernels.deepep.layered_layout import (
    EXP_TOKEN_COUNT_FLAG_CNT,
    FLAG_SIZE,
    IPC_BUFF_ALIGN,
    IPC_FLAG_OFFSET,
    IPC_TOKEN_CNT_OFFSET,
    MAX_BS_NUM,
    SERVER_RANK_SIZE,
    STATE_OFFSET,
    UB_32B_ALIGN,
)
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.runtime.conditions import AtLeast, Wait
from npusim.runtime.context import KernelContext
from npusim.runtime.transfer import Strided
from npusim.units import align_up, ceil_div

I32, I64, U32, U64 = np.int32, np.int64, np.uint32, np.uint64


def win2ipc(ctx: KernelContext, t: LayeredTiling, buf_id: int) -> Wait:
    """Win2Ipc: (cores - serverNum - 1) / serverNum cores per source server relay its
    tokens, each core every coresPerServer-th one, and share the counts."""
    S, L = t.server_num, t.shape.L
    cps = (t.cores - S - 1) // S  # coresPerServer
    logic = ctx.core_id - S - 1
    if logic >= cps * S:
        return
    from_server = logic // cps
    per_server = SERVER_RANK_SIZE * L
    ctx.ub.reset()
    cnt_buf = ctx.alloc("token_num_per_exp", per_server * EXP_TOKEN_COUNT_FLAG_CNT * 4)
    ctx.vector("duplicate", per_server * EXP_TOKEN_COUNT_FLAG_CNT, I32, writes=[cnt_buf])
    one = ctx.alloc("local_ub", align_up(t.struct_len, IPC_BUFF_ALIGN))
    arrivals = Arrivals(ctx, t, buf_id, from_server)
    counts = yield from win2ipc_tokens(ctx, t, arrivals, one, logic, cps, from_server)
    yield from win2ipc_counts(ctx, t, cnt_buf, counts, logic, cps, from_server)


def win2ipc_tokens(ctx: KernelContext, t: LayeredTiling, arrivals: Arrivals, one: Any,
                   logic: int, cps: int, from_server: int) -> Wait:
    """Win2Ipc's first part: get the arrived tokens, count them per expert of this server,
    and put the core's share to the IPC area of each expert's rank; returns the counts."""
    L = t.shape.L
    server_id = ctx.rank_id // SERVER_RANK_SIZE
    lr = ctx.rank_id % SERVER_RANK_SIZE
    per_server = SERVER_RANK_SIZE * L
    exp_start = server_id * per_server
    counts = np.zeros(per_server, np.int64)
    w = t.window
    tok = 0
    while True:
        just_exp = tok % cps != logic % cps
        got = yield from arrivals.next(tok, just_exp, one)
        if not got:
            break
        ids = one.bytes_at(0 if just_exp else t.exp_offset, 4 * t.shape.K).view(I32)
        for k in range(t.shape.K):
            ctx.loop(1)
            ctx.scalar(3)
            e = int(ids[k])
            if not exp_start <= e < exp_start + per_server:
                continue
            j = e % per_server
            slot = int(counts[j])
            counts[j] += 1
            if just_exp:
                continue
            ctx.scalar(6)
            target = server_id * SERVER_RANK_SIZE + j // L
            at = w.ipc_data(e % L, from_server * SERVER_RANK_SIZE + lr) + slot * t.struct_len
            yield from ctx.drain()
            yield from ctx.wait(ctx.put(target, at, one, t.struct_len, name="win2ipc"))
            yield from ctx.drain()
        tok += 1
    return counts


def win2ipc_counts(ctx: KernelContext, t: LayeredTiling, cnt_buf: Any, counts: np.ndarray,
                   logic: int, cps: int, from_server: int) -> Wait:
    """Win2Ipc's second part: the per-expert counts (tokenNumPerExp), one 32 B line each,
    to the token-count area of each expert's rank, the experts split over the cores."""
    L, W, w = t.shape.L, t.W, t.window
    server_id = ctx.rank_id // SERVER_RANK_SIZE
    lr = ctx.rank_id % SERVER_RANK_SIZE
    per_server = SERVER_RANK_SIZE * L
    exp_start = server_id * per_server
    flat = np.zeros((per_server, EXP_TOKEN_COUNT_FLAG_CNT), I32)
    flat[:, 0] = counts
    yield from ctx.drain()
    ctx.ub_write(cnt_buf, 0, flat.ravel(), ops=0)
    batches = ceil_div(per_server, cps)
    for b in range(batches):
        e = exp_start + b * cps + logic % cps
        if e >= exp_start + per_server:
            break
        ctx.scalar(6)
        j = e % per_server
        target = server_id * SERVER_RANK_SIZE + j // L
        at = (w.ipc(IPC_TOKEN_CNT_OFFSET) + ((e % L) * W + from_server * SERVER_RANK_SIZE + lr)
              * UB_32B_ALIGN)
        yield from ctx.drain()
        yield from ctx.wait(ctx.put(target, at, cnt_buf, UB_32B_ALIGN, src_offset=j * 32,
                                    name="win2ipc_count"))
        yield from ctx.drain()


def set_ipc_flag(ctx: KernelContext, t: LayeredTiling, magic: int) -> Wait:
    if ctx.core_id >= SERVER_RANK_SIZE:
        return
    buf = ctx.alloc("ipc_flag", UB_32B_ALIGN)
    ctx.ub_write(buf, 0, np.array([magic, 0, 0, 0], U64))  # the rest: whatever UB held
    target = ctx.rank_id // SERVER_RANK_SIZE * SERVER_RANK_SIZE + ctx.core_id
    at = t.window.ipc(IPC_FLAG_OFFSET) + ctx.rank_id % SERVER_RANK_SIZE * UB_32B_ALIGN
    yield from ctx.wait(ctx.put(target, at, buf, UB_32B_ALIGN, name="set_ipc_flag"))
    yield from ctx.drain()


def wait_ipc_flag(ctx: KernelContext, t: LayeredTiling, magic: int) -> Wait:
    if ctx.core_id >= SERVER_RANK_SIZE:
        return
    buf = ctx.alloc("ipc_wait", UB_32B_ALIGN)
    at = t.window.ipc(IPC_FLAG_OFFSET) + ctx.core_id * UB_32B_ALIGN
    yield from ctx.wait_until(ctx.window(), at, UB_32B_ALIGN,
                              AtLeast(U64, magic, stride=UB_32B_ALIGN), buf,
                              name="wait_ipc_flag")


def ipc2out(ctx: KernelContext, t: LayeredTiling) -> Wait:
    L, W, rec, H = t.shape.L, t.W, t.struct_len, t.shape.H
    cpe = t.cores // L  # coresPerExp
    if ctx.core_id >= cpe * L:
        return
    ctx.ub.reset()
    w, win = t.window, ctx.window()
    cur, local = ctx.core_id // cpe, ctx.core_id % cpe
    per, rem = W // cpe, W % cpe
    mine = per + (1 if local < rem else 0)
    first = cur * W + local * per + min(local, rem)
    cnt_ub = ctx.alloc("token_cnt", align_up(L * W * UB_32B_ALIGN, 32))
    yield from ctx.wait(ctx.copy_in(cnt_ub, win, w.ipc(IPC_TOKEN_CNT_OFFSET),
                                    L * W * UB_32B_ALIGN, name="token_cnt"))
    yield from ctx.drain()
    raw = ctx.ub_read(cnt_ub, I32, L * W * EXP_TOKEN_COUNT_FLAG_CNT, ops=0)[::8]
    ctx.scalar(2 * L * W + 3 * L)
    cum = np.cumsum(raw.astype(np.int64))
    per_exp = np.array([cum[(i + 1) * W - 1] - (cum[i * W - 1] if i else 0) for i in range(L)],
                       np.int64)
    item = t.out_dtype.itemsize
    stage = ctx.alloc("local_ub", t.token_ub_size)
    in_ub = max(1, t.token_ub_size // rec)
    rows = ctx.tensor("expand_x")
    total = int(cum[first - 1]) if first else 0
    for sr in range(first, first + mine):
        ctx.loop(1)
        n = int(cum[sr] - (cum[sr - 1] if sr else 0))
        if n == 0:
            continue
        le, src = sr // W, sr % W
        for b in range(ceil_div(n, in_ub)):
            m = min(in_ub, n - b * in_ub)
            yield from ctx.wait(ctx.copy_in(stage, win, w.ipc_data(le, src) + b * in_ub * rec,
                                            m * rec, name="ipc_tokens"))
            row = total + b * in_ub
            ops = [ctx.copy_out(rows, row * H * item, stage, m * H * item,
                                src_offset=t.token_offset, name="expand_x",
                                strided=Strided(m, H * item, rec - H * item, 0))]
            if t.quant == "int8":
                ops.append(ctx.copy_out(ctx.tensor("dynamic_scales"), 4 * row, stage, 4 * m,
                                        src_offset=t.scale_offset, name="dynamic_scales",
                                        strided=Strided(m, 4, rec - 4, 0)))
            yield from ctx.wait(*ops)
        total += n
    if ctx.core_id == 0:
        cnt_out = ctx.alloc("ep_recv_counts", align_up(4 * L * W, 32))
        ctx.ub_write(cnt_out, 0, cum.astype(I32), ops=0)
        nums = ctx.alloc("expert_token_nums", align_up(8 * L, 32))
        ctx.ub_write(nums, 0, per_exp.astype(I64), ops=0)
        yield from ctx.wait(ctx.copy_out(ctx.tensor("ep_recv_count"), 0, cnt_out, 4 * L * W,
                                         name="ep_recv_count"),
                            ctx.copy_out(ctx.tensor("expert_token_nums"), 0, nums, 8 * L,
                                         name="expert_token_nums"))


def clean_up(ctx: KernelContext, t: LayeredTiling, buf_id: int) -> Wait:
    """Core 0 flips bufferChosen; core serverNum - 1 clears the end flags; core s clears
    the token flags of server s's area."""
    ctx.ub.reset()
    win, w = ctx.window(), t.window
    if ctx.core_id == 0:
        ctx.gm_write_scalar(win, w.buffer_chosen, buf_id ^ 1, U32)
        ctx.dcache.dcci_line(win, w.buffer_chosen)
    size = max(MAX_BS_NUM * FLAG_SIZE, t.server_num * STATE_OFFSET)
    zero = ctx.alloc("clean_temp", size)
    ctx.vector("duplicate", size // 4, I32, writes=[zero])
    yield from ctx.drain()
    ops = []
    if ctx.core_id == t.server_num - 1:
        at = w.rdma_status(buf_id, 0)
        win.release(at, t.server_num * STATE_OFFSET)
        ops.append(ctx.copy_out(win, at, zero, t.server_num * STATE_OFFSET, name="clean_status"))
    at = w.rdma_tokens(buf_id, ctx.core_id)
    span = MAX_BS_NUM * t.struct_len
    win.release(at, span)
    ops.append(ctx.copy_out(win, at, zero, MAX_BS_NUM * UB_32B_ALIGN, name="clean_flags",
                            strided=Strided(MAX_BS_NUM, UB_32B_ALIGN, 0,
                                            t.struct_len - UB_32B_ALIGN)))
    yield from ctx.wait(*ops)
