"""The 950's unfused chain as moe_layer's family runs it (``form: unfused`` with MX
weights): its kernels, tiling, refusals, inputs and the chaining of each kernel's inputs.

1. ``dispatch``: npu_moe_distribute_dispatch_v2, quant_mode 4 (MX, fp8 expand_x, E8M0 per
   32), expert_token_nums_type 1: mc2's V2 program on the 950 (npusim/kernels/mc2);
2. ``mx_gmm1``: npu_grouped_matmul fp8 x fp8 with both operands' E8M0 scales -> bf16, w13
   [L, H, 2I] (gmm.py);
3. ``swiglu``: npu_swiglu (swiglu.py);
4. ``dynamic_mx_quant``: npu_dynamic_mx_quant of the SwiGLU rows (mx_quant.py);
5. ``mx_gmm2``: as 2, w2 [L, I, H];
6. ``combine``: npu_moe_distribute_combine_v2, bf16: mc2's program.

The expert kernels run over all A rows of expand_x, as the test's calls do (the GMMs only
over the rows group_list counts; npu_swiglu and npu_dynamic_mx_quant over the whole tensor).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.formats import BF16
from npusim.kernels.common.limits import DISPATCH_V3_LIMITS
from npusim.kernels.common.part import PartKernel
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Phase, TensorSpec, const
from npusim.kernels.mc2 import family as mc2
from npusim.kernels.mc2.options import OPTIONS as MC2_OPTIONS
from npusim.kernels.moe_layer.a5 import tiling as tl
from npusim.kernels.moe_layer.a5.gmm import mx_gmm_program
from npusim.kernels.moe_layer.a5.mx_quant import mx_quant_program
from npusim.kernels.moe_layer.a5.swiglu import swiglu_program
from npusim.kernels.quant import mx_quantize_bf16
from npusim.kernels.vector_sample import TaskKernel
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

RUN = ("dispatch", "mx_gmm1", "swiglu", "dynamic_mx_quant", "mx_gmm2", "combine")
WEIGHT_DTYPES = ("fp8_e4m3", "fp8_e5m2")  # the test's --quant-mode FP8 choices
U8, I64 = const(np.uint8), const(np.int64)
MX = 32
SEED_SALT = 0x5EED


def mode_of(options: Mapping[str, Any]) -> str:
    return str(options["weight_dtype"])[-4:]


class MxGmm(TaskKernel):
    """GroupedMatmul MX: `which` 1 (x = expand_x, [L, H, 2I]) or 2 ([L, I, H])."""

    phases = (Phase("mm_compute", "every AIC: its base blocks of every expert (the "
                    "sliding-window walk), bf16 straight into y"),)
    core_kind = "aic"

    def __init__(self, which: int) -> None:
        self.name = f"mx_gmm{which}"
        self.which = which
        g = self._gmm
        self.inputs = (
            TensorSpec("x", U8, lambda t, r: (t.rows(r), g(t).k), "[A, K] fp8 codes"),
            TensorSpec("per_token_scale", U8, lambda t, r: (t.rows(r), g(t).k // MX),
                       "[A, K/32] E8M0"),
            TensorSpec("weight", U8, lambda t, r: (t.L, g(t).k, g(t).n), "[L, K, N] fp8"),
            TensorSpec("scale", U8, lambda t, r: (t.L, g(t).k // MX, g(t).n),
                       "[L, K/32, N] E8M0"),
            TensorSpec("group_list", I64, lambda t, r: (t.L,), "[L] rows per local expert"))
        self.outputs = (TensorSpec("y", const(BF16), lambda t, r: (t.rows(r), g(t).n),
                                   "[A, N] bf16"),)
        self.scratch = ()

    def _gmm(self, t: tl.A5LayerTiling) -> tl.MxGmmTiling:
        return t.gmm1 if self.which == 1 else t.gmm2

    def program(self, tiling: tl.A5LayerTiling) -> Any:
        return mx_gmm_program(self._gmm(tiling), tiling.mode)

    def cores(self, tiling: tl.A5LayerTiling) -> int | None:
        return self._gmm(tiling).cores


class Swiglu(TaskKernel):
    name = "swiglu"
    phases = (Phase("process", "the tiling's AIVs: their baseRowLen x baseColLen tiles"),)
    inputs = (TensorSpec("x", const(BF16), lambda t, r: (t.rows(r), t.intermediate),
                         "[A, 2I] bf16 (mx_gmm1's y)"),)
    outputs = (TensorSpec("y", const(BF16), lambda t, r: (t.rows(r), t.intermediate // 2),
                          "[A, I] bf16"),)

    def program(self, tiling: tl.A5LayerTiling) -> Any:
        return swiglu_program(tiling.swiglu)

    def cores(self, tiling: tl.A5LayerTiling) -> int | None:
        return tiling.swiglu.cores


class DynamicMxQuant(TaskKernel):
    name = "dynamic_mx_quant"
    phases = (Phase("process", "rowTileNum x colTileNum AIVs: their rows in UB passes"),)
    inputs = (TensorSpec("x", const(BF16), lambda t, r: (t.rows(r), t.intermediate // 2),
                         "[A, I] bf16 (swiglu's y)"),)
    outputs = (TensorSpec("y", U8, lambda t, r: (t.rows(r), t.intermediate // 2),
                          "[A, I] fp8 codes"),
               TensorSpec("scale", U8, lambda t, r: (t.rows(r), t.intermediate // 2 // MX),
                          "[A, I/32] E8M0"))

    def program(self, tiling: tl.A5LayerTiling) -> Any:
        return mx_quant_program(tiling.quant, tiling.mode)

    def cores(self, tiling: tl.A5LayerTiling) -> int | None:
        return tiling.quant.cores


DISPATCH, COMBINE = PartKernel(mc2.DISPATCH, "mc2"), PartKernel(mc2.COMBINE, "mc2")
GMM1, SWIGLU, QUANT, GMM2 = MxGmm(1), Swiglu(), DynamicMxQuant(), MxGmm(2)
KERNELS = (DISPATCH, GMM1, SWIGLU, QUANT, GMM2, COMBINE)


def mc2_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """mc2's options as the test calls the V2 operators: quant_mode 4 with the weights'
    FP8 format, expert_token_nums_type 1, bf16 combine."""
    return {**{o.name: o.default for o in MC2_OPTIONS}, "dispatch_quant": "mxfp8",
            "quant_dtype": mode_of(options), "expert_token_nums_type": 1,
            "combine_quant": "none", "ccl_buffer_size": options["hccl_buffsize"]}


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> tl.A5LayerTiling:
    mt = mc2.FAMILY.tiling(shape, mc2_options(options), hardware, timing_only)
    rows = mt.shape.rows_capacity(0)
    i2 = options["intermediate"]
    ub, aiv = int(hardware.ub.bytes), int(hardware.chip.aiv_cores)
    sw = tl.swiglu_tiling(ub, aiv, rows, i2 // 2)
    assert sw is not None  # misfit refuses the shapes without one
    return tl.A5LayerTiling(
        mt, mode_of(options), i2, tl.mx_gmm_tiling(hardware.aic, rows, shape.H, i2, shape.L),
        tl.mx_gmm_tiling(hardware.aic, rows, i2 // 2, shape.H, shape.L), sw,
        tl.mx_quant_tiling(ub, aiv, rows, i2 // 2), timing_only)


def window(t: tl.A5LayerTiling) -> Any:
    """mc2's window: the V2 dispatch and combine are the chain's only users of it."""
    return mc2.FAMILY.window(t.mc2)


def misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any) -> Misfit | None:
    top = DISPATCH_V3_LIMITS.bs[1]
    if shape.BS > top:
        return Misfit("workload.bs", f"{shape.BS}: the V2 dispatch and combine take at most "
                      f"{top} tokens a rank ({DISPATCH_V3_LIMITS.source}; the family's range "
                      f"is the A3 low-latency kernels'); allowed: 1..{top}")
    wd = options["weight_dtype"]
    if wd not in WEIGHT_DTYPES:
        return Misfit("workload.weight_dtype", f"{wd}: the 950 baseline's GroupedMatmul "
                      "calls are MX fp8 x fp8 (test_fused_deep_moe_a5.py 156-182 quantises "
                      "the weights with npu_dynamic_mx_quant; its FP8 --quant-mode "
                      f"choices); allowed: {', '.join(WEIGHT_DTYPES)}")
    i2 = options["intermediate"]
    if i2 % (2 * 64):
        return Misfit("workload.intermediate", f"{i2}: I = {i2 // 2} must be a multiple of "
                      "64, GMM2's K (the MX scales' (m, ceil(k/64), 2) layout, "
                      "grouped_quant_matmul_tiling.cpp 238-251, taken whole; npusim keeps "
                      "them [K/32] a row); allowed: multiples of 128")
    if shape.H % 64:
        return Misfit("workload.h", f"{shape.H}: GMM1's K must be a multiple of 64 (the MX "
                      "scales' (m, ceil(k/64), 2) layout, grouped_quant_matmul_tiling.cpp "
                      "238-251, taken whole); allowed: multiples of 64")
    if tl.swiglu_tiling(int(hardware.ub.bytes), int(hardware.chip.aiv_cores),
                        shape.rows_capacity(0), i2 // 2) is None:
        return Misfit("workload.intermediate", f"{i2}: SwiGlu's tiling finds no base shape "
                      "(swi_glu_tiling.cpp CalcOptBaseShape); allowed: smaller")
    return mc2.FAMILY.misfit(shape, mc2_options(options), hardware, "dispatch_combine")


def expert_inputs(shape: MoeShape, i2: int, mode: str, rank: int, seed: int, payload: bool
                  ) -> dict[str, np.ndarray]:
    """The weights as the A5 test draws them (156-182): bf16 uniform in [-1, 1), MX
    quantised along K (npu_dynamic_mx_quant axis=1); zeros for a timing-only run."""
    L, H, i1 = shape.L, shape.H, i2 // 2
    out = {}
    rng = np.random.default_rng([SEED_SALT, seed, rank])
    for name, (k, n) in (("gmm1", (H, i2)), ("gmm2", (i1, H))):
        if not payload:
            out[f"{name}_weight"] = np.zeros((L, k, n), np.uint8)
            out[f"{name}_weight_scale"] = np.zeros((L, k // MX, n), np.uint8)
            continue
        w = (rng.random((L, n, k), np.float32) * 2 - 1).astype(BF16)
        codes, scales = mx_quantize_bf16(w.reshape(L * n, k), mode)
        out[f"{name}_weight"] = np.ascontiguousarray(codes.reshape(L, n, k).transpose(0, 2, 1))
        out[f"{name}_weight_scale"] = np.ascontiguousarray(
            scales.reshape(L, n, k // MX).transpose(0, 2, 1))
    return out


def make_inputs(shape: MoeShape, options: Mapping[str, Any], routing: Routing,
                payload: bool) -> list[Arrays]:
    base = mc2.FAMILY.make_inputs(shape, mc2_options(options), "dispatch_combine", routing,
                                  payload)
    return [{**a, **expert_inputs(shape, options["intermediate"], mode_of(options), r,
                                  routing.seed,
                                  payload)} for r, a in enumerate(base)]


def op_inputs(kernel: str, t: tl.A5LayerTiling, inputs: list[Arrays],
              previous: list[Arrays] | None) -> list[Arrays]:
    chain = t.chain
    if kernel == DISPATCH.name:
        return mc2.FAMILY.op_inputs(kernel, t.mc2, inputs, None)
    prev = previous or []
    if kernel == GMM1.name:
        chain["dispatch"] = prev
        return [{"x": d["expand_x"], "per_token_scale": d["dynamic_scales"],
                 "weight": a["gmm1_weight"], "scale": a["gmm1_weight_scale"],
                 "group_list": d["expert_token_nums"].astype(np.int64)}
                for a, d in zip(inputs, prev, strict=True)]
    if kernel in (SWIGLU.name, QUANT.name):
        return [{"x": p["y"]} for p in prev]
    got = chain["dispatch"]
    if kernel == GMM2.name:
        return [{"x": p["y"], "per_token_scale": p["scale"], "weight": a["gmm2_weight"],
                 "scale": a["gmm2_weight_scale"],
                 "group_list": d["expert_token_nums"].astype(np.int64)}
                for a, p, d in zip(inputs, prev, got, strict=True)]
    base = mc2.FAMILY.op_inputs(kernel, t.mc2, inputs, chain.pop("dispatch"))
    return [{**b, "expand_x": p["y"]} for b, p in zip(base, prev, strict=True)]
