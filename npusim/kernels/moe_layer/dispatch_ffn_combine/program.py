"""DispatchFFNCombine as one MIX launch (KERNEL_TYPE_MIX_AIC_1_2, block dim = the AIC
count; dispatch_ffn_combine_kernel.hpp operator() 194-205): block b is AIC b with AIVs
b (sub-block 0) and b + blocks (sub-block 1) in the kernel's AIV numbering
(coreIdx = block + subblock * blocks, 179-184). The routing step numbers AIVs as AscendC's
GetBlockIdx() does on a vector core, 2 b + sub-block.

Modelled so far, the dispatch half and GMM1:
AIV: init_routing (routing_quant.py), SyncAll; dispatch_send (the count all-gather and
the cumsums, pulls.py); dispatch_recv (the per-expert pulls, flag per expert to the AIC).
AIC: gmm1 (gmm.py) as each expert's rows are in.
Not yet: epilogue 1 (dequant-SwiGLU-quant in two phases), GMM2, CombineV2's PUTs, the
cross-rank sync and MoeTokenUnpermute, so `out` is not written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.overlap import layer_fields, note_compute, note_remote
from npusim.kernels.kernel import Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.moe_layer.dispatch_ffn_combine import gmm, pulls
from npusim.kernels.moe_layer.dispatch_ffn_combine.routing_quant import routing_quant
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import DfcTiling
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

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
    _spec("expert_token_nums", I32, lambda t, r: (t.L,), "[L] rows per local expert"),
    _spec("gm_c", F16, lambda t, r: (t.max_output, t.N), "[maxOutputSize, 2I] fp16: GMM1's "
          "C, expert-major"),
)
SCRATCH = (
    _spec("expanded_row_idx", I32, lambda t, r: (t.routes,), "route -> sorted position"),
    _spec("cumsum_mm", I32, lambda t, r: (t.W * t.L,), "rows from ranks 0..i per expert"),
    _spec("pre_sum_before_rank", I32, lambda t, r: (t.W * t.L,), "rank i's rows before this "
          "rank's expert g"),
    _spec("gm_a", I8, lambda t, r: (t.max_output, t.H), "pulled int8 rows, expert-major"),
    _spec("per_token_scale1", F32, lambda t, r: (t.max_output,), "their scales"),
)
PHASES = (
    Phase("init_routing", "AIVs below the gather's core count: moe_init_routing_quant_v2 "
          "(sort by expert, per-row dynamic int8 quant into the own segment)"),
    Phase("dispatch_send", "every AIV: the token-per-expert all-gather (puts), "
          "preSumBeforeRank; AIV 0: cumsumMM and expert_token_nums"),
    Phase("dispatch_recv", "AIV c: per local expert, remote GETs of its rows from rank c"),
    Phase("gmm1", "AIC: per expert once pulled, 128 x 256 blocks, FixPipe fp16 through the "
          "per-channel scale"),
)


WORKERS = {"init_routing": "aiv", "dispatch_send": "aiv", "dispatch_recv": "aiv",
           "gmm1": "aic"}
HIDES = {"dispatch": ("gmm1",)}


def dfc_program(t: DfcTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        if ctx.core.kind.name == "aic":
            with ctx.phase("gmm1"):
                yield from gmm.gmm1(ctx, t, lambda op: note_compute(ctx, op, "gmm1"))
            return
        block, sub = ctx.block_idx, ctx.sub_block_idx

        def remote(op: Any) -> Any:
            return note_remote(ctx, op, "dispatch")

        with ctx.phase("init_routing"):
            yield from routing_quant(ctx, t, 2 * block + sub)
            yield from ctx.sync_all()
        core = block + sub * t.aic
        with ctx.phase("dispatch_send"):
            yield from pulls.count_all_gather(ctx, t, core, remote)
            if core == 0:
                yield from pulls.cumsum_for_mm(ctx, t)
            else:
                yield from ctx.sync_all()
            ctx.cross_core_set_flag(pulls.SYNC_MODE2, 0, "mte3")
        with ctx.phase("dispatch_recv"):
            yield from pulls.pulls(ctx, t, core, remote)
    return program


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
                **layer_fields(call.run, call.cores, WORKERS, HIDES)}


DFC = DispatchFfnCombine()
