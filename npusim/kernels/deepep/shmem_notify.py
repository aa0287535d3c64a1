"""ShmemNotifyDispatch (sgl-kernel-npu `shmem_ver`, csrc/deepep/ops/op_kernel/
shmem_notify_dispatch.h, Process 92-109) as a per-core program.

1. AllGatherSendData (203-220): the R ranks split over the cores (SplitCoreCal, the first
   R % C one more); for each of its ranks p a core **pulls** p's num_tokens_per_expert
   (E int32, a symmetric tensor) through shmem_ptr into row p of recv_data with
   CpGM2GMPingPong, then PipeBarrier<PIPE_ALL>. No flags, no window state (magic is 0).
2. SyncAll, shmem_barrier_all: every PE has pulled.
3. ReloadRecvData (222-232), every core: pipe Reset, the whole recv_data into UB.
4. The builders, half = C / 2: BuildTotalRecvCount on cores [0, min(R, half)) (putOffset:
   the exclusive prefix over (le, s) of each destination rank q's counts, for every q),
   BuildMaxBs on core half, BuildTotalRecvTokens (the most any rank receives) on half + 1,
   BuildRecvTokenPerExp (this rank's rows per local expert, int64) on half + 2.
5. SyncAll.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.notify import cp_gm2gm_ping_pong, ping_pong_bufs
from npusim.kernels.deepep.shmem_layout import notify_build_ub, sync_all_and_barrier_all
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

I32, I64, F32 = np.int32, np.int64, np.float32


def builder_cores(cores: int) -> dict[int, str]:
    """The fixed cores of the three single-core builders (C / 2, + 1, + 2)."""
    half = cores // 2
    return {half: "max_bs", half + 1: "total_recv_tokens", half + 2: "recv_tokens_per_expert"}


def shmem_notify_program(t: DeepepTiling):
    def program(ctx: KernelContext) -> Wait:
        with ctx.phase("all_gather"):
            ctx.ub.reset()
            yield from all_gather_send_data(ctx, t, ping_pong_bufs(ctx))
            yield from sync_all_and_barrier_all(ctx, t)
        with ctx.phase("build"):
            ctx.ub.reset()  # pipe_.Reset()
            recv, bufs = yield from reload_recv_data(ctx, t)
            half = ctx.num_cores // 2
            role = builder_cores(ctx.num_cores).get(ctx.core_id)
            if ctx.core_id < min(t.W, half):
                yield from build_total_recv_count(ctx, t, recv, bufs, min(t.W, half))
            elif role is not None:
                yield from BUILDERS[role](ctx, t, recv, bufs)
            yield from ctx.sync_all()

    return program


def all_gather_send_data(ctx: KernelContext, t: DeepepTiling, bufs: list[Any]) -> Wait:
    p0, p1 = split_to_core(t.W, ctx.num_cores, ctx.core_id)
    n = 4 * t.E
    for p in range(p0, p1):
        ctx.loop(1)
        src, at = ctx.shmem.ptr("num_tokens_per_expert", p)
        yield from cp_gm2gm_ping_pong(ctx, bufs, src, at, ctx.tensor("recv_data"), p * n, n)
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL> after each peer


def reload_recv_data(ctx: KernelContext, t: DeepepTiling) -> Wait:
    """recv_data [R, E] into UB with one copy; the builders' buffers after it."""
    plan = notify_build_ub(t)
    bufs = [ctx.alloc(name, n) for name, n in plan]
    yield from ctx.wait(ctx.copy_in(bufs[0], ctx.tensor("recv_data"), 0, 4 * t.W * t.E,
                                    name="reload_recv_data"))
    yield from ctx.drain()
    return ctx.ub_read(bufs[0], I32, t.W * t.E, ops=0).reshape(t.W, t.E).copy(), bufs


