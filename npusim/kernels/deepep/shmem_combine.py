"""ShmemMoeCombineNormal (sgl-kernel-npu `shmem_ver`, csrc/deepep/ops/op_kernel/
shmem_moe_combine_normal.h, Process 331-339) as a per-core program.

InitMagic (148-158) toggles the core's u64 at shmem_ptr + 50 KiB + core * 512 (the result
is never used). ReadBufferFromRemote (273-329): the local tokens split over the cores; a
core loads the whole epRecvCount (= putOffset) once, then per token its K weights, expert
ids and sendTokenIdx, and ReadBufferAndWeightedSum (235-271): per k, row = putOffset[e R + r]
+ sendTokenIdx[k] on rank e / L, **a remote MTE2 read** of its 2H bytes straight from that
rank's recv_x through shmem_ptr, Cast to fp32, Muls by the weight, Add; Cast RINT; the row
to combined_x. No flag is polled: the rows are read as they are. Then SyncAll<true> and
shmem_barrier_all (no PE reuses its recv_x before every PE has read it).
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.dispatch import flip_core_flag
from npusim.kernels.deepep.shmem_layout import ShmemHeap, combine_ub, then_barrier
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

I32, F32 = np.int32, np.float32


def shmem_combine_program(t: DeepepTiling):
    magic = ShmemHeap(t).combine_magic
    return then_barrier(t, "read_from_remote", read_buffer_from_remote,
                        init=lambda ctx: flip_core_flag(ctx, magic(ctx.core_id)))  # InitMagic


def read_buffer_from_remote(ctx: KernelContext, t: DeepepTiling) -> Wait:
    t0, t1 = split_to_core(t.BS, ctx.num_cores, ctx.core_id)
    if t1 <= t0:
        return
    ctx.ub.reset()
    ub = {name: ctx.alloc(name, n) for name, n in combine_ub(t)}
    W, K, H = t.W, t.K, t.H
    yield from ctx.wait(ctx.copy_in(ub["all_recv_count"], ctx.tensor("ep_send_counts"), 0,
                                    4 * W * t.E))
    put_offset = ctx.ub_read(ub["all_recv_count"], I32, W * t.E, ops=0)
    out = ctx.tensor("combined_x")
    for tok in range(t0, t1):
        ctx.loop(1)
        yield from ctx.pipe_barrier("mte3")  # SyncFunc<MTE3_MTE2>: x_out has left
        ctx.copy_in(ub["topk_weights"], ctx.tensor("expert_scales"), 4 * tok * K, 4 * K)
        ctx.copy_in(ub["topk_idx"], ctx.tensor("expand_ids"), 4 * tok * K, 4 * K)
        ctx.copy_in(ub["send_token_idx"], ctx.tensor("send_token_idx_small"), 4 * tok * K,
                    4 * K)
        yield from ctx.pipe_barrier("mte2")  # SyncFunc<MTE2_S>
        weights = ctx.ub_read(ub["topk_weights"], F32, K, ops=0)
        ids = ctx.ub_read(ub["topk_idx"], I32, K, ops=0)
        slots = ctx.ub_read(ub["send_token_idx"], I32, K, ops=0)
        yield from read_buffer_and_weighted_sum(ctx, t, ub, put_offset, weights, ids, slots)
        ctx.copy_out(out, tok * 2 * H, ub["x_out"], 2 * H, name="combined_x")


def read_buffer_and_weighted_sum(ctx: KernelContext, t: DeepepTiling, ub: dict, put_offset,
                                 weights, ids, slots) -> Wait:
    """sum = 0; per k in order: the row read from its expert's rank, sum += f32(row) * w;
    x_out = bf16(sum) with RINT."""
    H, L, W = t.H, t.L, t.W
    dt = t.shape.np_dtype
    acc, x_out = ub["sum_float"], ub["x_out"]
    functional = not t.timing_only
    ctx.vector("duplicate", H, F32, writes=[acc], fn=lambda: acc.bytes_at(0, 4 * H).fill(0))
    used: list = [None, None]  # the vector run that last read each queue buffer
    for k in range(t.K):
        ctx.scalar(6)  # w, e, the row, dst, the address
        e = int(ids[k])
        row = int(put_offset[e * W + ctx.rank_id]) + int(slots[k])
        src, at = ctx.shmem.ptr("x", e // L)
        p = k & 1
        buf = ub[f"weighted_sum{p}"]
        if used[p] is not None:  # AllocTensor: FreeTensor came after that buffer's Cast
            yield from ctx.wait(used[p])
        # EnQue / DeQue: the vector waits for the read; the next read overlaps its work
        yield from ctx.wait(ctx.copy_in(buf, src, at + row * 2 * H, 2 * H, name="read_row"))
        w = F32(weights[k])

        def add(q=buf, w=w) -> None:
            s = acc.bytes_at(0, 4 * H).view(F32)
            s[:] = s + q.bytes_at(0, 2 * H).view(dt).astype(F32) * w

        used[p] = ctx.vector_seq("weighted_sum", [("cast", H, F32), ("muls", H, F32),
                                                  ("add", H, F32)],
                                 reads=[buf], writes=[ub["token_float"], ub["weighted_mul"], acc],
                                 fn=add if functional else None)

    def cast() -> None:
        x_out.bytes_at(0, 2 * H)[:] = acc.bytes_at(0, 4 * H).view(F32).astype(dt).view(np.uint8)

    ctx.vector("cast_rint", H, F32, reads=[acc], writes=[x_out],
               fn=cast if functional else lambda: x_out.bytes_at(0, 2 * H).fill(0))
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
