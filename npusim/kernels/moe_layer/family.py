"""Family ``moe_layer``: a whole MoE layer as DeepEP-Ascend's tests time it on the Atlas A3
(sgl-kernel-npu tests/python/deepep/test_fused_deep_moe.py baseline_test, 155-233).

``form: unfused`` runs the baseline's chain, one kernel after the other:

1. ``low_latency_dispatch`` (MoeLowLatencyDispatchV2, use_fp8 -> per-token INT8): DeepEP's
   low-latency kernel, mc2's V2 program (npusim/kernels/deepep/low_latency.py);
2. ``gmm1``: npu_grouped_matmul int8 x int8 -> int32 (gate/up, W8A8; gmm.py);
3. ``dequant_swiglu_quant``: npu_dequant_swiglu_quant, dynamic per-token INT8 (dsq.py);
4. ``gmm2``: npu_grouped_matmul with the bf16 per-channel scale and the per-token scale,
   bf16 out (gmm.py);
5. ``low_latency_combine`` (MoeLowLatencyCombineV2), bf16.

``form: fused_deep_moe`` with MX weights (fp8_e4m3 / fp8_e5m2) is FusedDeepMoe's Ascend
950 build, one MIX kernel ``fused_deep_moe_a5`` (package fused_deep_moe_a5/).

``intermediate`` is the test's --moe-intermediate-size: GMM1's columns, gate and up (2I);
w13 is [E_loc, H, intermediate], w2 [E_loc, intermediate / 2, H].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from npusim.kernels.common.part import PartKernel
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep.common import OPTIONS as DEEPEP_OPTIONS
from npusim.kernels.deepep.common import platform
from npusim.kernels.exchange import ExchangeFamily
from npusim.kernels.family import Misfit, Option, Variant
from npusim.kernels.kernel import Arrays, Kernel, Phase, TensorSpec, const
from npusim.kernels.moe_layer import tiling as tl
from npusim.kernels.moe_layer.dsq import dsq_program
from npusim.kernels.moe_layer.fused_deep_moe_a5 import kernel as a5
from npusim.kernels.moe_layer.fused_deep_moe_a5 import tiling as a5_tl
from npusim.kernels.moe_layer.gmm import gmm1_program, gmm2_program
from npusim.kernels.moe_layer.inputs import expert_inputs
from npusim.kernels.quant import BF16
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

I8, I32, I64, F32 = (const(np.int8), const(np.int32), const(np.int64), const(np.float32))
WEIGHT_DTYPES = ("int8", "bfloat16", "int4", *a5_tl.WEIGHT_DTYPES)
LL_LIMITS = ll.LOW_LATENCY.shape_limits
RUN = ("low_latency_dispatch", "gmm1", "dequant_swiglu_quant", "gmm2", "low_latency_combine")


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


class Gmm1(Kernel):
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


class DequantSwigluQuant(Kernel):
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


class Gmm2(Kernel):
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
GMM1, DSQ, GMM2 = Gmm1(), DequantSwigluQuant(), Gmm2()


def deepep_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """DeepEP's options as the baseline calls its low-latency kernels (use_fp8: INT8)."""
    return {**{o.name: o.default for o in DEEPEP_OPTIONS}, "mode": "low_latency",
            "quant": "int8",
            "num_max_dispatch_tokens_per_rank": options["num_max_dispatch_tokens_per_rank"],
            "hccl_buffsize": options["hccl_buffsize"]}