def reorder_recv_data_output(ctx: KernelContext, t: DeepepTiling, recv: np.ndarray, q: int,
                             cum_sum: bool) -> np.ndarray:
    """ReorderRecvDataOutput: a scalar loop over (le, s) of destination q's counts, the
    exclusive prefix (cum_sum) or the counts themselves, le-major."""
    cnt = recv[:, q * t.L:(q + 1) * t.L].T.reshape(-1)  # [le * R + s]
    ctx.loop(t.L * t.W)
    ctx.scalar(4 * t.L * t.W)  # GetValue, SetValue, the prefix add, the index
    if not cum_sum:
        return cnt.astype(I32)
    return (np.cumsum(cnt) - cnt).astype(I32)


def build_total_recv_count(ctx: KernelContext, t: DeepepTiling, recv: np.ndarray,
                           bufs: list[Any], used: int) -> Wait:
    """putOffset[q * E + le * R + s] for the core's share of destination ranks q."""
    q0, q1 = split_to_core(t.W, used, ctx.core_id)
    trans = bufs[1]
    for q in range(q0, q1):
        row = reorder_recv_data_output(ctx, t, recv, q, True)
        ctx.ub_write(trans, 0, row, ops=0)
        yield from ctx.wait(ctx.copy_out(ctx.tensor("put_offset"), 4 * q * t.E, trans,
                                         4 * t.E, name="put_offset"))


def _reduce(ctx: KernelContext, t: DeepepTiling, n: int) -> Wait:
    """Cast int32 -> fp32, ReduceSum, SyncFunc<V_S> and the scalar read of the sum."""
    ctx.vector_seq("reduce_sum", [("cast", n, F32), ("reduce_sum", n, F32)])
    yield from ctx.pipe_barrier("vector")
    ctx.scalar(2)


def _store_scalar(ctx: KernelContext, name: str, value: int) -> None:
    """SetValue of an output's element 0, then a dcci of its line."""
    out = ctx.tensor(name)
    ctx.gm_write_scalar(out, 0, value, I32)
    ctx.dcache.dcci_line(out, 0)


def build_max_bs(ctx: KernelContext, t: DeepepTiling, recv: np.ndarray, bufs: list[Any]
                 ) -> Wait:
    """maxBs = max over sources of their tokens sent (pairs) / K."""
    for _src in range(t.W):
        ctx.loop(1)
        ctx.vector("copy_row", t.E, I32)  # DataCopy UB -> UB of the source's row
        yield from _reduce(ctx, t, t.E)
    _store_scalar(ctx, "max_bs", int(recv.sum(axis=1).max()) // t.K)


def build_total_recv_tokens(ctx: KernelContext, t: DeepepTiling, recv: np.ndarray,
                            bufs: list[Any]) -> Wait:
    """The most rows any rank receives: expandx_out is allocated that size on every PE."""
    for q in range(t.W):
        reorder_recv_data_output(ctx, t, recv, q, False)
        yield from _reduce(ctx, t, t.E)
    per_rank = recv.reshape(t.W, t.W, t.L).sum(axis=(0, 2))
    _store_scalar(ctx, "total_recv_tokens", int(per_rank.max()))


def build_recv_token_per_exp(ctx: KernelContext, t: DeepepTiling, recv: np.ndarray,
                             bufs: list[Any]) -> Wait:
    cnt = reorder_recv_data_output(ctx, t, recv, ctx.rank_id, False).reshape(t.L, t.W)
    ctx.loop(t.L * t.W)
    ctx.scalar(2 * t.L * t.W)
    out = bufs[1]
    ctx.ub_write(out, 0, cnt.sum(axis=1).astype(I64), ops=t.L)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("recv_tokens_per_expert"), 0, out, 8 * t.L,
                                     name="recv_tokens_per_expert"))


BUILDERS: dict[str, Callable[[KernelContext, DeepepTiling, np.ndarray, list[Any]], Wait]] = {
    "max_bs": build_max_bs, "total_recv_tokens": build_total_recv_tokens,
    "recv_tokens_per_expert": build_recv_token_per_exp}
