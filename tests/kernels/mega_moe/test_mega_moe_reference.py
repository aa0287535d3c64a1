"""The MegaMoE numpy reference against hand arithmetic and an unquantised layer."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.kernels.mega_moe import reference as ref
from npusim.kernels.mega_moe.inputs import harness_weights, random_weights
from npusim.kernels.quant import BF16, golden


def test_mx_scale_is_floor_log2_amax_minus_emax():
    # e4m3: emax 8 (448 = 1.75 * 2^8); e5m2: 15 (57344 = 1.75 * 2^15)
    assert golden.emax("e4m3") == 8 and golden.emax("e5m2") == 15
    x = np.ones((2, 32))
    x[1, 0] = 500.0  # floor(log2 500) = 8 -> e = 0, byte 127; 500 saturates to 448
    codes, scales = ref.mx_quantize(x, "e4m3")
    assert scales.tolist() == [[127 - 8], [127]]  # amax 1: e = 0 - 8
    back = ref.mx_dequantize(codes, scales, "e4m3")
    assert back[0, 0] == 1.0  # 1 / 2^-8 = 256, exact in e4m3
    assert back[1, 0] == 448.0 and back[1, 1] == 1.0
    zero_codes, zero_scales = ref.mx_quantize(np.zeros((1, 32)), "e5m2")
    assert zero_scales.tolist() == [[0]] and not zero_codes.any()


def test_closed_form_by_hand():
    # H = 4096: silu(4096) = 4096 (exp(-4096) underflows), times H times F/2 = 512: 2^33
    assert ref.closed_form(4096, 1024) == 2.0 ** 33
    assert ref.closed_form(64, 128) == pytest.approx(64 * 64 * 64, rel=1e-12)


def _ones_case(W, BS, H, K, L, F, mode):
    x = [np.ones((BS, H), BF16) for _ in range(W)]
    E = W * L
    ids = [((np.arange(BS * K).reshape(BS, K) + r) % E).astype(np.int32) for r in range(W)]
    w = [np.full((BS, K), 1.0 / K, np.float32) for _ in range(W)]
    return x, ids, w, [harness_weights(L, H, F, mode) for _ in range(W)]


@pytest.mark.parametrize("mode", ["e4m3", "e5m2"])
def test_all_ones_layer_gives_the_closed_form(mode):
    # each path: H = 64 -> u = 64, silu(64) * 64 = 4096 -> 64 rows of 4096: 2^18 exactly
    W, BS, H, K, L, F = 2, 4, 64, 3, 2, 128
    x, ids, w, wt = _ones_case(W, BS, H, K, L, F, mode)
    got = ref.reference_layer(x, ids, w, wt, L, mode)
    for r in range(W):
        y = got.y[r].astype(np.float64)
        assert np.allclose(y, 2.0 ** 18, rtol=1e-2)
        # counts: how often rank r's experts occur in all ids, by hand from the rule
        want = [sum(int((i == r * L + le).sum()) for i in ids) for le in range(L)]
        assert got.expert_token_counts[r].tolist() == want
    assert sum(int(c.sum()) for c in got.expert_token_counts) == W * BS * K


def test_random_layer_is_close_to_the_unquantised_one():
    rng = np.random.default_rng(1)
    W, BS, H, K, L, F = 2, 6, 128, 2, 2, 128
    mode = "e4m3"
    x = [rng.uniform(-1, 1, (BS, H)).astype(np.float32).astype(BF16) for _ in range(W)]
    ids = [np.stack([rng.choice(W * L, K, replace=False) for _ in range(BS)]).astype(np.int32)
           for _ in range(W)]
    w = [rng.uniform(0, 1, (BS, K)).astype(np.float32) for _ in range(W)]
    wt = [random_weights(rng, L, H, F, mode) for _ in range(W)]
    got = ref.reference_layer(x, ids, w, wt, L, mode)
    # the same layer in float64 on the dequantised weights, activations unquantised
    for s in range(W):
        want = np.zeros((BS, H))
        for t in range(BS):
            for k in range(K):
                e = int(ids[s][t, k])
                r, le = divmod(e, L)
                w1 = ref.mx_dequantize_k(wt[r].w1[le], wt[r].s1[le], mode)
                w2 = ref.mx_dequantize_k(wt[r].w2[le], wt[r].s2[le], mode)
                u = x[s][t].astype(np.float64) @ w1
                g, up = u[:F // 2], u[F // 2:]
                want[t] += w[s][t, k] * ((g / (1 + np.exp(-g)) * up) @ w2)
        err = np.linalg.norm(got.y[s].astype(np.float64) - want) / np.linalg.norm(want)
        assert 0 < err < 0.1  # FP8 activations: a few percent, never exact
