"""Family ``moe_layer``: a whole MoE layer as DeepEP-Ascend's tests time it, on the Atlas A3
(tests/python/deepep/test_fused_deep_moe.py, test_dispatch_ffn_combine.py) and the Ascend
950 (test_fused_deep_moe_a5.py), in the forms those tests compare (`workload.form`):

- ``unfused``: the baseline chain of separate kernels (unfused.py on the A3, a5/ on the
  950);
- ``fused_deep_moe``: FusedDeepMoe, the layer in one MIX kernel (fused_deep_moe/ on the
  A3, fused_deep_moe_a5/ on the 950);
- ``dispatch_ffn_combine``: DispatchFFNCombine, one MIX kernel (A3 only;
  dispatch_ffn_combine/).

The weights' dtype picks the chip's kernels (int8: the A3's W8A8; fp8_e4m3 / fp8_e5m2: the
950's MX), and the preset must be that chip (form.py). ``intermediate`` is GMM1's columns,
gate and up (2I) on both chips: the A3 test's --moe-intermediate-size, twice the A5
test's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from npusim.kernels.deepep.common import platform
from npusim.kernels.exchange import ExchangeFamily
from npusim.kernels.family import Misfit, Option, Variant
from npusim.kernels.kernel import Arrays
from npusim.kernels.moe_layer import forms
from npusim.kernels.moe_layer.form import MX_WEIGHTS, Form, chip_misfit, pick
from npusim.kernels.moe_layer.fused_deep_moe import MIN_TOKEN_LENGTH
from npusim.kernels.moe_layer.layer import layer_fields
from npusim.kernels.moe_layer.unfused import LL_LIMITS
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

WEIGHT_DTYPES = ("int8", "bfloat16", "int4", *MX_WEIGHTS)
# every form's shapes: the low-latency kernels' with FusedDeepMoe's h from 512
# (fused_deep_moe_tiling.cpp:82 on the A3, :62 on the A5); each form refuses the rest
LIMITS = replace(LL_LIMITS, h=(MIN_TOKEN_LENGTH, LL_LIMITS.h[1]),
                 source="the low-latency kernels (unfused) and FusedDeepMoe")
BY_KERNEL = {k.name: f for f in forms.FORMS for k in f.kernels}


def _of_tiling(tiling: Any) -> Form:
    return next(f for f in forms.FORMS if isinstance(tiling, f.tiling_type))


class MoeLayer(ExchangeFamily):
    name = "moe_layer"
    help = ("a whole MoE layer as DeepEP-Ascend's tests time it, on the A3 (int8 weights) "
            "and the Ascend 950 (MX FP8 weights); form unfused: the baseline's chain of "
            "kernels; fused_deep_moe: FusedDeepMoe; dispatch_ffn_combine: "
            "DispatchFFNCombine (A3)")
    ops = tuple(k for f in forms.FORMS for k in f.kernels)
    runs = {"moe_layer": forms.FORMS[0].run}
    shape_limits = LIMITS
    # advise: a shape of op moe_layer in each form; the dispatch's quantisation is the
    # chip's (per-token INT8 with int8 weights on the A3, MX FP8 with MX weights on the
    # 950), so it picks the kernels
    variants = tuple(Variant(n, {"form": n}) for n in forms.NAMES)
    dispatch_quants = {"int8": {"weight_dtype": "int8"}, "mxfp8": {"weight_dtype": "fp8_e4m3"}}
    combine_quants = {"none": {}}
    options = (
        Option("form", "choice", "unfused", "unfused: the chain of kernels the DeepEP "
               "tests' baseline times; fused_deep_moe: FusedDeepMoe, the layer in one MIX "
               "kernel; dispatch_ffn_combine: DispatchFFNCombine, one MIX kernel (A3)",
               choices=forms.NAMES),
        Option("intermediate", "int", 4096, "GMM1's columns, gate and up (2I): the A3 "
               "test's --moe-intermediate-size, twice the A5 test's; even", lo=2, hi=65536),
        Option("weight_dtype", "choice", "int8", "the experts' weights: int8 (W8A8, the "
               "A3's kernels) or fp8_e4m3 / fp8_e5m2 (MX, E8M0 per 32 along K: the 950's); "
               "bfloat16, int4 and MX FP4 are refused", choices=WEIGHT_DTYPES),
        Option("num_max_dispatch_tokens_per_rank", "int", 0, "the low-latency kernels' "
               "argument (global_bs = it x W); 0: bs", lo=0, hi=131072),
        Option("hccl_buffsize", "int", 0, "HCCL_BUFFSIZE in MB; 0: the smallest the form's "
               "host check accepts", lo=0, hi=65536),
    )

    def runs_of(self, options: Mapping[str, Any] | None = None
                ) -> Mapping[str, tuple[str, ...]]:
        return {"moe_layer": pick(forms.FORMS, options).run}

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Any:
        return pick(forms.FORMS, options).tiling(shape, options, hardware, timing_only)

    def window(self, tiling: Any) -> Any:
        return _of_tiling(tiling).window(tiling)

    def run_fields(self, tiling: Any, runs: Any) -> list[dict[str, Any]]:
        return layer_fields(runs)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        form = pick(forms.FORMS, options)
        bad = chip_misfit(forms.FORMS, form, options, platform(hardware), hardware.name)
        if bad is None and getattr(hardware, "aic", None) is None:
            bad = Misfit("hardware.aic", f"{hardware.name}: the layer's GEMMs run on the "
                         "cube cores, and the preset has none; allowed: a preset with aic")
        return bad or form.misfit(shape, options, hardware)

    def tiling_misfit(self, tiling: Any, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        return _of_tiling(tiling).tiling_misfit(tiling, hardware)

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        return pick(forms.FORMS, options).make_inputs(shape, options, op, routing, payload)

    def op_inputs(self, kernel: str, tiling: Any, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        return BY_KERNEL[kernel].op_inputs(kernel, tiling, inputs, previous)


FAMILY = MoeLayer()
