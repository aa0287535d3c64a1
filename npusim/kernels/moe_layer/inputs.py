"""The experts' weights of one rank as the DeepEP test draws them
(tests/python/deepep/test_fused_deep_moe.py 20-46): int8 uniform in [-16, 16), fp32
per-channel scales uniform in [0.0015, 0.0019); w2's scale handed to GroupedMatmul as
bf16 (212-222: w2_scale.to(bfloat16)). A timing-only run gets zeros (np.zeros: pages
mapped on first write, which nothing does)."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.reference import ExpertWeights
from npusim.kernels.quant import BF16
from npusim.workload.shape import MoeShape

SEED_SALT = 0x5EED  # the weights' stream, apart from the tokens' and the routing's


def expert_inputs(shape: MoeShape, i2: int, rank: int, routing: Any, payload: bool,
                  fp32_w2_scale: bool = False) -> dict[str, np.ndarray]:
    """The weights; with `fp32_w2_scale` also w2's scale as drawn (fp32,
    gmm2_weight_scale_fp32), which FusedDeepMoe takes unconverted."""
    L, H, i1 = shape.L, shape.H, i2 // 2
    if not payload:
        s2 = np.zeros((L, H), np.float32)
        out = {"gmm1_weight": np.zeros((L, H, i2), np.int8),
               "gmm1_weight_scale": np.zeros((L, i2), np.float32),
               "gmm2_weight": np.zeros((L, i1, H), np.int8)}
    else:
        seed = int(routing.get("seed", 0)) if hasattr(routing, "get") else 0
        rng = np.random.default_rng([SEED_SALT, seed, rank])
        out = {"gmm1_weight": rng.integers(-16, 16, (L, H, i2), dtype=np.int8),
               "gmm1_weight_scale": rng.uniform(0.0015, 0.0019, (L, i2)).astype(np.float32),
               "gmm2_weight": rng.integers(-16, 16, (L, i1, H), dtype=np.int8)}
        s2 = rng.uniform(0.0015, 0.0019, (L, H)).astype(np.float32)
    out["gmm2_weight_scale"] = s2.astype(BF16)
    if fp32_w2_scale:
        out["gmm2_weight_scale_fp32"] = s2
    return out


def weights_of(a: dict[str, np.ndarray]) -> ExpertWeights:
    return ExpertWeights(a["gmm1_weight"], a["gmm1_weight_scale"], a["gmm2_weight"],
                         a["gmm2_weight_scale"])
