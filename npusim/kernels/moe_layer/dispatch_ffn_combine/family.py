"""What family moe_layer calls for ``form: dispatch_ffn_combine``: the tiling, the
refusals, the inputs as the DeepEP test hands them to DispatchFFNCombine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.family import Misfit
from npusim.kernels.moe_layer.dispatch_ffn_combine.program import DFC
from npusim.kernels.moe_layer.dispatch_ffn_combine.reference import DfcWeights, reference_layer
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import (
    DfcTiling,
    buffsize,
    dfc_misfit,
    dfc_tiling_misfit,
)
from npusim.workload.shape import MoeShape

FORM = "dispatch_ffn_combine"
RUNS = {"moe_layer": (DFC.name,)}
__all__ = ["DFC", "FORM", "RUNS", "DfcTiling", "misfit", "rank_inputs", "reference_outputs",
           "segment", "tiling", "tiling_misfit", "weights_of"]


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> DfcTiling:
    return DfcTiling(shape, options["intermediate"], buffsize(shape, options),
                     int(hardware.aic.cores), timing_only)


def segment(t: DfcTiling) -> Any:
    """The symmetric HCCL segment the kernel lays out (its window)."""
    return t.segment


def misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any) -> Misfit | None:
    return dfc_misfit(shape, options, hardware)


def tiling_misfit(t: DfcTiling, hardware: Any) -> Misfit | None:
    return dfc_tiling_misfit(t, hardware)


def _bits(scale: np.ndarray) -> np.ndarray:
    """scale_from_float_to_int64 (test_dispatch_ffn_combine.py 61-70): fp32 bits, int64."""
    return np.ascontiguousarray(scale.astype(np.float32)).view(np.int32).astype(np.int64)


def rank_inputs(base: Mapping[str, np.ndarray], experts: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """One rank's tensors: the unfused form's tokens, routing and weights (the same draw,
    so the two forms compare on one layer), the scales as int64 fp32 bits; w2's scale is
    the unfused form's bf16 value widened (exact in fp32)."""
    return {"x": base["x"], "expert_ids": base["topk_idx"].astype(np.int32),
            "probs": base["topk_weights"].astype(np.float32),
            "w1": experts["gmm1_weight"], "scale1": _bits(experts["gmm1_weight_scale"]),
            "w2": experts["gmm2_weight"], "scale2": _bits(experts["gmm2_weight_scale"])}


def reference_outputs(t: DfcTiling, inputs: list[Mapping[str, np.ndarray]]
                      ) -> list[dict[str, np.ndarray]]:
    """What a correct kernel writes: `out` and `expert_token_nums` per rank."""
    got = reference_layer([a["x"] for a in inputs], [a["expert_ids"] for a in inputs],
                          [a["probs"] for a in inputs], [weights_of(a) for a in inputs], t.L)
    return [{"out": y, "expert_token_nums": s.expert_token_nums}
            for y, s in zip(got.y, got.stages, strict=True)]


def weights_of(a: Mapping[str, np.ndarray]) -> DfcWeights:
    def f32(bits: np.ndarray) -> np.ndarray:
        return bits.astype(np.int32).view(np.float32)
    return DfcWeights(a["w1"], f32(a["scale1"]), a["w2"], f32(a["scale2"]))
