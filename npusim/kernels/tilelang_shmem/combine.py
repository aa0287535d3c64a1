"""moe_combine_kernel (seeds/003; tilelang-ascend examples/dispatch_combine/
dispatch_combine_shmem.py main_combine) as a per-core program of the MIX launch.

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

The seed's excerpt copies the rows without the weighted sum; the public example (the
one the seed abbreviates) takes expert_scales and sums, as here.
"""

from __future__ import annotations

import numpy as np

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
    split,
)
from npusim.runtime.conditions import SumEquals
from npusim.runtime.context import KernelContext

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


def main_combine(ctx: KernelContext, t: TileLangTiling) -> Wait:
    s = t.shape
    Bs, K, H = s.BS, s.K, s.H
    rank, cur_vid, win = ctx.rank_id, ctx.kind_index, t.window
    M = received_rows(ctx, t)
    token_per_core = -(-M // t.aiv_num)
    x_ub = ctx.alloc("x_ub", 2 * H)
    assist_ub = ctx.alloc("assist_ub", max(4 * ASSIST * token_per_core, 4))
    status_ub = ctx.alloc("status_ub", STATUS_BYTES)
    state_ub = ctx.alloc("state_ub", K * STATUS_BYTES)
    state_reset = ctx.alloc("state_reset", K * STATUS_BYTES)
    row_bf16 = ctx.alloc("win_data_ub_bfloat", 2 * H)
    row_f32 = ctx.alloc("win_data_ub_float", 4 * H)
    acc_f32 = ctx.alloc("combine_out_ub_float", 4 * H)
    out_bf16 = ctx.alloc("combine_out_ub_bfloat", 2 * H)
    scales_ub = ctx.alloc("expert_scales_ub", 4 * Bs * K)
    ctx.scalar(8)  # cur_vid and the split
    with ctx.phase("send"):
        start, send_num = split(M, t.aiv_num, cur_vid)
        fill(ctx, status_ub, 1.0, F32)
        fill(ctx, state_reset, 0.0, F32)
        yield from barrier_all(ctx)
        if send_num:  # T.copy of the core's triples (the rows it owns)
            ctx.copy_in(assist_ub, ctx.tensor("assist_info_combine"), 4 * ASSIST * start,
                        4 * ASSIST * send_num)
        yield from barrier_all(ctx)
        expand_x = ctx.tensor("expand_x")
        for loop in range(send_num):
            ctx.loop(1)
            tk_index = start + (loop + rank) % send_num
            base = 4 * ASSIST * (tk_index - start)
            to_rank, token_id, topk_id = (int(v) for v in ctx.ub_read(assist_ub, I32, 3, base,
                                                                       ops=3))
            ctx.scalar(4)  # tk_index, base_offset, win_gm
            ctx.copy_in(x_ub, expand_x, tk_index * s.token_bytes, s.token_bytes)
            yield from barrier_all(ctx)
            slot = token_id * K + topk_id
            ctx.shmem.put_ub(to_rank, win.combine_row(slot), x_ub, s.token_bytes,
                             name="shmem_ub_put_nbi data")
            yield from barrier_all(ctx)
            ctx.shmem.put_ub(to_rank, win.combine_flag(slot), status_ub, STATUS_BYTES,
                             name="shmem_ub_put_nbi status")
        yield from barrier_all(ctx)
    with ctx.phase("reduce"):
        start_token, token_num = split(Bs, t.aiv_num, cur_vid)
        target = K * FLOAT_ALIGN  # compare_target
        ctx.copy_in(scales_ub, ctx.tensor("expert_scales"), 0, 4 * Bs * K)
        yield from ctx.pipe_barrier("mte2")
        for cur_idx in range(start_token, start_token + token_num):
            ctx.loop(1)
            fill(ctx, acc_f32, 0.0, F32)
            yield from ctx.wait_until(
                ctx.window(), win.combine_flag(cur_idx * K), K * STATUS_BYTES,
                SumEquals(F32, float(target), tolerance=0.5), state_ub, name="wait status",
                check_ns=vector_check_ns(ctx, target, F32))
            ctx.copy_out(ctx.window(), win.combine_flag(cur_idx * K), state_reset,
                         K * STATUS_BYTES, name="clear status")
            yield from barrier_all(ctx)
            for k in range(K):
                ctx.loop(1)
                scale = F32(ctx.ub_read(scales_ub, F32, 1, 4 * (cur_idx * K + k))[0])
                ctx.copy_in(row_bf16, ctx.window(), win.combine_row(cur_idx * K + k), 2 * H)
                yield from barrier_all(ctx)
                yield from weigh(ctx, H, row_bf16, row_f32, acc_f32, scale)
            yield from barrier_all(ctx)

            def rint() -> None:
                out_bf16.view(BF16, H)[:] = acc_f32.view(F32, H).astype(BF16)

            tile_op(ctx, "cast rint", H, F32, (acc_f32,), (out_bf16,), rint)
            yield from barrier_all(ctx)
            ctx.copy_out(ctx.tensor("combine_out"), cur_idx * s.token_bytes, out_bf16,
                         s.token_bytes)


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
