"""moe_combine_kernel (the cann-recipes-infer article "NPU DeepSeek SHMEM通信优化实践";
tile-ai/tilelang-ascend examples/dispatch_combine/dispatch_combine_shmem.py main_combine) as a
per-core program of the MIX launch.

Only a T.Scope("V") runs (the AIC cores of the launch have nothing to do). Per AIV,
cur_vid = vid + 2 * cid:

- send (发数据、发状态): the M received rows split over the aiv_num cores; the core's
  triples copied in; per row, in the order rotated by (loop + rank) % send_token_num, the
  expand_x row copied GM -> x_ub, put (H elements) to row token * K + k of the source's
  combine window, then its eight 1.0 status words put to the same row of the status
  window (a barrier_all between).
- reduce (等状态, 本地win区数据拷贝): the Bs local tokens split over the cores
  (token_per_core); per token, the K * 8 status words copied in and reduce-summed until
  the sum lies in [8K - 0.5, 8K + 0.5] (targetMin, targetMax), the words cleared; the K
  rows copied in, each cast to fp32, multiplied by its expert_scales weight and added;
  the sum cast to bf16 (RINT) and copied to combine_out.

main_combine runs one step per phase, each named after its Ascend C moe_distribute_combine
stage: expert_alltoall_dispatch_copy_add (send), then local_window_copy (reduce), which
calls wait_dispatch per token.

The article's excerpt copies the rows without the weighted sum; the public example (the
one the article abbreviates) takes expert_scales and sums, as here.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.split import split_share
from npusim.kernels.tilelang_shmem.lowering import (
    Wait,
    barrier_all,
    fill,
    tile_op,
    vector_check_ns,
)
from npusim.kernels.tilelang_shmem.tiling import (
    ASSIST,
    BF16,
    FLOAT_ALIGN,
    STATUS_BYTES,
    TileLangTiling,
)
from npusim.runtime.conditions import SumEquals
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div

I32, F32 = np.int32, np.float32
PHASES = ("send", "reduce")


def combine_program(t: TileLangTiling):
    def program(ctx: KernelContext) -> Wait:
        if ctx.core.kind.name == "aic":
            return
        yield from main_combine(ctx, t)

    return program


def received_rows(ctx: KernelContext, t: TileLangTiling) -> int:
    """M = ep_recv_counts[-1].item(): the host reads it and compiles the kernel for it."""
    return int(ctx.tensor("ep_send_counts").read(4 * (t.total_expert_num - 1), 4).view(I32)[0])


class Bufs:
    """The kernel's T.alloc_ub buffers, in the order the kernel allocates them."""

    def __init__(self, ctx: KernelContext, t: TileLangTiling, M: int) -> None:
        Bs, K, H = t.shape.BS, t.shape.K, t.shape.H
        token_per_core = ceil_div(M, t.aiv_num)
        self.x_ub = ctx.alloc("x_ub", 2 * H)
        self.assist_ub = ctx.alloc("assist_ub", max(4 * ASSIST * token_per_core, 4))
        self.status_ub = ctx.alloc("status_ub", STATUS_BYTES)
        self.state_ub = ctx.alloc("state_ub", K * STATUS_BYTES)
        self.state_reset = ctx.alloc("state_reset", K * STATUS_BYTES)
        self.row_bf16 = ctx.alloc("win_data_ub_bfloat", 2 * H)
        self.row_f32 = ctx.alloc("win_data_ub_float", 4 * H)
        self.acc_f32 = ctx.alloc("combine_out_ub_float", 4 * H)
        self.out_bf16 = ctx.alloc("combine_out_ub_bfloat", 2 * H)
        self.scales_ub = ctx.alloc("expert_scales_ub", 4 * Bs * K)


def main_combine(ctx: KernelContext, t: TileLangTiling) -> Wait:
    """The AIV scope: send the received rows back, then sum each local token's K rows."""
    M = received_rows(ctx, t)
    b = Bufs(ctx, t, M)
    ctx.scalar(8)  # cur_vid and the split
    with ctx.phase("send"):
        yield from expert_alltoall_dispatch_copy_add(ctx, t, b, M)
    with ctx.phase("reduce"):
        yield from local_window_copy(ctx, t, b)


