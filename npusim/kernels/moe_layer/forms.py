"""The forms family moe_layer runs, one per `workload.form` and chip: what each form's
package gives, as the family calls it (npusim.kernels.moe_layer.form)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.kernels.kernel import Arrays
from npusim.kernels.moe_layer import fused_deep_moe as fdm
from npusim.kernels.moe_layer import unfused
from npusim.kernels.moe_layer.a5 import form as a5_unfused
from npusim.kernels.moe_layer.a5.tiling import A5LayerTiling
from npusim.kernels.moe_layer.dispatch_ffn_combine import family as dfc
from npusim.kernels.moe_layer.form import Form
from npusim.kernels.moe_layer.fused_deep_moe_a5 import kernel as fdm_a5
from npusim.kernels.moe_layer.fused_deep_moe_a5 import tiling as fdm_a5_tl
from npusim.kernels.moe_layer.tiling import LayerTiling
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

A3_BUILD = "ascend910_93"


def _as_given(kernel: str, tiling: Any, inputs: list[Arrays], previous: Any) -> list[Arrays]:
    return inputs


def _fdm_inputs(shape: MoeShape, options: Mapping[str, Any], op: str, routing: Routing,
                payload: bool) -> list[Arrays]:
    return unfused.make_inputs(shape, options, op, routing, payload, fp32_w2_scale=True)


def _fdm_op_inputs(kernel: str, tiling: Any, inputs: list[Arrays], previous: Any
                   ) -> list[Arrays]:
    return [fdm.fused_inputs(a) for a in inputs]


def _dfc_inputs(shape: MoeShape, options: Mapping[str, Any], op: str, routing: Routing,
                payload: bool) -> list[Arrays]:
    return [dfc.rank_inputs(a, a) for a in unfused.make_inputs(shape, options, op, routing,
                                                                payload)]


def _fdm_a5_inputs(shape: MoeShape, options: Mapping[str, Any], op: str, routing: Routing,
                   payload: bool) -> list[Arrays]:
    base = unfused.ll.LOW_LATENCY.make_inputs(shape, unfused.deepep_options(options), op,
                                              routing, payload)
    return fdm_a5.make_inputs(shape, options, routing, base, payload)


def _a5_unfused_inputs(shape: MoeShape, options: Mapping[str, Any], op: str,
                       routing: Routing, payload: bool) -> list[Arrays]:
    return a5_unfused.make_inputs(shape, options, routing, payload)


def _a5_misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any) -> Any:
    return fdm_a5_tl.misfit(shape, options)


def _no_tiling_misfit(tiling: Any, hardware: Any) -> None:
    return None


FORMS = (
    Form("unfused", "a3", ("int8",), unfused.KERNELS, LayerTiling, unfused.tiling,
         unfused.misfit, unfused.tiling_misfit, unfused.window, unfused.make_inputs,
         unfused.op_inputs, f"DeepEP-Ascend's and ops-transformer's ops for {A3_BUILD}"),
    Form("unfused", "a5", a5_unfused.WEIGHT_DTYPES, a5_unfused.KERNELS, A5LayerTiling,
         a5_unfused.tiling, a5_unfused.misfit, _no_tiling_misfit, a5_unfused.window,
         _a5_unfused_inputs, a5_unfused.op_inputs,
         "the torch_npu ops test_fused_deep_moe_a5.py calls on ascend950"),
    Form("fused_deep_moe", "a3", ("int8",), (fdm.FUSED_DEEP_MOE,), fdm.LaunchTiling,
         fdm.launch_tiling, fdm.fused_misfit, fdm.launch_misfit, fdm.launch_window,
         _fdm_inputs, _fdm_op_inputs,
         f"op_host/fused_deep_moe.cpp:59-69, AddConfig({A3_BUILD})"),
    Form("fused_deep_moe", "a5", tuple(fdm_a5_tl.MODES), (fdm_a5.KERNEL,), fdm_a5_tl.A5Tiling,
         fdm_a5.tiling, _a5_misfit, fdm_a5.tiling_misfit, fdm_a5.A5Window,
         _fdm_a5_inputs, _as_given,
         "op_host/fused_deep_moe_a5/fused_deep_moe.cpp, AddConfig(ascend950)"),
    Form("dispatch_ffn_combine", "a3", ("int8",), (dfc.DFC,), dfc.DfcTiling, dfc.tiling,
         dfc.misfit, dfc.tiling_misfit, dfc.segment, _dfc_inputs, _as_given,
         f"op_host/dispatch_ffn_combine_def.cpp:78, AddConfig({A3_BUILD}) only"),
)
NAMES = tuple(dict.fromkeys(f.name for f in FORMS))