class MoeLayer(ExchangeFamily):
    name = "moe_layer"
    help = ("a whole MoE layer on the A3 as DeepEP-Ascend's tests time it; form unfused: "
            "MoeLowLatencyDispatchV2 (INT8), GroupedMatmul, DequantSwigluQuant, "
            "GroupedMatmul, MoeLowLatencyCombineV2; form fused_deep_moe with MX weights: "
            "FusedDeepMoe's Ascend 950 build, one MIX kernel")
    ops = (DISPATCH, GMM1, DSQ, GMM2, COMBINE, a5.KERNEL)
    runs = {"moe_layer": RUN}
    # the union over the forms: the low-latency kernels' (unfused) with FusedDeepMoe A5's
    # h from 512 (fused_deep_moe_tiling.cpp:62); each form's misfit refuses the rest
    shape_limits = replace(LL_LIMITS, h=(a5_tl.MIN_H, LL_LIMITS.h[1]),
                           source=f"{LL_LIMITS.source}; h from 512: fused_deep_moe_tiling.cpp:62")
    # advise: a shape of op moe_layer only; the baseline's dispatch is INT8, its combine bf16
    variants = (Variant("unfused", {"form": "unfused"}),)
    dispatch_quants = {"int8": {}}
    combine_quants = {"none": {}}
    options = (
        Option("form", "choice", "unfused", "unfused: the five kernels the DeepEP test's "
               "baseline times; fused_deep_moe: FusedDeepMoe, one MIX kernel (the Ascend "
               "950 build with MX weights)", choices=("unfused", "fused_deep_moe")),
        Option("intermediate", "int", 4096, "--moe-intermediate-size: GMM1's columns, gate "
               "and up (2I); even", lo=2, hi=65536),
        Option("weight_dtype", "choice", "int8", "the experts' weights: int8 (W8A8, the "
               "baseline's); fp8_e4m3 / fp8_e5m2 (MX, E8M0 per 32 along K: fused_deep_moe "
               "on the Ascend 950); bfloat16, int4 and MX FP4 are refused",
               choices=WEIGHT_DTYPES),
        Option("num_max_dispatch_tokens_per_rank", "int", 0, "the low-latency kernels' "
               "argument (global_bs = it x W); 0: bs", lo=0, hi=131072),
        Option("hccl_buffsize", "int", 0, "HCCL_BUFFSIZE in MB; 0: the smallest DeepEP's "
               "check accepts", lo=0, hi=65536),
    )

    def runs_of(self, options: Mapping[str, Any] | None = None
                ) -> Mapping[str, tuple[str, ...]]:
        return {"moe_layer": (a5.NAME,)} if _a5(options) else self.runs

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Any:
        if _a5(options):
            return a5.tiling(shape, options, hardware, timing_only)
        lt = ll.LOW_LATENCY.tiling(shape, deepep_options(options), hardware, timing_only)
        rows = lt.shape.rows_capacity(0)
        i2 = options["intermediate"]
        ub = int(hardware.ub.bytes)
        return tl.LayerTiling(
            lt, tl.gmm_tiling(hardware.aic, ub, rows, shape.H, i2, shape.L),
            tl.dsq_tiling(ub, hardware.chip.aiv_cores, rows, i2, shape.L),
            tl.gmm_tiling(hardware.aic, ub, rows, i2 // 2, shape.H, shape.L), i2, timing_only)

    def window(self, tiling: Any) -> Any:
        if isinstance(tiling, a5_tl.A5Tiling):
            return a5.A5Window(tiling)
        return ll.LOW_LATENCY.window(tiling.ll)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if options["form"] == "fused_deep_moe":
            return _fused_misfit(shape, options, hardware)
        if platform(hardware) != "a3" or getattr(hardware, "aic", None) is None:
            return Misfit("hardware", f"{hardware.name}: the moe_layer chain is the A3's "
                          "(DeepEP's csrc/deepep/ops kernels, ascend910_93); allowed: "
                          "atlas_a3")
        lo = LL_LIMITS.h[0]
        if shape.H < lo:
            return Misfit("workload.h", f"{shape.H}: the low-latency kernels take h from {lo} "
                          f"({LL_LIMITS.source}); allowed: {lo}..{LL_LIMITS.h[1]}")
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
        return ll.LOW_LATENCY.misfit(shape, deepep_options(options), hardware,
                                     "dispatch_combine")

    def tiling_misfit(self, tiling: Any, shape: MoeShape,
                      options: Mapping[str, Any], hardware: Any, op: str) -> Misfit | None:
        if isinstance(tiling, a5_tl.A5Tiling):
            return a5.tiling_misfit(tiling, hardware)
        ub = int(hardware.ub.bytes)
        top = tl.dsq_max_in_dim(ub)
        if tiling.intermediate > top:
            return Misfit("workload.intermediate", f"{tiling.intermediate}: "
                          f"DequantSwigluQuant takes x's last dim up to {top} with a "
                          f"{ub} B UB (dequant_swiglu_quant_tiling.cpp CountMaxDim, "
                          f"maxInDimy); allowed: 2..{top}, even")
        d = tiling.dsq
        if d.groups >= tl.DSQ_CUT_GROUP_GROUPS and d.rows // d.groups <= tl.DSQ_CUT_GROUP_TOKENS:
            return Misfit("workload.experts_per_rank", f"{d.groups} local experts of "
                          f"{d.rows // d.groups} rows each: DequantSwigluQuant takes its "
                          "cut-group kernel (dequant_swiglu_quant_tiling.cpp CountTilingKey, "
                          "groups >= 32 and rows / groups <= 16), which is not modelled; "
                          f"allowed: fewer than {tl.DSQ_CUT_GROUP_GROUPS} local experts or "
                          "more capacity rows per expert")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        base = ll.LOW_LATENCY.make_inputs(shape, deepep_options(options), op, routing, payload)
        if _a5(options):
            return a5.make_inputs(shape, options, routing, base, payload)
        return [{**a, **expert_inputs(shape, options["intermediate"], r, routing, payload)}
                for r, a in enumerate(base)]

    def op_inputs(self, kernel: str, tiling: tl.LayerTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        if kernel == a5.NAME:
            return inputs
        t, chain = tiling.ll, tiling.chain
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




def _a5(options: Mapping[str, Any] | None) -> bool:
    """FusedDeepMoe's A5 build: the fused form with MX weights (the A3 build is int8)."""
    return (options is not None and options.get("form") == "fused_deep_moe"
            and options.get("weight_dtype") in a5_tl.WEIGHT_DTYPES)


def _fused_misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any
                  ) -> Misfit | None:
    if platform(hardware) != "a5":
        return Misfit("hardware", f"{hardware.name}: fused_deep_moe is modelled for the "
                      "Ascend 950 build (op_host/fused_deep_moe_a5, AddConfig(\"ascend950\")) "
                      "only; allowed: ascend950")
    return a5_tl.misfit(shape, options)


FAMILY = MoeLayer()