def expert_alltoall_dispatch_copy_add(
    ctx: KernelContext, t: TileLangTiling, b: Bufs, M: int
) -> Wait:
    """发数据、发状态: each of the core's received rows put to row token * K + k of its
    source's combine window, then eight 1.0 status words to the same row of the status
    window; the rows taken in an order rotated by the rank."""
    s, win, rank = t.shape, t.window, ctx.rank_id
    K = s.K
    start, send_num = split_share(M, t.aiv_num, ctx.kind_index)
    fill(ctx, b.status_ub, 1.0, F32)
    fill(ctx, b.state_reset, 0.0, F32)
    yield from barrier_all(ctx)
    if send_num:  # T.copy of the core's triples (the rows it owns)
        ctx.copy_in(
            b.assist_ub,
            ctx.tensor("assist_info_combine"),
            4 * ASSIST * start,
            4 * ASSIST * send_num,
        )
    yield from barrier_all(ctx)
    expand_x = ctx.tensor("expand_x")
    for loop in range(send_num):
        ctx.loop(1)
        tk_index = start + (loop + rank) % send_num
        base = 4 * ASSIST * (tk_index - start)
        to_rank, token_id, topk_id = (int(v) for v in ctx.ub_read(b.assist_ub, I32, 3, base, ops=3))
        ctx.scalar(4)  # tk_index, base_offset, win_gm
        ctx.copy_in(b.x_ub, expand_x, tk_index * s.token_bytes, s.token_bytes)
        yield from barrier_all(ctx)
        slot = token_id * K + topk_id
        ctx.shmem.put_ub(
            to_rank, win.combine_row(slot), b.x_ub, s.token_bytes, name="shmem_ub_put_nbi data"
        )
        yield from barrier_all(ctx)
        ctx.shmem.put_ub(
            to_rank,
            win.combine_flag(slot),
            b.status_ub,
            STATUS_BYTES,
            name="shmem_ub_put_nbi status",
        )
    yield from barrier_all(ctx)


def local_window_copy(ctx: KernelContext, t: TileLangTiling, b: Bufs) -> Wait:
    """本地win区数据拷贝: per local token of the core, wait for its K rows, then their
    expert_scales-weighted sum cast to bf16 (RINT) and copied to combine_out."""
    s, win = t.shape, t.window
    Bs, K, H = s.BS, s.K, s.H
    start_token, token_num = split_share(Bs, t.aiv_num, ctx.kind_index)
    ctx.copy_in(b.scales_ub, ctx.tensor("expert_scales"), 0, 4 * Bs * K)
    yield from ctx.pipe_barrier("mte2")
    for cur_idx in range(start_token, start_token + token_num):
        ctx.loop(1)
        fill(ctx, b.acc_f32, 0.0, F32)
        yield from wait_dispatch(ctx, t, b, cur_idx)
        yield from barrier_all(ctx)
        for k in range(K):
            ctx.loop(1)
            scale = F32(ctx.ub_read(b.scales_ub, F32, 1, 4 * (cur_idx * K + k))[0])
            ctx.copy_in(b.row_bf16, ctx.window(), win.combine_row(cur_idx * K + k), 2 * H)
            yield from barrier_all(ctx)
            yield from weigh(ctx, H, b.row_bf16, b.row_f32, b.acc_f32, scale)
        yield from barrier_all(ctx)

        def rint() -> None:
            b.out_bf16.view(BF16, H)[:] = b.acc_f32.view(F32, H).astype(BF16)

        tile_op(ctx, "cast rint", H, F32, (b.acc_f32,), (b.out_bf16,), rint)
        yield from barrier_all(ctx)
        ctx.copy_out(ctx.tensor("combine_out"), cur_idx * s.token_bytes, b.out_bf16, s.token_bytes)


def wait_dispatch(ctx: KernelContext, t: TileLangTiling, b: Bufs, cur_idx: int) -> Wait:
    """等状态: poll the token's K * 8 status words until their sum is 8K (within 0.5,
    targetMin and targetMax), then clear them."""
    K, win = t.shape.K, t.window
    target = K * FLOAT_ALIGN  # compare_target
    yield from ctx.wait_until(
        ctx.window(),
        win.combine_flag(cur_idx * K),
        K * STATUS_BYTES,
        SumEquals(F32, float(target), tolerance=0.5),
        b.state_ub,
        name="wait status",
        check_ns=vector_check_ns(ctx, target, F32),
    )
    ctx.copy_out(
        ctx.window(),
        win.combine_flag(cur_idx * K),
        b.state_reset,
        K * STATUS_BYTES,
        name="clear status",
    )


def weigh(ctx: KernelContext, H: int, row_bf16, row_f32, acc_f32, scale: np.float32) -> Wait:
    """cast (bf16 -> fp32), mul by the scalar weight, add into the sum; pipe_barrier v
    between them."""

    def cast() -> None:
        row_f32.view(F32, H)[:] = row_bf16.view(BF16, H).astype(F32)

    def mul() -> None:
        v = row_f32.view(F32, H)
        v[:] = (v * scale).astype(F32)

    def add() -> None:
        a = acc_f32.view(F32, H)
        a[:] = (a + row_f32.view(F32, H)).astype(F32)

    tile_op(ctx, "cast", H, F32, (row_bf16,), (row_f32,), cast)
    yield from ctx.pipe_barrier("vector")
    tile_op(ctx, "muls", H, F32, (row_f32,), (row_f32,), mul)
    yield from ctx.pipe_barrier("vector")
    tile_op(ctx, "add", H, F32, (acc_f32, row_f32), (acc_f32,), add)
