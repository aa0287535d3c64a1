"""NotifyDispatch (csrc/deepep/ops/op_kernel/notify_dispatch.h, Process 110-132) as a
per-core program: the count exchange between notify's own-window writes and peers' pulls.

1. GetMagicValue: every core reads and bumps its call counter (windowsExp + 900 KiB); the
   window half is magic % 2.
2. Core 0, AssembleSendData: per round and expert (count, prefix offset, round tokens);
   send_data_offset; the triples regrouped per target rank into send_data. SyncAll.
3. InputToShareSlice (cores with ranks, ceil(W / C) ranks each): CpGM2GMPingPong of the
   slices for its ranks into the core's **own** window (half + 2 MiB), then a u64 flag
   magic * 2 + 1 into each of those peers' windows at this rank's 32 B entry.
4. ShareToShareSlice: WaitOneRankPartFlag on the own window's entries of those peers, then a
   CpGM2GMPingPong **pull** of this rank's slice from each peer's window into recv_data. SyncAll.
5. The Build* scans, each on its fixed core 0..7 (ReorderOutput of recv_data, a scalar loop,
   one write): total_recv_token, recv_count (inclusive cumsum over le * W + src per round),
   recv_offset, max_bs, recv_tokens_per_expert, expert_global_offset,
   srcrank_in_expert_offset, r_in_srcrank_offset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Condition, Wait
from npusim.runtime.context import KernelContext
from npusim.units import KiB, align_up, ceil_div

I32, U64 = np.int32, np.uint64
PING_PONG = 95 * KiB  # UB_SINGLE_PING_PONG_ADD_SIZE_MAX
FLAG_STRIDE = 32  # FLAG_UNIT_INT_NUM u64
MAGIC_MASK = ~((1 << 32) - 1) & ((1 << 64) - 1)
BUILD_CORES = ("total_recv_token", "recv_count", "recv_offset", "max_bs",
               "recv_tokens_per_expert", "expert_global_offset", "srcrank_in_expert_offset",
               "r_in_srcrank_offset")


class MagicReached(Condition):
    """WaitOneRankPartFlag: every u64 flag (one per 32 B) carries the magic's high half and
    is at least magic * 2 + value."""

    def __init__(self, check: int) -> None:
        self.check = check

    def values(self, data: np.ndarray) -> np.ndarray:
        rows = data[: data.size // FLAG_STRIDE * FLAG_STRIDE].reshape(-1, FLAG_STRIDE)
        return np.ascontiguousarray(rows[:, :8]).view(U64).ravel()

    def __call__(self, data: np.ndarray) -> bool:
        v = self.values(data).astype(object)
        return all((x & MAGIC_MASK) == (self.check & MAGIC_MASK) and x >= self.check for x in v)

    def describe(self, data: np.ndarray) -> str:
        return (f"expects every u64 flag >= {self.check} (magic * 2 + 1); current "
                f"{self.values(data)[:4].tolist()}")


def batch_rounds(t: DeepepTiling) -> int:
    """batchRounds of Init: 1 with one round, else by the expert count; the A2 build (ops2)
    takes 16 above 256 experts, else 32, whatever the rounds; the 950's (notify_dispatch_a5.h)
    tests E > 512 before E / W >= 128."""
    if t.platform == "a2":
        return 16 if t.E > 256 else 32
    if t.round == 1:
        return 1
    if t.platform == "a5" and t.E > 512:  # notify_dispatch_a5.h tests E first
        return 8
    if t.L >= 512 // 4:
        return 16
    if t.E > 512:
        return 8
    return 32 if t.E <= 256 else 16


def notify_program(t: DeepepTiling):
    def program(ctx: KernelContext) -> Wait:
        with ctx.phase("assemble"):
            magic = get_magic_value(ctx, t)
            half = magic % 2
            if ctx.core_id == 0:
                yield from assemble_send_data(ctx, t)
            yield from ctx.sync_all()
        with ctx.phase("exchange"):
            ctx.ub.reset()  # pipe.Reset(): the ping-pong halves from UB offset 96
            bufs = ping_pong_bufs(ctx)
            ranks = my_ranks(ctx, t)  # a core without ranks skips both slices
            if ranks:
                yield from input_to_share_slice(ctx, t, ranks, magic, half, bufs)
                yield from share_to_share_slice(ctx, t, ranks, magic, half, bufs)
            yield from ctx.sync_all()
        with ctx.phase("build"):
            ctx.ub.reset()
            if ctx.core_id < len(BUILD_CORES):
                yield from build(ctx, t, BUILD_CORES[ctx.core_id])

    return program


def get_magic_value(ctx: KernelContext, t: DeepepTiling) -> int:
    win, at = ctx.window(), t.window.notify_magic(ctx.core_id)
    ctx.dcache.dcci_line(win, at)
    magic = int(ctx.gm_read_scalar(win, at, U64))
    magic = max(magic, 1)
    ctx.gm_write_scalar(win, at, magic + 1, U64)
    return magic


def assemble_send_data(ctx: KernelContext, t: DeepepTiling) -> Wait:
    """Core 0: (count, prefix, round tokens) per round and expert, then per target rank."""
    E, L, R = t.E, t.L, t.round
    B = batch_rounds(t)
    counts_buf = ctx.alloc("token_per_expert", align_up(4 * B * E, 32))
    offset_buf = ctx.alloc("send_data_offset", align_up(4 * B * E, 32))
    send_buf = ctx.alloc("send_data", align_up(12 * B * E, 32))
    new_buf = ctx.alloc("new_send_data", align_up(12 * B * L, 32))
    real = t.real_round
    for r0 in range(0, R, B):
        nb = min(B, R - r0)
        yield from ctx.wait(ctx.copy_in(counts_buf, ctx.tensor("num_tokens_per_expert"),
                                        4 * r0 * E, 4 * nb * E))
        cnt = ctx.ub_read(counts_buf, I32, nb * E, ops=0).reshape(nb, E)
        triples = np.zeros((nb, E, 3), I32)
        for r in range(nb):
            ctx.loop(E)
            ctx.scalar(7 * E)  # GetValue, base, three SetValue, the offset, the prefix
            if r0 + r < real:
                triples[r, :, 0] = cnt[r]
                triples[r, :, 1] = np.cumsum(cnt[r]) - cnt[r]
                triples[r, :, 2] = t.round_tokens(r0 + r)
        ctx.ub_write(offset_buf, 0, np.ascontiguousarray(triples[:, :, 1]).reshape(-1), ops=0)
        yield from ctx.wait(ctx.copy_out(ctx.tensor("send_data_offset"), 4 * r0 * E, offset_buf,
                                         4 * nb * E))
        ctx.ub_write(send_buf, 0, triples.reshape(-1), ops=0)
        for tr in range(t.W):
            ctx.loop(nb * L)
            ctx.scalar(6 * nb * L)  # index arithmetic and three copies per local expert
            part = triples[:, tr * L:(tr + 1) * L, :].reshape(-1)
            ctx.ub_write(new_buf, 0, part, ops=0)
            at = 4 * (tr * R * L * 3 + r0 * L * 3)
            yield from ctx.wait(ctx.copy_out(ctx.tensor("send_data"), at, new_buf, 4 * part.size))


def ping_pong_bufs(ctx: KernelContext) -> list[Any]:
    ctx.alloc("head", 96)  # UB_HEAD_OFFSET: the flag words
    return [ctx.alloc("ping", PING_PONG), ctx.alloc("pong", PING_PONG)]


def cp_gm2gm_ping_pong(ctx: KernelContext, bufs: list[Any], src: Any, src_off: int, dst: Any,
                       dst_off: int, nbytes: int) -> Wait:
    """CpGM2GMPingPong: 95 KiB chunks GM -> UB -> GM through two buffers; the read of a chunk
    waits for the write that last used its buffer (MTE3_MTE2); ends when all writes landed."""
    last: list[Any] = [None, None]
    done = 0
    i = 0
    while done < nbytes:
        size = min(PING_PONG, nbytes - done)
        p = i & 1
        if last[p] is not None:
            yield from ctx.wait(last[p])
        yield from ctx.wait(ctx.copy_in(bufs[p], src, src_off + done, size, name="cp_in"))
        last[p] = ctx.copy_out(dst, dst_off + done, bufs[p], size, name="cp_out")
        done += size
        i += 1
    yield from ctx.pipe_barrier("mte3")


def my_ranks(ctx: KernelContext, t: DeepepTiling) -> range:
    per_core = ceil_div(t.W, ctx.num_cores)
    first = ctx.core_id * per_core
    return range(first, min(t.W, first + per_core))


def input_to_share_slice(ctx: KernelContext, t: DeepepTiling, ranks: range, magic: int,
                         half: int, bufs: list[Any]) -> Wait:
    win = t.window
    n = t.notify_ints * 4
    yield from cp_gm2gm_ping_pong(ctx, bufs, ctx.tensor("send_data"), ranks[0] * n, ctx.window(),
                                  win.notify_data(half) + ranks[0] * n, len(ranks) * n)
    flag = ctx.alloc("flag", 32)
    ctx.ub_write(flag, 0, np.array([magic * 2 + 1, 0, 0, 0], U64))
    for i in ranks:
        ctx.put(i, win.notify_flag(half, ctx.rank_id), flag, 8, name="put_flag")
    yield from ctx.drain()  # pipe_barrier(PIPE_ALL)


def share_to_share_slice(ctx: KernelContext, t: DeepepTiling, ranks: range, magic: int,
                         half: int, bufs: list[Any]) -> Wait:
    win = t.window
    n = t.notify_ints * 4
    poll = ctx.alloc("flags", align_up(FLAG_STRIDE * len(ranks), 32))
    yield from ctx.wait_until(ctx.window(), win.notify_flag(half, ranks[0]),
                              FLAG_STRIDE * len(ranks), MagicReached(magic * 2 + 1), poll,
                              name="wait_flags")
    # checkRank: start at rank % copyLen within the core's ranks (spreads the pulls)
    order = [ranks[(j + ctx.rank_id % len(ranks)) % len(ranks)] for j in range(len(ranks))]
    for peer in order:
        yield from cp_gm2gm_ping_pong(ctx, bufs, ctx.window(peer),
                                      win.notify_data(half) + ctx.rank_id * n,
                                      ctx.tensor("recv_data"), peer * n, n)


def build(ctx: KernelContext, t: DeepepTiling, what: str) -> Wait:
    """One Build* scan: ReorderOutput per batch of rounds, the loop, one write."""
    W, L, R, E = t.W, t.L, t.round, t.E
    B = batch_rounds(t)
    row = align_up(12 * B * L, 32)
    recv_bufs = [ctx.alloc(f"recv_data{src}", row) for src in range(W)]
    out_buf = ctx.alloc("out", align_up(4 * max(R * E, L * W * R, E, 8), 32))
    recv = np.zeros((W, R, L, 3), I32)
    for r0 in range(0, R, B):
        nb = min(B, R - r0)
        for src in range(W):  # ReorderOutput: one copy per source rank
            ctx.copy_in(recv_bufs[src], ctx.tensor("recv_data"),
                        4 * (src * R * L * 3 + r0 * L * 3), 12 * nb * L, name="reorder")
        yield from ctx.pipe_barrier("mte2")
        for src in range(W):
            recv[src, r0:r0 + nb] = ctx.ub_read(recv_bufs[src], I32, nb * L * 3,
                                                ops=0).reshape(nb, L, 3)
        ctx.loop(nb * L * W)
        ctx.scalar(4 * nb * L * W)  # per (round, expert, source): index, load, add, store
    cnt = np.transpose(recv[..., 0], (1, 2, 0))  # [r, le, src]
    out = _built(what, t, recv, cnt)
    if what == "total_recv_token":  # Cast + ReduceSum on V per batch
        ctx.vector_seq("reduce_sum", [("cast", R * E, np.float32), ("reduce_sum", R * E,
                                                                     np.float32)])
        yield from ctx.pipe_barrier("vector")
    ctx.ub_write(out_buf, 0, out, ops=0)
    yield from ctx.wait(ctx.copy_out(ctx.tensor(what), 0, out_buf, 4 * out.size))


def _built(what: str, t: DeepepTiling, recv: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    R, L, W = t.round, t.L, t.W
    per_pair = cnt.sum(axis=0)  # [le, src]
    if what == "total_recv_token":
        return np.array([cnt.sum()], I32)
    if what == "recv_count":
        return np.cumsum(cnt.reshape(R, L * W), axis=1).astype(I32).reshape(-1)
    if what == "recv_offset":
        return np.transpose(recv[..., 1], (1, 2, 0)).reshape(-1).astype(I32)
    if what == "max_bs":  # the round tokens of each source's first local expert, summed
        return np.array([int(recv[:, :, 0, 2].sum(axis=1).max())], I32)
    if what == "recv_tokens_per_expert":
        return cnt.sum(axis=2).reshape(-1).astype(I32)
    if what == "expert_global_offset":
        per_le = per_pair.sum(axis=1)
        return (np.cumsum(per_le) - per_le).astype(I32)
    if what == "srcrank_in_expert_offset":
        return (np.cumsum(per_pair, axis=1) - per_pair).reshape(-1).astype(I32)
    # r_in_srcrank_offset[le, src, r]: the rounds before r
    return np.transpose(np.cumsum(cnt, axis=0) - cnt, (1, 2, 0)).reshape(-1).astype(I32)
