"""FusedDeepMoe A5's one MIX launch (fused_deep_moe_a5.h Process, 360-441), per core:
block b is AIC b with AIVs 2b (sub-block 0, even: receive) and 2b + 1 (odd: send).

1. DispatchMxGmm1SwigluQuantFunc: AIV1 dispatch_send, AIV0 dispatch_recv (dispatch.py);
   AIC gmm1, both AIVs swiglu (gmm1.py); SyncAll<false> over AIC and AIV;
   UpdateAndCleanInfo (the group list, expert_token_nums, the status cleared); every AIV
   quant (quant.py);
2. stage_barrier: PipeBarrier<PIPE_ALL>, the AIVs' CrossCoreBarrier<0> and
   CrossCoreSetFlag<2>(0), the AIC's CrossCoreWaitFlag(0) (fused_deep_moe_a5.h 416-428);
3. MxGmm2CastCombineFunc: AIC gmm2, the AIVs combine (the GMM2 epilogue and its sends),
   then weight_sum (AllToAllSend on AIV0, ReducePermute on AIV1) (gmm2.py).

Phases are the A5 profiler's stages (fused_deep_moe_a5_profile_stage.h 8-19).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.fused_deep_moe_a5.dispatch import recv_core, send_core
from npusim.kernels.moe_layer.fused_deep_moe_a5.gmm1 import gmm1_aic, swiglu_aiv
from npusim.kernels.moe_layer.fused_deep_moe_a5.gmm2 import (
    all_to_all_send,
    cast_combine_aiv,
    gmm2_aic,
    reduce_permute,
)
from npusim.kernels.moe_layer.fused_deep_moe_a5.quant import post_swiglu_quant
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import A5Tiling
from npusim.kernels.moe_layer.fused_deep_moe_a5.window import A5Window
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

AIV_INTER_BLOCK_BARRIER = 8  # catlass arch/cross_core_sync.hpp: CrossCoreBarrier<0>'s id
GMM1_AIV_FINISHED = 0  # Arch::CrossCoreFlag gmm1AivFinished{0}


def fused_deep_moe_a5_program(t: A5Tiling) -> Any:
    w = A5Window(t)

    def program(ctx: KernelContext) -> Wait:
        b = ctx.block_idx
        if ctx.core.kind.name == "aic":
            yield from _aic(ctx, t, b)
        else:
            yield from _aiv(ctx, t, w, b, ctx.sub_block_idx)
    return program


def _aic(ctx: KernelContext, t: A5Tiling, b: int) -> Wait:
    with ctx.phase("gmm1"):
        counts, mmad = yield from gmm1_aic(ctx, t, b)
        yield from ctx.sync_all(all_kinds=True)
    with ctx.phase("stage_barrier"):
        yield from ctx.cross_core_wait_flag(GMM1_AIV_FINISHED)
    with ctx.phase("gmm2"):
        yield from gmm2_aic(ctx, t, b, counts, mmad)


def _aiv(ctx: KernelContext, t: A5Tiling, w: A5Window, b: int, sub: int) -> Wait:
    if sub == 1:
        with ctx.phase("dispatch_send"):
            yield from send_core(ctx, t, w, b)
    else:
        with ctx.phase("dispatch_recv"):
            yield from recv_core(ctx, t, w, b)
    ctx.ub.reset()
    with ctx.phase("swiglu"):
        counts = yield from swiglu_aiv(ctx, t, b, sub)
        yield from ctx.sync_all(all_kinds=True)
    ctx.ub.reset()
    with ctx.phase("quant"):
        yield from _update_and_clean(ctx, t, w, b, sub)
        yield from post_swiglu_quant(ctx, t, 2 * b + sub, sum(counts))
    with ctx.phase("stage_barrier"):
        yield from ctx.drain()
        ctx.cross_core_set_flag(0, AIV_INTER_BLOCK_BARRIER, "mte3")
        yield from ctx.cross_core_wait_flag(AIV_INTER_BLOCK_BARRIER)
        ctx.cross_core_set_flag(2, GMM1_AIV_FINISHED, "mte3")
    ctx.ub.reset()
    with ctx.phase("combine"):
        yield from cast_combine_aiv(ctx, t, w, b, sub, counts)
    ctx.ub.reset()
    with ctx.phase("weight_sum"):
        if sub == 0:
            yield from all_to_all_send(ctx, t, w, b)
        else:
            yield from reduce_permute(ctx, t, w, b)


def _update_and_clean(ctx: KernelContext, t: A5Tiling, w: A5Window, b: int, sub: int
                      ) -> Wait:
    """UpdateAndCleanInfo (G1 1241-1289): AIV0s zero their GMM1 soft-sync counter, the
    last AIV the group lines; the last receive core turns ep_send_count into the group
    list (cumulative, int64) and expert_token_nums (per expert)."""
    zeros = ctx.alloc("zeros", align_up(A5Window.group_line(t.L) - A5Window.group_line(0), 32))
    ctx.vector("duplicate", zeros.nbytes // 4, np.int32, writes=[zeros],
               fn=lambda: zeros.view(np.int32, zeros.nbytes // 4).fill(0))
    yield from ctx.pipe_barrier("vector")
    if sub == 0:
        ctx.copy_out(ctx.window(), A5Window.soft_sync(1, b), zeros, 32, name="clean_soft_sync")
    if 2 * b + sub == t.aiv_num - 1:
        ctx.copy_out(ctx.window(), A5Window.group_line(0), zeros,
                     A5Window.group_line(t.L) - A5Window.group_line(0),
                     name="clean_group_lines")
    if sub == 0 and b == t.block_dim - 1:
        buf = ctx.alloc("send_counts", align_up(4 * t.senders, 32))
        yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("ep_send_count"), 0, 4 * t.senders,
                                        name="load_ep_send_count"))
        run = buf.view(np.int32, t.senders).astype(np.int64)
        ends = run[t.W - 1::t.W]
        half = align_up(8 * t.L, 32)
        out = ctx.alloc("group_list", 2 * half)
        ctx.ub_write(out, 0, ends, ops=2 * t.L)
        ctx.ub_write(out, half, np.diff(ends, prepend=0), ops=t.L)
        ctx.copy_out(ctx.tensor("group_list"), 0, out, 8 * t.L, name="store_group_list")
        ctx.copy_out(ctx.tensor("expert_token_nums"), 0, out, 8 * t.L, src_offset=half,
                     name="store_expert_token_nums")
    yield from ctx.drain()
