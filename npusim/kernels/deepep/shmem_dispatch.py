"""ShmemMoeDispatchNormal (sgl-kernel-npu `shmem_ver`, csrc/deepep/ops/op_kernel/
shmem_moe_dispatch_normal.h, Process 437-445) as a per-core program.

InputToDstOutput (256-335): the BS K pairs split over the cores (the first BS K % C one
more); a core loads the whole putOffset [R E] and its pairs' expert ids and
sendTokenIdx, then per pair (e, idx): row = putOffset[e R + r] + idx on rank e / L, the token
GM -> UB (INT8: QuantProcess, the scale after the row), and **one MTE3 put straight into
that rank's expandXOut** at shmem_ptr(expandXOut, dst) + row Align32(H item) (INT8: then the
4 B scale into its dynamicScalesOut[row]); two queue buffers, so two rows in flight. No
window record, no status, no receiver step: the rows are where they belong when they land.
Then SyncAll<true> and shmem_barrier_all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.dispatch import quantise
from npusim.kernels.deepep.shmem_layout import (
    dispatch_ub,
    expand_row_bytes,
    then_barrier,
)
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

I32 = np.int32


def shmem_dispatch_program(t: DeepepTiling):
    return then_barrier(t, "input_to_dst_output", input_to_dst_output)


def input_to_dst_output(ctx: KernelContext, t: DeepepTiling) -> Wait:
    p0, p1 = split_to_core(t.BS * t.K, ctx.num_cores, ctx.core_id)
    if p1 <= p0:
        return
    ctx.ub.reset()
    ub = {name: ctx.alloc(name, n) for name, n in dispatch_ub(t)}
    W, E, K, H, L = t.W, t.E, t.K, t.H, t.L
    yield from ctx.wait(ctx.copy_in(ub["put_offset"], ctx.tensor("put_offset"), 0, 4 * W * E))
    put_offset = ctx.ub_read(ub["put_offset"], I32, W * E, ops=0)
    n = p1 - p0
    ctx.copy_in(ub["expert_ids"], ctx.tensor("expert_ids"), 4 * p0, 4 * n)
    ctx.copy_in(ub["send_token_idx"], ctx.tensor("send_token_idx_small"), 4 * p0, 4 * n)
    yield from ctx.pipe_barrier("mte2")  # SyncFunc<MTE2_S>
    ids = ctx.ub_read(ub["expert_ids"], I32, n, ops=0)
    idx = ctx.ub_read(ub["send_token_idx"], I32, n, ops=0)
    quant = t.quant == "int8"
    outs = [ub["x_out0"], ub["x_out1"]] if quant else [ub["x_queue0"], ub["x_queue1"]]
    stride = expand_row_bytes(t)
    item = t.shape.np_dtype.itemsize
    x = ctx.tensor("x")
    last: list[list[Any]] = [[], []]
    for i in range(n):
        ctx.loop(1)
        e = int(ids[i])
        ctx.scalar(6)  # e, dst, idx, the putOffset load, the row, the address
        dst, row = e // L, int(put_offset[e * W + ctx.rank_id]) + int(idx[i])
        _, rows_at = ctx.shmem.ptr("expand_x", dst)
        p = i & 1
        if last[p]:  # AllocTensor: this buffer's previous put has read it
            yield from ctx.wait(*last[p])
        token = (p0 + i) // K
        if quant:
            xin = ub[f"x_in{p}"]
            yield from ctx.wait(ctx.copy_in(xin, x, token * H * item, H * item,
                                            name="load_token"))
            quantise(ctx, t, xin, outs[p])
            yield from ctx.pipe_barrier("vector")
        else:
            yield from ctx.wait(ctx.copy_in(outs[p], x, token * H * item, H * item,
                                            name="load_token"))
        last[p] = [ctx.put(dst, rows_at + row * stride, outs[p], stride, name="expand_x")]
        if quant:
            _, scales_at = ctx.shmem.ptr("dynamic_scales", dst)
            last[p].append(ctx.put(dst, scales_at + 4 * row, outs[p], 4,
                                   src_offset=t.scale_offset, name="dynamic_scales"))
