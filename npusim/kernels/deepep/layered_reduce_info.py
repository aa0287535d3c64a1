"""CreateInnerReduceInfo and CreateOuterReduceInfo: the combine's intra- and inter-server
reduce info the dispatch writes after the E counts of ep_recv_count."""

from __future__ import annotations

import numpy as np

from npusim.kernels.deepep.layered_arrivals import Arrivals
from npusim.kernels.deepep.layered_layout import (
    MAX_BS_NUM,
    SERVER_RANK_SIZE,
)
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I16, I32 = np.int16, np.int32


def inner_reduce_info(ids: np.ndarray, t: LayeredTiling, server_id: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """CreateInnerReduceInfo's arithmetic on the arrived tokens' expert ids [realBS, K]:
    (innerCnt, the inclusive cumsum of each token's hits in this server, tokens ordered by
    their first expert here; innerOffset, each hit's place in the combine's layout)."""
    L, K, g = t.shape.L, t.shape.K, t.global_bs
    per_server = SERVER_RANK_SIZE * L
    lo = server_id * per_server
    n = ids.shape[0]
    cnt = np.zeros(per_server, np.int64)
    lists: list[list[int]] = [[] for _ in range(per_server)]
    place = np.zeros((n, K), np.int64)
    for tok in range(n):
        for k in range(K):
            e = int(ids[tok, k])
            if lo <= e < lo + per_server:
                j = e % per_server
                place[tok, k] = cnt[j]
                cnt[j] += 1
                lists[j].append(tok)
    pre = cnt.copy()
    for j in range(per_server):
        if j % L:
            pre[j] += pre[j - 1]
    seen = np.zeros(n, bool)
    hits: list[int] = []
    offsets: list[int] = []
    for j in range(per_server):
        for tok in lists[j]:
            if seen[tok]:
                continue
            seen[tok] = True
            h = 0
            for k in range(K):
                e = int(ids[tok, k])
                if lo <= e < lo + per_server:
                    jj = e % per_server
                    base = 0 if jj % L == 0 else int(pre[jj - 1])
                    offsets.append(base + (jj // L) * g * K + int(place[tok, k]))
                    h += 1
            hits.append(h)
    return np.cumsum(np.array(hits, np.int64)), np.array(offsets, np.int64)


def create_inner_reduce_info(ctx: KernelContext, t: LayeredTiling, buf_id: int,
                             server: int) -> Wait:
    ctx.ub.reset()
    arrivals = Arrivals(ctx, t, buf_id, server)
    exp_buf = ctx.alloc("local_ub", align_up(MAX_BS_NUM * t.exp_len, 32))
    ids: list[np.ndarray] = []
    while True:
        tok = len(ids)
        got = yield from arrivals.next(tok, True, exp_buf)
        yield from ctx.drain()
        if not got:
            break
        ids.append(exp_buf.bytes_at(0, 4 * t.shape.K).view(I32).copy())
    real = len(ids)
    g, K = t.global_bs, t.shape.K
    out = ctx.tensor("ep_recv_count")
    off = t.combine_offsets
    n_cnt = min(real + t.cores, g) if real else min(t.cores, g)
    cnt_buf = ctx.alloc("inner_cnt", align_up(2 * (real + t.cores), 32))
    cnt = np.zeros(real + t.cores, I16)
    if real:
        arr = np.array(ids, I32)
        ctx.scalar(6 * real * K + 2 * SERVER_RANK_SIZE * t.shape.L + 8 * real * K + 2 * real)
        c, o = inner_reduce_info(arr, t, ctx.rank_id // SERVER_RANK_SIZE)
        cnt[:len(c)] = c
    ctx.vector("duplicate", real + t.cores, I16, writes=[cnt_buf])
    yield from ctx.drain()
    ctx.ub_write(cnt_buf, 0, cnt, ops=0)
    yield from ctx.drain()
    yield from ctx.wait(ctx.copy_out(out, off["inner_cnt"] + g * server * 2, cnt_buf,
                                     2 * n_cnt, name="combine_inner_cnt"))
    if real:
        offs = np.zeros(real * K, I32)
        offs[:len(o)] = o
        idx_buf = ctx.alloc("inner_offset", align_up(4 * real * K, 32))
        ctx.ub_write(idx_buf, 0, offs, ops=0)
        yield from ctx.wait(ctx.copy_out(out, off["inner_idx"] + g * K * server * 4, idx_buf,
                                         4 * real * K, name="combine_inner_offset"))


def outer_reduce_info(ids: np.ndarray, t: LayeredTiling
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CreateOuterReduceInfo's arithmetic on the own tokens' expert ids [BS, K]: per token
    the inclusive cumsum of the servers it goes to (outerCnt), and per (token, server) in
    that order its place in the combine's layout and its hits there."""
    BS, K, S, E = t.shape.BS, t.shape.K, t.server_num, t.shape.E
    per_server = SERVER_RANK_SIZE * t.shape.L
    hits = np.zeros((BS, S), np.int64)
    low = np.full((BS, S), E, np.int64)
    acc = np.zeros(E, np.int64)
    idx = np.zeros((BS, S), np.int64)
    for tok in range(BS):
        for k in range(K):
            e = int(ids[tok, k])
            s = e // per_server
            hits[tok, s] += 1
            low[tok, s] = min(low[tok, s], e)
        for s in range(S):
            if low[tok, s] != E:
                idx[tok, s] = acc[low[tok, s]]
                acc[low[tok, s]] += hits[tok, s]
    acc = np.cumsum(acc)
    cnt = np.zeros(BS, np.int64)
    offsets: list[int] = []
    per: list[int] = []
    for tok in range(BS):
        for s in range(S):
            e = int(low[tok, s])
            if e == E:
                continue
            cnt[tok] += 1
            per.append(int(hits[tok, s]))
            pre_server = 0 if s == 0 else int(acc[s * per_server - 1])
            pre_token = 0 if e == 0 else int(acc[e - 1])
            offsets.append(pre_token - pre_server + int(idx[tok, s]) + s * BS * K)
    return np.cumsum(cnt), np.array(offsets, np.int64), np.array(per, np.int64)


def create_outer_reduce_info(ctx: KernelContext, t: LayeredTiling) -> Wait:
    ctx.ub.reset()
    BS, K, S = t.shape.BS, t.shape.K, t.server_num
    ids_buf = ctx.alloc("expert_ids", align_up(4 * BS * K, 32))
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * BS * K))
    ctx.vector("duplicate", 5 * BS * S + t.shape.E + BS, I32)
    yield from ctx.drain()
    ids = ctx.ub_read(ids_buf, I32, BS * K, ops=0).reshape(BS, K)
    ctx.scalar(8 * BS * K + 4 * BS * S + t.shape.E + 10 * BS * S + BS)
    cnt, offs, per = outer_reduce_info(ids, t)
    off, out = t.combine_offsets, ctx.tensor("ep_recv_count")
    for name, key, values, n in (("combine_outer_cnt", "outer_cnt", cnt, BS),
                                 ("combine_outer_offset", "outer_idx", offs, BS * S),
                                 ("combine_outer_cnt_per_server", "per_server", per, BS * S)):
        buf = ctx.alloc(name, align_up(4 * n, 32))
        full = np.zeros(n, I32)
        full[:len(values)] = values
        ctx.ub_write(buf, 0, full, ops=0)
        yield from ctx.drain()
        yield from ctx.wait(ctx.copy_out(out, off[key], buf, 4 * n, name=name))
