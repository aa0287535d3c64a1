"""The experts' weights of one rank as test_fused_deep_moe_a5.py draws them (156-182):
bf16 uniform in [-1, 1), npu_dynamic_mx_quant(axis=1) to FP8 codes with E8M0 scales per
32 along K (gmm1 [E_loc, H, 2I], gmm2 [E_loc, I, H]). A timing-only run gets zeros."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.fused_deep_moe_a5.reference import MxWeights
from npusim.kernels.quant import BF16
from npusim.kernels.quant.recipes import mx_quantize_bf16

SEED_SALT = 0xA5  # the weights' stream, apart from the tokens' and the routing's


def _mx_along_k(w: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """[L, K, N] bf16 -> codes [L, K, N], scales [L, K/32, N] (blocks along K)."""
    L, k, n = w.shape
    rows = np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(L * n, k)
    codes, scales = mx_quantize_bf16(rows, mode, zero_subnormal_blocks=True)
    return (np.ascontiguousarray(codes.reshape(L, n, k).transpose(0, 2, 1)),
            np.ascontiguousarray(scales.reshape(L, n, k // 32).transpose(0, 2, 1)))


def a5_expert_inputs(L: int, H: int, n1: int, mode: str, rank: int, routing: Any,
                     payload: bool) -> dict[str, np.ndarray]:
    """One rank's gmm1 / gmm2 weights and scales, seeded by the routing's seed and rank."""
    n2 = n1 // 2
    if not payload:
        return {"gmm1_weight": np.zeros((L, H, n1), np.uint8),
                "gmm1_weight_scale": np.zeros((L, H // 32, n1), np.uint8),
                "gmm2_weight": np.zeros((L, n2, H), np.uint8),
                "gmm2_weight_scale": np.zeros((L, n2 // 32, H), np.uint8)}
    seed = int(routing.get("seed", 0)) if hasattr(routing, "get") else 0
    rng = np.random.default_rng([SEED_SALT, seed, rank])
    w1, s1 = _mx_along_k(rng.uniform(-1, 1, (L, H, n1)).astype(BF16), mode)
    w2, s2 = _mx_along_k(rng.uniform(-1, 1, (L, n2, H)).astype(BF16), mode)
    return {"gmm1_weight": w1, "gmm1_weight_scale": s1, "gmm2_weight": w2,
            "gmm2_weight_scale": s2}


def mx_weights_of(a: dict[str, np.ndarray]) -> MxWeights:
    return MxWeights(a["gmm1_weight"], a["gmm1_weight_scale"], a["gmm2_weight"],
                     a["gmm2_weight_scale"])
