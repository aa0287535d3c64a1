"""DispatchFFNCombine as one MIX launch (KERNEL_TYPE_MIX_AIC_1_2, block dim = the AIC
count; dispatch_ffn_combine_kernel.hpp operator() 202-215): block b is AIC b with AIVs
b (sub-block 0) and b + blocks (sub-block 1) in the kernel's AIV numbering
(coreIdx = block + subblock * blocks, 186-191). The routing step numbers AIVs as AscendC's
GetBlockIdx() does on a vector core, 2 b + sub-block.

AIV (DispatchAndCombine 734-927): init_routing (routing_quant.py), SyncAll;
dispatch_send (the count all-gather and the cumsums, pulls.py); dispatch_recv (the
per-expert pulls, a flag per expert to the AIC); swiglu (epilogue 1's two phases,
epilogues.py); combine (CombineV2's PUTs per GMM2 block, combine.py), SyncAll and the
token-per-expert reset; stage_barrier (the cross-rank sync); weight_sum (sub-block 1:
MoeTokenUnpermute, unpermute.py).
AIC: gmm1 as each expert's rows are in, the C2V flags; gmm2 after the first V2C flag
(gmm.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import layer_fields, note_compute, note_remote
from npusim.kernels.kernel import Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.moe_layer.dispatch_ffn_combine import combine, epilogues, gmm, pulls
from npusim.kernels.moe_layer.dispatch_ffn_combine.routing_quant import routing_quant
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import DfcTiling
from npusim.kernels.moe_layer.dispatch_ffn_combine.unpermute import unpermute
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I8, I32, I64, F32, F16 = (const(np.int8), const(np.int32), const(np.int64),
                          const(np.float32), const(np.float16))


def _spec(name: str, dtype: Any, shape: Any, help_: str) -> TensorSpec:
    return TensorSpec(name, dtype, shape, help_)


INPUTS = (
    _spec("x", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 tokens (a)"),
    _spec("expert_ids", I32, lambda t, r: (t.BS, t.K), "[BS, K] global expert ids"),
    _spec("w1", I8, lambda t, r: (t.L, t.H, t.N), "[L, H, 2I] int8 (gate, then up)"),
    _spec("scale1", I64, lambda t, r: (t.L, t.N), "[L, 2I] int64 holding fp32 bits"),
    _spec("w2", I8, lambda t, r: (t.L, t.N // 2, t.H), "[L, I, H] int8"),
    _spec("scale2", I64, lambda t, r: (t.L, t.H), "[L, H] int64 holding fp32 bits"),
    _spec("probs", F32, lambda t, r: (t.BS, t.K), "[BS, K] fp32 routing weights"),
)
OUTPUTS = (
    _spec("out", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 combined output"),
    _spec("expert_token_nums", I32, lambda t, r: (t.L,), "[L] rows per local expert"),
)
SCRATCH = (
    _spec("expanded_row_idx", I32, lambda t, r: (t.routes,), "route -> sorted position"),
    _spec("sort_workspace", I32, lambda t, r: (2 * align_up(t.routes, 8),),
          "one-core sort: sorted ids, then their routes"),
    _spec("assist", I32, lambda t, r: (256,), "MoeV2SrcToDstOp's assist table"),
    _spec("cumsum_mm", I32, lambda t, r: (t.W * t.L,), "rows from ranks 0..i per expert"),
    _spec("pre_sum_before_rank", I32, lambda t, r: (t.W * t.L,), "rank i's rows before this "
          "rank's expert g"),
    _spec("gm_a", I8, lambda t, r: (t.max_output, t.H), "pulled int8 rows, expert-major"),
    _spec("per_token_scale1", F32, lambda t, r: (t.max_output,), "their scales"),
    _spec("gm_c", F16, lambda t, r: (t.max_output, t.N), "GMM1's C, fp16, expert-major"),
    _spec("gm_permuted_token", I8, lambda t, r: (t.max_output, t.N // 2), "SwiGLU, int8"),
    _spec("per_token_scale2", F32, lambda t, r: (t.max_output,), "their scales"),
    _spec("gm_c2", F16, lambda t, r: (t.max_output, t.H), "GMM2's C, fp16"),
)
PHASES = (
    Phase("init_routing", "AIVs below the gather's core count: moe_init_routing_quant_v2 "
          "(sort by expert, per-row dynamic int8 quant into the own segment)"),
    Phase("dispatch_send", "every AIV: the token-per-expert all-gather (puts), "
          "preSumBeforeRank; AIV 0: cumsumMM and expert_token_nums"),
    Phase("dispatch_recv", "AIV c: per local expert, remote GETs of its rows from rank c"),
    Phase("gmm1", "AIC: per expert once pulled, 128 x 256 blocks, FixPipe fp16 through the "
          "per-channel scale"),
    Phase("swiglu", "sub-block-1 AIVs: dequant-SwiGLU-quant of experts 0..L-2; then every "
          "AIV: the last expert"),
    Phase("gmm2", "AIC: per expert, 128 x 256 blocks of the SwiGLU rows, fp16 C"),
    Phase("combine", "both AIVs of a block: its GMM2 blocks in 16-row chunks, dequant to "
          "bf16, PUT to the source ranks"),
    Phase("stage_barrier", "every AIV: the cross-rank state exchange"),
    Phase("weight_sum", "sub-block-1 AIVs: MoeTokenUnpermute, the weighted sum"),
)


WORKERS = {"init_routing": "aiv", "dispatch_send": "aiv", "dispatch_recv": "aiv",
           "gmm1": "aic", "swiglu": "aiv", "gmm2": "aic", "combine": "aiv",
           "stage_barrier": "aiv", "weight_sum": "aiv1"}
HIDES = {"dispatch": ("gmm1",), "combine": ("gmm2",)}
WAITS = ("stage_barrier",)
AIC_BUFFERS = ("l1", "l0a", "l0b", "l0c")


def dfc_program(t: DfcTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        if ctx.core.kind.name == "aic":
            yield from _aic(ctx, t)
        else:
            yield from _aiv(ctx, t)
    return program


def _aic(ctx: KernelContext, t: DfcTiling) -> Wait:
    def note(op: Any, tag: str) -> Any:
        return note_compute(ctx, op, tag)

    with ctx.phase("gmm1"):
        yield from gmm.gmm1(ctx, t, lambda op: note(op, "gmm1"))
    for name in AIC_BUFFERS:  # GMM2's BlockMmad takes the same L1 / L0 space
        ctx.core.buffers[name].reset()
    with ctx.phase("gmm2"):
        yield from gmm.gmm2(ctx, t, lambda op: note(op, "gmm2"))


def _aiv(ctx: KernelContext, t: DfcTiling) -> Wait:
    block, sub = ctx.block_idx, ctx.sub_block_idx
    core = block + sub * t.aic

    def remote(tag: str) -> Any:
        return lambda op: note_remote(ctx, op, tag)

    with ctx.phase("init_routing"):
        yield from routing_quant(ctx, t, 2 * block + sub)
        yield from ctx.sync_all()
    ctx.ub.reset()
    with ctx.phase("dispatch_send"):
        yield from pulls.count_all_gather(ctx, t, core, remote("dispatch"))
        if core == 0:
            yield from pulls.cumsum_for_mm(ctx, t)
        else:
            yield from ctx.sync_all()
        ctx.cross_core_set_flag(pulls.SYNC_MODE2, 0, "mte3")
    ctx.ub.reset()
    with ctx.phase("dispatch_recv"):
        yield from pulls.pulls(ctx, t, core, remote("dispatch"))
    ctx.ub.reset()
    with ctx.phase("swiglu"):
        yield from _swiglu(ctx, t, core)
    ctx.ub.reset()
    with ctx.phase("combine"):
        yield from combine.combine_v2(ctx, t, remote("combine"))
        yield from ctx.sync_all()
        if core == t.aiv - 1:
            yield from _reset_token_per_expert(ctx, t)
    ctx.ub.reset()
    with ctx.phase("stage_barrier"):
        yield from combine.cross_rank_sync(ctx, t, remote("combine"))
    if sub == 1:
        ctx.ub.reset()
        with ctx.phase("weight_sum"):
            yield from unpermute(ctx, t)


def _swiglu(ctx: KernelContext, t: DfcTiling, core: int) -> Wait:
    """Epilogue 1's two phases (845-885)."""
    d1, d2 = epilogues.row_counts(ctx, t, lambda g: pulls.current_m(ctx, t, g))
    bufs = epilogues.SwigluBuffers(ctx, t)
    half = t.aiv // 2  # epilogueCoreNum = aivNum / 2
    yield from ctx.cross_core_wait_flag(gmm.SYNC_C2V)
    yield from ctx.sync_all()
    if d1 and core >= t.aiv - half:
        yield from epilogues.swiglu_rows(ctx, t, bufs, 0, d1, core - (t.aiv - half), half)
    yield from ctx.sync_all()
    ctx.cross_core_set_flag(gmm.SYNC_MODE2, gmm.SYNC_V2C, "mte3")
    if 0 < t.epilogue_granularity < t.L:
        yield from ctx.cross_core_wait_flag(gmm.SYNC_C2V)
        yield from ctx.sync_all()
        if d2:
            yield from epilogues.swiglu_rows(ctx, t, bufs, d1, d2, core, t.aiv)
        yield from ctx.sync_all()
        ctx.cross_core_set_flag(gmm.SYNC_MODE2, gmm.SYNC_V2C, "mte3")


