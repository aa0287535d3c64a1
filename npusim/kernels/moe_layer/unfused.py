"""``form: unfused`` on the A3: the chain DeepEP-Ascend's test_fused_deep_moe.py times as
its baseline (baseline_test, 155-233), one kernel after the other:

0. ``ones_like`` (aclnnInplaceOne's OnesLike): not the chain's own, but the first kernel the
   test's timing sums (test_fused_deep_moe.py 553-567): bench_kineto's barrier fills a
   [1] fp32 tensor with ones before the baseline calls (ones_like.py);
1. ``low_latency_dispatch`` (MoeLowLatencyDispatchV2, use_fp8 -> per-token INT8): DeepEP's
   low-latency kernel, mc2's V2 program (npusim/kernels/deepep/low_latency.py);
2. ``gmm1``: npu_grouped_matmul int8 x int8 -> int32 (gate/up, W8A8; gmm.py);
3. ``dequant_swiglu_quant``: npu_dequant_swiglu_quant, dynamic per-token INT8 (dsq.py);
4. ``gmm2``: npu_grouped_matmul with the bf16 per-channel scale and the per-token scale,
   bf16 out (gmm.py);
5. ``low_latency_combine`` (MoeLowLatencyCombineV2), bf16.

The expert kernels and OnesLike are torch_npu ops launched as plain tasks
(kernel.task_launch_ns); the dispatch and combine keep the communication kernels' launch
(kernel.launch_ns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.common.part import PartKernel
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep.common import OPTIONS as DEEPEP_OPTIONS
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Phase, TensorSpec, const
from npusim.kernels.moe_layer import tiling as tl
from npusim.kernels.moe_layer.dsq import dsq_program
from npusim.kernels.moe_layer.gmm import gmm1_program, gmm2_program
from npusim.kernels.moe_layer.inputs import expert_inputs
from npusim.kernels.moe_layer.ones_like import ELEMENTS, OnesLike, ones_like_tiling
from npusim.kernels.quant import BF16
from npusim.kernels.vector_sample import TaskKernel
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

I8, I32, I64, F32 = (const(np.int8), const(np.int32), const(np.int64), const(np.float32))
LL_LIMITS = ll.LOW_LATENCY.shape_limits


def _rows(cols: Any) -> Any:
    return lambda t, r: (t.rows(r), cols(t))


def _per_expert(cols: Any) -> Any:
    return lambda t, r: (t.L, cols(t))


def _h(t: tl.LayerTiling) -> int:
    return t.H


def _i2(t: tl.LayerTiling) -> int:
    return t.intermediate


def _i(t: tl.LayerTiling) -> int:
    return t.intermediate // 2


GROUPS = TensorSpec("group_list", I64, lambda t, r: (t.L,), "[L] rows per local expert")
ROW_SCALES = lambda name, what: TensorSpec(name, F32, lambda t, r: (t.rows(r),), what)  # noqa: E731


class Gmm1(TaskKernel):
    name = "gmm1"
    phases = (Phase("mm_compute", "every launched AIC: its blocks of every expert, int32 "
                    "straight into y"),)
    inputs = (TensorSpec("x", I8, _rows(_h), "[A, H] int8 (packed_recv_x)"),
              TensorSpec("weight", I8, lambda t, r: (t.L, t.H, t.intermediate),
                         "[L, H, 2I] int8 w13"), GROUPS)
    outputs = (TensorSpec("y", I32, _rows(_i2), "[A, 2I] int32"),)
    core_kind = "aic"

    def program(self, tiling: tl.LayerTiling) -> Any:
        return gmm1_program(tiling.gmm1)

    def cores(self, tiling: tl.LayerTiling) -> int | None:
        return tiling.gmm1.cores


class DequantSwigluQuant(TaskKernel):
    name = "dequant_swiglu_quant"
    phases = (Phase("process", "maxCoreNum AIVs: per expert their share of its rows, "
                    "UbFactorDimx rows per pass"),)
    inputs = (TensorSpec("x", I32, _rows(_i2), "[A, 2I] int32 (gmm1's y)"),
              TensorSpec("weight_scale", F32, _per_expert(_i2), "[L, 2I] fp32"),
              ROW_SCALES("activation_scale", "[A] fp32 (packed_recv_x_scales)"),
              TensorSpec("group_index", I64, lambda t, r: (t.L,), "[L] rows per expert"))
    outputs = (TensorSpec("y", I8, _rows(_i), "[A, I] int8"),
               ROW_SCALES("scale", "[A] fp32 per-token scales"))

    def program(self, tiling: tl.LayerTiling) -> Any:
        return dsq_program(tiling.dsq)

    def cores(self, tiling: tl.LayerTiling) -> int | None:
        return tiling.dsq.cores


class Gmm2(TaskKernel):
    name = "gmm2"
    phases = (Phase("mm_compute", "AIC: its blocks into the workspace ring"),
              Phase("vector_compute", "both AIVs: alternate row chunks of each block, "
                    "dequant to bf16 into y"))
    inputs = (TensorSpec("x", I8, _rows(_i), "[A, I] int8 (dequant_swiglu_quant's y)"),
              TensorSpec("weight", I8, lambda t, r: (t.L, t.intermediate // 2, t.H),
                         "[L, I, H] int8 w2"),
              TensorSpec("scale", const(BF16), _per_expert(_h), "[L, H] bf16 w2 scale"),
              ROW_SCALES("per_token_scale", "[A] fp32 (dequant_swiglu_quant's scale)"),
              GROUPS)
    outputs = (TensorSpec("y", const(BF16), _rows(_h), "[A, H] bf16"),)
    scratch = (TensorSpec("workspace", I32, lambda t, r: (
        t.gmm2.base_m * t.gmm2.base_n * t.gmm2.cores * tl.PIPELINE_NUM,),
        "PIPELINE_NUM int32 blocks per AIC"),)
    core_kind = "mix_aic_1_2"

    def program(self, tiling: tl.LayerTiling) -> Any:
        return gmm2_program(tiling.gmm2)

    def cores(self, tiling: tl.LayerTiling) -> int | None:
        return tiling.gmm2.cores


DISPATCH, COMBINE = PartKernel(ll.DISPATCH, "ll"), PartKernel(ll.COMBINE, "ll")
GMM1, DSQ, GMM2, ONES = Gmm1(), DequantSwigluQuant(), Gmm2(), OnesLike()
KERNELS = (ONES, DISPATCH, GMM1, DSQ, GMM2, COMBINE)
RUN = tuple(k.name for k in KERNELS)


def deepep_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """DeepEP's options as the baseline calls its low-latency kernels (use_fp8: INT8)."""
    return {**{o.name: o.default for o in DEEPEP_OPTIONS}, "mode": "low_latency",
            "quant": "int8",
            "num_max_dispatch_tokens_per_rank": options["num_max_dispatch_tokens_per_rank"],
            "hccl_buffsize": options["hccl_buffsize"]}


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> tl.LayerTiling:
    lt = ll.LOW_LATENCY.tiling(shape, deepep_options(options), hardware, timing_only)
    rows = lt.shape.rows_capacity(0)
    i2 = options["intermediate"]
    ub = int(hardware.ub.bytes)
    return tl.LayerTiling(
        lt, tl.gmm_tiling(hardware.aic, ub, rows, shape.H, i2, shape.L),
        tl.dsq_tiling(ub, hardware.chip.aiv_cores, rows, i2, shape.L),
        tl.gmm_tiling(hardware.aic, ub, rows, i2 // 2, shape.H, shape.L, per_token_quant=True),
        i2, timing_only, ones_like_tiling(ELEMENTS, 4, hardware.chip.aiv_cores, ub))


def misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any) -> Misfit | None:
    wd = options["weight_dtype"]
    if wd != "int8":
        return Misfit("workload.weight_dtype", f"{wd}: the baseline's GroupedMatmul "
                      "calls are W8A8 on the INT8 dispatch (test_fused_deep_moe.py "
                      "20-46 draws int8 w13 / w2; deep_ep.cpp 1276-1285 asserts int8 "
                      "weights); allowed: int8")
    i2 = options["intermediate"]
    if i2 % 2:
        return Misfit("workload.intermediate", f"{i2}: gate and up halves of GMM1's "
                      "columns (DequantSwigluQuant chunks x in two); allowed: even")
    lo, hi = LL_LIMITS.h
    if shape.H < lo:
        return Misfit("workload.h", f"{shape.H}: the low-latency kernels take h from "
                      f"{lo} (moe_distribute_dispatch_v2_tiling.cpp, the unfused chain's "
                      f"dispatch and combine); allowed: {lo}..{hi}")
    return ll.LOW_LATENCY.misfit(shape, deepep_options(options), hardware, "dispatch_combine")


