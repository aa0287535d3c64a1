"""CamMoeCombineNormal (csrc/deepep/ops/op_kernel/cam_moe_combine_normal.h, tiling key
13000: one round configured) as a per-core program; with more rounds configured the host
tiling picks the multi-round kernel (combine_rounds.py), which shares the per-token step.

InitMagic flips the core's magic_ (windowsExp + 975 KiB + core * 512); the window half is
magic_. selfSendCnt = ep_recv_count[E - 1] (the handle's send_head: rows this rank received).

- CopyBufferToShareAndSetStatus (229-289): the received rows split over the cores; per row,
  its (rank, token, k) from the handle, the row GM -> UB -> the **source rank's** window at
  half + 106 MiB + (token K + k) Align512(2H), PipeBarrier<PIPE_ALL>, then a 32 B entry of
  1.0 floats at half + 102 MiB + (token K + k) * 32;
- ReadBufferFromRemote (403-444): the local tokens split over the cores; per token,
  WaitBuffCopy polls its K entries until their sum is 8 * validK and clears them, then
  ReadBufferAndWeightedSum: per valid k the row from the own window, Cast to fp32, Muls by
  the weight, Add into the sum; Cast with RINT; the row to x.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.dispatch import flip_core_flag
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I32, F32 = np.int32, np.float32


def combine_program(t: DeepepTiling):
    def program(ctx: KernelContext) -> Wait:
        half = init_magic(ctx, t)
        recv = ctx.tensor("ep_recv_count")
        ctx.dcache.dcci_line(recv, 4 * (t.E - 1))
        sent = int(ctx.gm_read_scalar(recv, 4 * (t.E - 1), I32))
        with ctx.phase("copy_to_share"):
            yield from copy_buffer_to_share_and_set_status(ctx, t, half, sent)
        with ctx.phase("read_from_remote"):
            yield from read_buffer_from_remote(ctx, t, half)

    return program


def init_magic(ctx: KernelContext, t: DeepepTiling) -> int:
    return flip_core_flag(ctx, t.window.combine_magic(ctx.core_id))


def copy_buffer_to_share_and_set_status(ctx: KernelContext, t: DeepepTiling, half: int,
                                        sent: int) -> Wait:
    r0, r1 = split_to_core(sent, ctx.num_cores, ctx.core_id)
    if r1 <= r0:
        return
    n = r1 - r0
    K, H = t.K, t.H
    row = 2 * H
    ctx.ub.reset()
    state = ctx.alloc("state", 32)
    bufs = [ctx.alloc(f"local_copy{p}", align_up(row, 32)) for p in range(2)]
    info = ctx.alloc("src_info", align_up(12 * n, 32))
    ctx.vector("duplicate", 8, I32, writes=[state],
               fn=lambda: state.bytes_at(0, 32).view(F32).fill(1.0))
    yield from ctx.wait(ctx.copy_in(info, ctx.tensor("expand_idx"), 12 * r0, 12 * n))
    src_info = ctx.ub_read(info, I32, 3 * n, ops=0).reshape(n, 3)
    yield from ctx.pipe_barrier("vector")
    win = t.window
    x = ctx.tensor("x")
    for i in range(n):
        ctx.loop(1)
        ctx.scalar(4)  # index, srcRankId, srcTokenId, srcTopkId
        src, tok, k = (int(v) for v in src_info[i])
        buf = bufs[i & 1]
        yield from ctx.wait(ctx.copy_in(buf, x, (r0 + i) * row, row, name="load_row"))
        slot = tok * K + k
        ctx.put(src, win.combine_data(half, slot), buf, row, name="copy_to_share")
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
        ctx.put(src, win.combine_status(half, slot), state, 32, name="set_status")
    yield from ctx.pipe_barrier("mte3")  # SyncFunc<MTE3_S>


def read_buffer_from_remote(ctx: KernelContext, t: DeepepTiling, half: int) -> Wait:
    t0, t1 = split_to_core(t.BS, ctx.num_cores, ctx.core_id)
    if t1 <= t0:
        return
    n = t1 - t0
    K = t.K
    ctx.ub.reset()
    b = recv_buffers(ctx, t)
    w_buf = ctx.alloc("topk_weights", align_up(4 * n * K, 32))
    i_buf = ctx.alloc("token_idx", align_up(4 * n * K, 32))
    ctx.copy_in(w_buf, ctx.tensor("topk_weights"), 4 * t0 * K, 4 * n * K)
    ctx.copy_in(i_buf, ctx.tensor("topk_idx"), 4 * t0 * K, 4 * n * K)
    yield from ctx.pipe_barrier("mte2")
    weights = ctx.ub_read(w_buf, F32, n * K, ops=0).reshape(n, K)
    ids = ctx.ub_read(i_buf, I32, n * K, ops=0).reshape(n, K)
    win = t.window
    for i in range(n):
        tok = t0 + i
        yield from receive_token(ctx, t, b, ids[i], weights[i], win.combine_status(half, tok * K),
                                 lambda k, tok=tok: win.combine_data(half, tok * K + k), tok)
    yield from ctx.pipe_barrier("mte3")


@dataclass(frozen=True)
class RecvBuffers:
    """ReadBufferFromRemote's UB: x_out, the fp32 row buffers, the weighted-sum queue and
    the K status entries WaitBuffCopy polls."""

    x_out: Any
    token_float: Any
    mul: Any
    acc: Any
    queue: tuple[Any, Any]
    state: Any


def recv_buffers(ctx: KernelContext, t: DeepepTiling) -> RecvBuffers:
    H, K = t.H, t.K
    row = 2 * H
    x_out = ctx.alloc("x_out", align_up(row, 32))
    token_float = ctx.alloc("token_float", align_up(4 * H, 32))
    mul = ctx.alloc("weighted_mul", align_up(4 * H, 256))
    acc = ctx.alloc("sum_float", align_up(4 * H, 32))
    queue = (ctx.alloc("weighted_sum0", align_up(row, 32)),
             ctx.alloc("weighted_sum1", align_up(row, 32)))
    state = ctx.alloc("state", 32 * K)
    ctx.alloc("temp_state", 32 * K)
    return RecvBuffers(x_out, token_float, mul, acc, queue, state)


def receive_token(ctx: KernelContext, t: DeepepTiling, b: RecvBuffers, ids: Any, weights: Any,
                  status_at: int, data_at: Callable[[int], int], x_row: int) -> Wait:
    """WaitBuffCopy (the K entries at `status_at` sum to 8 * validK, then cleared),
    SyncFunc<MTE3_V>, ReadBufferAndWeightedSum (each valid k's row at data_at(k)) into
    row `x_row` of x."""
    K, H, E = t.K, t.H, t.E
    dt = t.shape.np_dtype
    row = 2 * H
    state, acc, x_out = b.state, b.acc, b.x_out
    valid = [k for k in range(K) if 0 <= int(ids[k]) < E]
    ctx.loop(K)
    ctx.scalar(2 * K)
    yield from ctx.wait_until(ctx.window(), status_at, 32 * K,
                              SumEquals(F32, 8.0 * len(valid)), state, name="wait_buff_copy")
    ctx.vector("sum", 8 * K, F32, reads=[state])
    ctx.vector("duplicate", 8 * K, F32, writes=[state],
               fn=lambda: state.bytes_at(0, 32 * K).fill(0))
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(ctx.window(), status_at, state, 32 * K, name="clear_status")
    ctx.vector("duplicate", H, F32, writes=[acc], fn=lambda: acc.bytes_at(0, 4 * H).fill(0))
    functional = not t.timing_only
    for j, k in enumerate(valid):
        buf = b.queue[j & 1]
        yield from ctx.pipe_barrier("vector")  # the queue buffer is free again
        yield from ctx.wait(ctx.copy_in(buf, ctx.window(), data_at(k), row, name="read_row"))
        w = F32(weights[k])

        def add(q: Any = buf, w: F32 = w) -> None:
            s = acc.bytes_at(0, 4 * H).view(F32)
            s[:] = s + q.bytes_at(0, row).view(dt).astype(F32) * w

        ctx.vector_seq("weighted_sum", [("cast", H, F32), ("muls", H, F32), ("add", H, F32)],
                       reads=[buf], writes=[b.token_float, b.mul, acc],
                       fn=add if functional else None)
    yield from ctx.pipe_barrier("mte3")  # x_out of the previous token has left

    def cast() -> None:
        x_out.bytes_at(0, row)[:] = acc.bytes_at(0, 4 * H).view(F32).astype(dt).view(np.uint8)

    # timing-only: the zeros the skipped sums leave, not the UB's stale bytes (the status
    # entries' 1.0 among them), which would back every page of combined_x
    ctx.vector("cast_rint", H, F32, reads=[acc], writes=[x_out],
               fn=cast if functional else lambda: x_out.bytes_at(0, row).fill(0))
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(ctx.tensor("combined_x"), x_row * row, x_out, row, name="x")
