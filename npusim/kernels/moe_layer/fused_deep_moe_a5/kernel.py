"""The form's declaration to moe_layer's family: the one kernel (its GM tensors, phases,
MIX launch and report figures) and the hooks family.py dispatches to for
`form: fused_deep_moe` on the Ascend 950 (tiling, misfits, inputs).

Tensor names: the op's (op_host/fused_deep_moe_a5/fused_deep_moe.cpp) for inputs and
outputs; the workspace areas (fused_deep_moe_a5_tiling.h WorkSpaceOffset) are outputs
too, so a run shows each stage's bytes: x1 / x1_scale (dispatched rows), swiglu_out (the
GMM1 swap after the epilogue), x2 / x2_scale (requantised rows), gmm2_swap. The source
overlays x1 with x2 and the two swaps (ENABLE_REUSE_MEMORY); held apart here, which moves
no byte differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.common.overlap import layer_fields
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.moe_layer.fused_deep_moe_a5 import tiling as tl
from npusim.kernels.moe_layer.fused_deep_moe_a5.inputs import a5_expert_inputs
from npusim.kernels.moe_layer.fused_deep_moe_a5.window import A5Window
from npusim.kernels.quant import BF16
from npusim.units import MiB
from npusim.workload.shape import MoeShape

U8, I32, I64, F32 = const(np.uint8), const(np.int32), const(np.int64), const(np.float32)
NAME = "fused_deep_moe_a5"
WORKERS = {"dispatch_send": "aiv1", "dispatch_recv": "aiv0", "gmm1": "aic", "swiglu": "aiv",
           "quant": "aiv", "gmm2": "aic", "combine": "aiv", "weight_sum": "aiv"}
HIDES = {"dispatch": ("gmm1",), "combine": ("gmm2",)}


def _spec(name: str, dtype: Any, shape: Any, help_: str) -> TensorSpec:
    return TensorSpec(name, dtype, shape, help_)


def _cap(cols: Any) -> Any:
    return lambda t, r: (t.capacity, cols(t))


class FusedDeepMoeA5(Kernel):
    name = NAME
    core_kind = "mix_aic_1_2"
    phases = (
        Phase("dispatch_send", "AIV1 of every block: token counts, then its (token, k) "
              "pairs MX-quantised into the experts' ranks"),
        Phase("dispatch_recv", "AIV0 of every block: the counts, then its share of each "
              "expert's rows into x1, the AIC told per expert"),
        Phase("gmm1", "AIC: per expert as its rows are in, MX GEMM blocks, fp32 to the swap"),
        Phase("swiglu", "both AIVs: per GEMM block, bf16 rounding and SiLU of the left "
              "half, in place"),
        Phase("quant", "every AIV after SyncAll: left x right, bf16, MX requant into x2"),
        Phase("stage_barrier", "the AIVs' CrossCoreBarrier, then the AIC's wait"),
        Phase("gmm2", "AIC: MX GEMM blocks of every expert, fp32 to the GMM2 swap"),
        Phase("combine", "both AIVs: per block, bf16 and each row's put to its source rank"),
        Phase("weight_sum", "AIV0 the combine status to its ranks; AIV1 the wait, then "
              "its tokens' weighted sum"),
    )
    inputs = (
        _spec("x", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 tokens"),
        _spec("expert_ids", I32, lambda t, r: (t.BS, t.K), "[BS, K] int32 global experts"),
        _spec("gmm1_weight", U8, lambda t, r: (t.L, t.H, t.n1), "[L, H, N1] FP8 codes (ND)"),
        _spec("gmm1_weight_scale", U8, lambda t, r: (t.L, t.H // 32, t.n1),
              "[L, H/32, N1] E8M0 along H"),
        _spec("gmm2_weight", U8, lambda t, r: (t.L, t.n2, t.H), "[L, N1/2, H] FP8 codes"),
        _spec("gmm2_weight_scale", U8, lambda t, r: (t.L, t.n2 // 32, t.H),
              "[L, N1/64, H] E8M0 along N1/2"),
        _spec("expert_scales", F32, lambda t, r: (t.BS, t.K), "[BS, K] fp32 routing weights"),
    )
    outputs = (
        _spec("output", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 combined"),
        _spec("expert_token_nums", I64, lambda t, r: (t.L,), "[L] rows per local expert"),
        _spec("x1", U8, _cap(lambda t: t.H), "workspace: dispatched FP8 rows"),
        _spec("x1_scale", U8, _cap(lambda t: t.x1_scales), "workspace: their E8M0"),
        _spec("swiglu_out", F32, _cap(lambda t: t.n1), "workspace: GMM1 swap / SwiGLU out"),
        _spec("x2", U8, _cap(lambda t: t.n2), "workspace: requantised FP8 rows"),
        _spec("x2_scale", U8, _cap(lambda t: t.x2_scales), "workspace: their E8M0"),
        _spec("gmm2_swap", F32, _cap(lambda t: t.H), "workspace: GMM2 fp32 blocks"),
    )
    scratch = (
        _spec("group_list", I64, lambda t, r: (t.L,), "cumulative rows per local expert"),
        _spec("expand_idx", I32, lambda t, r: (t.routes,), "each pair's row in its slot"),
        _spec("ep_send_count", I32, lambda t, r: (t.senders,),
              "running rows over (local expert, source rank)"),
    )

    def program(self, tiling: tl.A5Tiling) -> Any:
        from npusim.kernels.moe_layer.fused_deep_moe_a5.program import (
            fused_deep_moe_a5_program,
        )
        return fused_deep_moe_a5_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return {"expert_token_nums": [[int(v) for v in o["expert_token_nums"]]
                                      for o in call.outputs],
                **layer_fields(call.run, call.cores, WORKERS, HIDES,
                               waits=("stage_barrier",))}


KERNEL = FusedDeepMoeA5()


def aic_cores(hardware: Any) -> int:
    """GetCoreNumAic (TILING 727): the preset's AIC, else half its AIV."""
    n = getattr(getattr(hardware, "aic", None), "cores", None)
    return int(n) if n else hardware.chip.aiv_cores // 2


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> tl.A5Tiling:
    mb = options["hccl_buffsize"]
    return tl.A5Tiling(shape, options["intermediate"], tl.MODES[options["weight_dtype"]],
                       aic_cores(hardware), mb * MiB if mb else int(hardware.window.bytes),
                       timing_only)


def tiling_misfit(t: tl.A5Tiling, hardware: Any) -> Misfit | None:
    bad = tl.hccl_misfit(t)
    if bad:
        return bad
    need = A5Window(t).bytes
    if need > hardware.window.bytes:
        return Misfit("hardware.window.bytes", f"the window needs {need} B (state 1 MiB, "
                      f"two data halves, the owners' 512 B shifts), more than the preset's "
                      f"{hardware.window.bytes}")
    return None


def make_inputs(shape: MoeShape, options: Mapping[str, Any], routing: Any,
                base: list[Arrays], payload: bool) -> list[Arrays]:
    """DeepEP's tokens and routing (base: x, topk_idx, topk_weights) and the MX weights."""
    mode = tl.MODES.get(options["weight_dtype"], "e4m3")
    return [{"x": a["x"], "expert_ids": np.ascontiguousarray(a["topk_idx"], np.int32),
             "expert_scales": np.ascontiguousarray(a["topk_weights"], np.float32),
             **a5_expert_inputs(shape.L, shape.H, options["intermediate"], mode, r, routing,
                                payload)}
            for r, a in enumerate(base)]