def tiling_misfit(tiling: tl.LayerTiling, hardware: Any) -> Misfit | None:
    ub = int(hardware.ub.bytes)
    top = tl.dsq_max_in_dim(ub)
    if tiling.intermediate > top:
        return Misfit("workload.intermediate", f"{tiling.intermediate}: "
                      f"DequantSwigluQuant takes x's last dim up to {top} with a "
                      f"{ub} B UB (dequant_swiglu_quant_tiling.cpp CountMaxDim, "
                      f"maxInDimy); allowed: 2..{top}, even")
    return None


def window(tiling: tl.LayerTiling) -> Any:
    return ll.LOW_LATENCY.window(tiling.ll)


def make_inputs(shape: MoeShape, options: Mapping[str, Any], op: str, routing: Routing,
                payload: bool, fp32_w2_scale: bool = False) -> list[Arrays]:
    """DeepEP's tokens and routing (the low-latency kernels' draw) and the experts'
    weights as the test draws them; the fused forms take the same layer."""
    base = ll.LOW_LATENCY.make_inputs(shape, deepep_options(options), op, routing, payload)
    return [{**a, **expert_inputs(shape, options["intermediate"], r, routing, payload,
                                  fp32_w2_scale=fp32_w2_scale)}
            for r, a in enumerate(base)]


