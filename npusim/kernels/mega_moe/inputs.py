"""The MegaMoE inputs of one run: seeded random tensors, or the harness's all-ones case.

`inputs: harness` is the example harness's verification case (README, "correctness"):
x all ones (bf16), routing weights 1/K, every weight the FP8 code of 1 and every E8M0
scale the code of 1 (127), so every path gives silu(H) * H * F/2. The harness draws its
expert ids by a deterministic rule of (token, k, rank) that its README does not spell
out; npusim takes them from `workload.routing` (balanced by default: the CANN sample's
deterministic round robin), which the closed form does not depend on.

`inputs: random`: x ~ U(-10, 10) in bf16, routing weights U(0, 1); weights are FP8 codes
of N(0, 1) draws (saturated) with E8M0 scales 2^-(round(log2 sqrt(K)) + j), j in {0, 1, 2}
drawn per block, so each projection keeps its outputs of order one to ten.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.mega_moe.reference import Weights
from npusim.kernels.quant import BF16, MXFP8_BLOCK, fp8_format
from npusim.workload.inputs import uniform_tokens


def _codes(rng: np.random.Generator, shape: tuple[int, ...], mode: str) -> np.ndarray:
    v = np.clip(rng.standard_normal(shape), -fp8_format(mode)[1], fp8_format(mode)[1])
    return v.astype(fp8_format(mode)[0]).view(np.uint8)


def _scales(rng: np.random.Generator, shape: tuple[int, ...], k: int) -> np.ndarray:
    base = 127 - int(round(np.log2(np.sqrt(k))))
    return (base - rng.integers(0, 3, size=shape)).astype(np.uint8)


def random_weights(rng: np.random.Generator, L: int, H: int, F: int, mode: str) -> Weights:
    f2 = F // 2
    return Weights(_codes(rng, (L, H, F), mode), _scales(rng, (L, H // MXFP8_BLOCK, F), H),
                   _codes(rng, (L, f2, H), mode), _scales(rng, (L, f2 // MXFP8_BLOCK, H), f2))


def harness_weights(L: int, H: int, F: int, mode: str) -> Weights:
    one = np.ones(1).astype(fp8_format(mode)[0]).view(np.uint8)[0]
    f2 = F // 2
    b = MXFP8_BLOCK
    return Weights(np.full((L, H, F), one, np.uint8), np.full((L, H // b, F), 127, np.uint8),
                   np.full((L, f2, H), one, np.uint8), np.full((L, f2 // b, H), 127, np.uint8))


def make_rank_inputs(rng: np.random.Generator, BS: int, H: int, K: int, L: int, F: int,
                     mode: str, harness: bool, ids: np.ndarray, payload: bool
                     ) -> dict[str, np.ndarray]:
    """One rank's named inputs (the kernel's GM tensor names)."""
    if harness:
        x = np.ones((BS, H), BF16)
        w = np.full((BS, K), 1.0 / K, np.float32)
        wt = harness_weights(L, H, F, mode)
    elif payload:
        x = uniform_tokens(rng, (BS, H), BF16)
        w = rng.uniform(0.0, 1.0, (BS, K)).astype(np.float32)
        wt = random_weights(rng, L, H, F, mode)
    else:  # timing only: values do not matter, sizes do
        x = np.zeros((BS, H), BF16)
        w = np.zeros((BS, K), np.float32)
        wt = harness_weights(L, H, F, mode)
    return {"x": x, "expert_ids": np.ascontiguousarray(ids, np.int32), "routing_weights": w,
            "weight1": wt.w1, "weight1_scale": wt.s1, "weight2": wt.w2, "weight2_scale": wt.s2}


def weights_of(arrays: dict[str, np.ndarray]) -> Weights:
    return Weights(arrays["weight1"], arrays["weight1_scale"], arrays["weight2"],
                   arrays["weight2_scale"])
