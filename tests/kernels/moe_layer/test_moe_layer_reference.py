"""The layer reference against arithmetic done by hand."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from npusim.kernels.moe_layer import reference as ref


def test_dispatch_quant_of_one_row():
    x = np.array([[1.0, -2.0, 0.5, 4.0]], ml_dtypes.bfloat16)
    q, s = ref.dispatch_quant(x)
    # 127 / 4 = 31.75: 31.75, -63.5, 15.875, 127 -> RINT (half to even: -63.5 -> -64)
    assert q.tolist() == [[32, -64, 16, 127]]
    assert s[0] == np.float32(1.0) / np.float32(31.75)


def test_dequant_swiglu_quant_of_one_row():
    acc = np.array([[100, -50, 20, 10]], np.int32)
    ws = np.array([0.5, 1.0, 2.0, 1.0], np.float32)
    q, s = ref.dequant_swiglu_quant(acc, ws, np.array([0.1], np.float32))
    # x = [5, -5, 4, 1]: A = [5, -5] activated, B = [4, 1]
    silu = [a / (1 + math.exp(-a)) for a in (5.0, -5.0)]
    out = [4.0 * silu[0], 1.0 * silu[1]]
    amax = max(abs(v) for v in out)
    assert math.isclose(float(s[0]), amax / 127, rel_tol=1e-6)
    assert q.tolist() == [[127, round(out[1] / (amax / 127))]] == [[127, 0]]


def test_gmm2_dequant_rounds_to_bf16_after_both_scales():
    acc = np.array([[1000, -3]], np.int32)
    scale = np.array([0.5, 0.25], ml_dtypes.bfloat16)
    y = ref.gmm2_dequant(acc, scale, np.array([0.003], np.float32))
    want = [1000 * 0.5 * 0.003, -3 * 0.25 * 0.003]
    for got, w in zip(y[0].astype(np.float64), want, strict=True):
        assert abs(got - w) <= abs(w) * 2 ** -8  # one bf16 rounding


def test_int_matmul_is_exact_beyond_fp32():
    x = np.full((1, 7168), 127, np.int8)
    w = np.full((7168, 1), -128, np.int8)
    assert ref.int_matmul(x, w)[0, 0] == 7168 * 127 * -128  # |.| > 2^24


def test_layer_on_one_token_by_hand():
    """W = 1, one expert, K = 1, weight 1: y = bf16(w * expert(x))."""
    H, I2 = 4, 4
    x = [np.array([[1.0, -2.0, 0.5, 4.0]], ml_dtypes.bfloat16)]
    wt = ref.ExpertWeights(np.eye(H, I2, dtype=np.int8)[None], np.ones((1, I2), np.float32),
                           np.eye(I2 // 2, H, dtype=np.int8)[None],
                           np.ones((1, H), ml_dtypes.bfloat16))
    got = ref.reference_layer(x, [np.zeros((1, 1), np.int64)], [np.ones((1, 1), np.float32)],
                              [wt], 1)
    st = got.stages[0]
    assert st.counts.tolist() == [1]
    assert st.gmm1.tolist() == [[32, -64, 16, 127]]  # the identity: the quantised row
    a = np.float32(1.0) / np.float32(31.75)  # the dispatch scale
    act = [32 * a, -64 * a]
    out = [16 * a * act[0] / (1 + math.exp(-act[0])),
           127 * a * act[1] / (1 + math.exp(-act[1]))]
    amax = max(abs(v) for v in out)
    assert st.swiglu.tolist() == [[round(v / (amax / 127)) for v in out]]
    assert got.y[0].shape == (1, H)
    assert np.array_equal(got.y[0].view(np.uint16), st.gmm2.view(np.uint16))  # weight 1