def op_inputs(kernel: str, tiling: tl.LayerTiling, inputs: list[Arrays],
              previous: list[Arrays] | None) -> list[Arrays]:
    """Each kernel's tensors from the one before, as the test passes them."""
    t, chain = tiling.ll, tiling.chain
    if kernel == ONES.name:
        return [{"x": np.zeros(ELEMENTS, np.float32)} for _ in inputs]
    if kernel == DISPATCH.name:
        return ll.LOW_LATENCY.op_inputs(kernel, t, inputs, None)
    if kernel == GMM1.name:
        chain["dispatch"] = previous
        return [{"x": d["packed_recv_x"], "weight": a["gmm1_weight"],
                 "group_list": d["packed_recv_count"].astype(np.int64)}
                for a, d in zip(inputs, previous or [], strict=True)]
    got = chain["dispatch"]
    if kernel == DSQ.name:
        return [{"x": p["y"], "weight_scale": a["gmm1_weight_scale"],
                 "activation_scale": d["packed_recv_x_scales"],
                 "group_index": d["packed_recv_count"].astype(np.int64)}
                for a, p, d in zip(inputs, previous or [], got, strict=True)]
    if kernel == GMM2.name:
        return [{"x": p["y"], "weight": a["gmm2_weight"], "scale": a["gmm2_weight_scale"],
                 "per_token_scale": p["scale"],
                 "group_list": d["packed_recv_count"].astype(np.int64)}
                for a, p, d in zip(inputs, previous or [], got, strict=True)]
    base = ll.LOW_LATENCY.op_inputs(kernel, t, inputs, chain.pop("dispatch"))
    return [{**b, "x": p["y"]} for b, p in zip(base, previous or [], strict=True)]

