"""FusedDeepMoe's program: one generator per core of the MIX launch, the phases in the
kernel's order (FDM.h:335-427; GMM1K operator() for the AIC 530-641 and the AIV
1520-1573; GMM2K 107-285).

- AIV sub-block 1: dispatch_send; sub-block 0: dispatch_recv, then swiglu (GMM1's
  epilogue); AIC: gmm1. Every core then SyncAll<false>;
- quant (every AIV): UpdateAndCleanInfo and BlockQuant;
- stage_barrier: PipeBarrier<PIPE_ALL>; the AIVs' CrossCoreBarrier<0, PIPE_MTE3> (catlass
  AIV_INTER_BLOCK_BARRIER, id 8) and CrossCoreSetFlag<2, PIPE_MTE3>(0); the AIC waits 0;
- gmm2: the AIC's blocks, both AIVs' dequant epilogue with the combine's sends;
- combine (sub-block 0: AllToAllSend) and weight_sum (sub-block 1: ReducePermute).
"""

from __future__ import annotations

from typing import Any

from npusim.kernels.moe_layer.fused_deep_moe import combine, gmm1, gmm2, quant
from npusim.kernels.moe_layer.fused_deep_moe.recv import dispatch_recv
from npusim.kernels.moe_layer.fused_deep_moe.roles import LaunchTiling
from npusim.kernels.moe_layer.fused_deep_moe.send import dispatch_send
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

AIV_INTER_BLOCK_BARRIER = 8  # catlass arch/cross_core_sync.hpp:11
GMM1_AIV_FINISHED = 0  # FDM.h:409: Arch::CrossCoreFlag gmm1AivFinished{0}
WORKERS = {"dispatch_send": "aiv1", "dispatch_recv": "aiv0", "gmm1": "aic",
           "swiglu": "aiv0", "quant": "aiv", "stage_barrier": "aiv", "gmm2": "aic",
           "combine": "aiv0", "weight_sum": "aiv1"}
HIDES = {"dispatch": ("gmm1",), "combine": ("gmm2",)}
WAITS = ("stage_barrier",)  # the barrier's waiting, not a stage of work


def fused_deep_moe_program(lt: LaunchTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        b = ctx.block_idx
        if ctx.core.kind.name == "aic":
            yield from _aic(ctx, lt, b)
        else:
            yield from _aiv(ctx, lt, b, ctx.sub_block_idx)
    return program


def _aic(ctx: KernelContext, lt: LaunchTiling, b: int) -> Wait:
    with ctx.phase("gmm1"):
        yield from gmm1.gmm1_aic(ctx, lt, b)
    yield from ctx.sync_all(all_kinds=True)  # SyncAll<false>, between the stages
    with ctx.phase("stage_barrier"):
        yield from ctx.drain()
        yield from ctx.cross_core_wait_flag(GMM1_AIV_FINISHED)
    for local in ctx.core.buffers.values():  # GMM2's BlockMmad takes L1 / L0 afresh
        local.reset()
    with ctx.phase("gmm2"):
        yield from gmm2.gmm2_aic(ctx, lt, b)
    yield from ctx.drain()


def _aiv(ctx: KernelContext, lt: LaunchTiling, b: int, sub: int) -> Wait:
    if sub == 1:
        with ctx.phase("dispatch_send"):
            yield from dispatch_send(ctx, lt, b)
    else:
        with ctx.phase("dispatch_recv"):
            yield from dispatch_recv(ctx, lt, b)
        ctx.ub.reset()
        with ctx.phase("swiglu"):
            yield from gmm1.gmm1_epilogue(ctx, lt, b)
    yield from ctx.drain()
    ctx.ub.reset()
    yield from ctx.sync_all(all_kinds=True)
    with ctx.phase("quant"):
        yield from quant.update_and_clean_info(ctx, lt, b, sub)
        yield from quant.block_quant(ctx, lt, b, sub)
    ctx.ub.reset()
    with ctx.phase("stage_barrier"):
        yield from ctx.drain()
        ctx.cross_core_set_flag(0, AIV_INTER_BLOCK_BARRIER, "mte3")
        yield from ctx.cross_core_wait_flag(AIV_INTER_BLOCK_BARRIER)
        ctx.cross_core_set_flag(2, GMM1_AIV_FINISHED, "mte3")
    with ctx.phase("gmm2"):
        yield from gmm2.gmm2_aiv(ctx, lt, b, sub)
    yield from ctx.drain()
    ctx.ub.reset()
    if sub == 0:
        with ctx.phase("combine"):
            yield from combine.all_to_all_send(ctx, lt, b)
    else:
        with ctx.phase("weight_sum"):
            yield from combine.reduce_permute(ctx, lt, b)
    yield from ctx.drain()