def _reset_token_per_expert(ctx: KernelContext, t: DfcTiling) -> Wait:
    """ResetTokenPerExpert (662-675): the last AIV zeroes the token-per-expert matrix."""
    n = t.W * t.segment.count_row
    buf = ctx.alloc("zeros", n * 4)
    yield from ctx.wait(ctx.vector("duplicate", n, np.int32, writes=[buf],
                                   fn=lambda: buf.view(np.int32, n).fill(0)))
    yield from ctx.wait(ctx.copy_out(ctx.window(), t.segment.count_at(0, 0, 0), buf, n * 4,
                                     name="data_copy"))


class DispatchFfnCombine(Kernel):
    name = "dispatch_ffn_combine"
    phases = PHASES
    inputs = INPUTS
    outputs = OUTPUTS
    scratch = SCRATCH
    core_kind = "mix_aic_1_2"

    def program(self, tiling: DfcTiling) -> Any:
        return dfc_program(tiling)

    def cores(self, tiling: DfcTiling) -> int | None:
        return tiling.aic

    def fields(self, call: Call) -> dict[str, Any]:
        return {"expert_token_nums": [[int(v) for v in o["expert_token_nums"]]
                                      for o in call.outputs],
                **layer_fields(call.run, call.cores, WORKERS, HIDES, WAITS)}


DFC = DispatchFfnCombine()
