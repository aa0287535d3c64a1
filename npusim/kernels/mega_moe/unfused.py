"""Family ``mega_moe_unfused``: the same MoE layer as three kernels, to show what the
fusion buys. The CANN sample's dispatch (MXFP8 E5M2, one byte per element as MegaMoE's
FP8 tokens), then `expert_gemms`, the two expert projections as modelled cube work on a
MIX launch (MegaMoE's own Catlass tiles, SwiGLU epilogue and ping-pong GEMM2 outputs,
but every row already received and the GEMM2 tiles stored to a local [A, H] bf16
output), then the CANN sample's combine (bf16). Each kernel starts when the previous one
has ended on every rank, as separate launches do.

Only the timing is the point: the GEMM kernel runs on zero-filled received rows (its
bytes move and its cube cost is what the fused kernel's is for the same row counts), and
the combine sums the CANN chain's identity-expert rows, so `y` is not the layer's output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from npusim.kernels.cann_sample import family as cann
from npusim.kernels.common.limits import DISPATCH_V3_LIMITS
from npusim.kernels.common.part import PartKernel
from npusim.kernels.exchange import ExchangeFamily
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Kernel, Phase, TensorSpec, const
from npusim.kernels.mega_moe import sync as hw
from npusim.kernels.mega_moe.cube import (
    first_projection_aic,
    first_projection_aiv,
    second_projection_aic,
    second_projection_aiv,
)
from npusim.kernels.mega_moe.family import FAMILY as MEGA
from npusim.kernels.mega_moe.family import INPUTS as MEGA_INPUTS
from npusim.kernels.mega_moe.family import SCRATCH as MEGA_SCRATCH
from npusim.kernels.mega_moe.inputs import harness_weights
from npusim.kernels.mega_moe.program import ExpertState
from npusim.kernels.mega_moe.tiling import WAVE, MegaTiling
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

CANN_OPTIONS = {"dispatch_quant": "mxfp8", "combine_quant": "none", "mxfp8_saturate": True,
                "combine_recip": True, "expert_token_nums_type": "count"}


@dataclass(frozen=True)
class UnfusedTiling:
    mega: MegaTiling
    cann: Any  # the CANN sample's MoeTiling of the same shape in bf16
    chain: dict[str, Any]  # dispatch's outputs, kept for combine (op_inputs)

    @property
    def world(self) -> int:
        return self.mega.world

    @property
    def cores(self) -> int:
        return self.mega.cores


def _mega(spec: TensorSpec) -> TensorSpec:
    return TensorSpec(spec.name, lambda t: spec.dtype(t.mega),
                      lambda t, r: spec.shape(t.mega, r), spec.help)


class ExpertGemms(Kernel):
    name = "expert_gemms"
    phases = (Phase("first_projection", "AIC: GEMM1 (gate, up) tiles into AIV0's UB; AIV0: "
                    "SwiGLU + requant epilogue"),
              Phase("second_projection", "AIC: GEMM2 tiles into AIV0's UB, ping-pong; AIV0: "
                    "one strided store of each tile to expert_output"))
    inputs = (*(_mega(s) for s in MEGA_INPUTS if s.name.startswith("weight")),
              TensorSpec("expert_token_counts", const(np.int32), lambda t, r: (t.mega.L,),
                         "[L] rows per local expert (dispatch's expert_token_nums)"),
              TensorSpec("input_ready", const(np.int32),
                         lambda t, r: (t.mega.L * t.mega.wave_slots,),
                         "every wave's rows, all received"))
    outputs = (TensorSpec("expert_output", const(BF16), lambda t, r: (t.mega.max_recv, t.mega.H),
                          "[A, H] bf16 GEMM2 rows by expert"),)
    scratch = tuple(_mega(s) for s in MEGA_SCRATCH
                    if s.name not in ("input_ready", "received_token_counts",
                                      "routing_metadata"))
    core_kind = "mix_aic_1_2"

    def program(self, tiling: UnfusedTiling) -> Any:
        return expert_gemms_program(tiling.mega)


def expert_gemms_program(t: MegaTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        kind, b, sub = hw.role(ctx)
        if kind == "aiv" and sub == 1:
            return
        st = ExpertState(t)
        counts = ctx.tensor("expert_token_counts")
        ms = [int(ctx.gm_read_scalar(counts, 4 * e, np.int32)) for e in range(t.L)]
        aic = kind == "aic"
        for e, m in enumerate(ms):
            if m:
                with ctx.phase("first_projection"):
                    run = first_projection_aic if aic else first_projection_aiv
                    yield from run(ctx, t, b, e, m, sum(ms[:e]), st)
        if aic and st.vsync:
            yield from hw.wait_flag(ctx, 6)
        out = None if aic else ctx.tensor("expert_output")
        for e, m in enumerate(ms):
            if m:
                with ctx.phase("second_projection"):
                    if aic:
                        yield from second_projection_aic(ctx, t, b, e, m, sum(ms[:e]), st)
                    else:
                        yield from second_projection_aiv(ctx, t, b, e, m, sum(ms[:e]), st,
                                                         local=out)
        if aic:
            n = st.done_tiles
            for i in range(n - min(2, n), n):
                yield from hw.wait_flag(ctx, 6 + i % 2)
    return program


DISPATCH, GEMMS = PartKernel(cann.DISPATCH, "cann"), ExpertGemms()
COMBINE = PartKernel(cann.COMBINE, "cann")  # the CANN sample's kernels on the `cann` part


class MegaMoeUnfused(ExchangeFamily):
    name = "mega_moe_unfused"
    help = ("mega_moe's layer unfused, for comparison: cann_sample dispatch, the expert "
            "GEMMs as cube work, cann_sample combine (timing; y is not the layer's)")
    ops = (DISPATCH, GEMMS, COMBINE)
    runs = {"unfused": ("dispatch", "expert_gemms", "combine")}
    shape_limits = DISPATCH_V3_LIMITS  # its dispatch and combine are cann_sample's
    options = MEGA.options
    variants = MEGA.variants  # advise: op unfused only; the sample's MXFP8 dispatch
    dispatch_quants = MEGA.dispatch_quants
    combine_quants = MEGA.combine_quants

    def _cann_shape(self, shape: MoeShape) -> MoeShape:
        return replace(shape, dtype="bfloat16")

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> UnfusedTiling:
        mega = MEGA.tiling(shape, options, hardware, timing_only)
        c = cann.FAMILY.tiling(self._cann_shape(shape), CANN_OPTIONS, hardware, timing_only)
        return UnfusedTiling(mega, c, {})

    def window(self, tiling: UnfusedTiling) -> Any:
        return cann.FAMILY.window(tiling.cann)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        return (MEGA.misfit(shape, options, hardware, "mega_moe")
                or cann.FAMILY.misfit(self._cann_shape(shape), CANN_OPTIONS, hardware,
                                      "dispatch_combine"))

    def tiling_misfit(self, tiling: UnfusedTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        return (MEGA.tiling_misfit(tiling.mega, shape, options, hardware, "mega_moe")
                or cann.FAMILY.tiling_misfit(tiling.cann, self._cann_shape(shape),
                                             CANN_OPTIONS, hardware, "dispatch_combine"))

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        ins = cann.FAMILY.make_inputs(self._cann_shape(shape), CANN_OPTIONS,
                                      "dispatch_combine", routing, payload)
        fused = MEGA.make_inputs(shape, options, "mega_moe", routing, payload=False)
        wt = harness_weights(shape.L, shape.H, options["ffn_dim"], options["mode"])
        for a, f in zip(ins, fused, strict=True):  # the fused run's routing, id for id
            a.update({"expert_ids": f["expert_ids"], "weight1": wt.w1, "weight1_scale": wt.s1,
                      "weight2": wt.w2, "weight2_scale": wt.s2})
        return ins

    def op_inputs(self, kernel: str, tiling: UnfusedTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        t = tiling.mega
        if kernel == DISPATCH.name:
            return inputs
        if kernel == GEMMS.name:
            tiling.chain["dispatch"] = previous
            out = []
            for a, d in zip(inputs, previous or [], strict=True):
                counts = np.asarray(d["expert_token_nums"], np.int64).astype(np.int32)
                ready = np.zeros(t.L * t.wave_slots, np.int32)
                for e, m in enumerate(counts):
                    for w in range(ceil_div(int(m), WAVE)):
                        ready[e * t.wave_slots + w] = min(WAVE, int(m) - w * WAVE)
                out.append({**a, "expert_token_counts": counts, "input_ready": ready})
            return out
        return cann.FAMILY.op_inputs(COMBINE.name, tiling.cann, inputs,
                                     tiling.chain.pop("dispatch"))


FAMILY = MegaMoeUnfused()
