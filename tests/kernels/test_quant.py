"""Quantisation maths: hand-computed bytes, golden-algorithm cross-checks, no-NaN guarantees."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from npusim.kernels.quant import (
    INT8_BLOCK,
    MXFP8_BLOCK,
    int8_block_dequantize,
    int8_block_quantize,
    int8_block_round_trip,
    int8_token_dequantize,
    int8_token_quantize,
    mxfp8_dequantize,
    mxfp8_quantize,
    token_dtype,
)

BF16 = ml_dtypes.bfloat16


def test_constants():
    assert MXFP8_BLOCK == 32 and INT8_BLOCK == 8


# ----------------------------------------------------------------------------- MXFP8


def test_mxfp8_hand_block():
    # Block 0: amax 3.0 = 1.5 * 2^1 -> biased exponent 128 -> scale byte 128 - 15 = 113.
    # Elements are x * 2^(127 - 113) = x * 2^14 in e5m2 (bias 15, 2 mantissa bits).
    x = np.zeros((1, 64), dtype=np.float16)
    x[0, :9] = [3.0, 1.0, -0.5, 0.0, 1.25, 1.125, 1.375, 2.0**-16, -3.0]
    data, scales = mxfp8_quantize(x)
    assert data.dtype == np.uint8 and data.shape == (1, 64)
    assert scales.dtype == np.uint8 and scales.shape == (1, 2)
    assert scales[0].tolist() == [113, 0]  # second block all zero -> 0 (2^-127)
    expected = [
        0x7A,  # 3 * 2^14 = 1.5 * 2^15: exp 30, mantissa 10
        0x74,  # 2^14: exp 29
        0xF0,  # -2^13: sign, exp 28
        0x00,
        0x75,  # 1.25 * 2^14: mantissa 01
        0x74,  # 1.125: tie between 1.0 and 1.25 -> even (1.0)
        0x76,  # 1.375: tie between 1.25 and 1.5 -> even (1.5)
        0x34,  # 2^-16 * 2^14 = 2^-2: exp 13
        0xFA,
    ]
    assert data[0, :9].tolist() == expected
    assert not data[0, 9:].any()


def test_mxfp8_scale_padding_and_tail():
    x = np.ones((2, 70), dtype=np.float16)  # ceil(70/32) = 3 blocks -> 4 scale bytes
    data, scales = mxfp8_quantize(x)
    assert data.shape == (2, 70) and scales.shape == (2, 4)
    # amax 1.0 -> biased 127 -> scale 112; 1.0 * 2^15 -> exp 30, mantissa 0 -> 0x78
    assert scales.tolist() == [[112, 112, 112, 0]] * 2
    assert (data == 0x78).all()


def test_mxfp8_overflow_and_saturation():
    # amax 61440 = 1.875 * 2^15 -> scale byte 142 - 15 = 127 -> multiplier 1.
    x = np.array([[61440.0, 60000.0, -61440.0] + [0.0] * 29], dtype=np.float16)
    data, scales = mxfp8_quantize(x)
    assert scales[0, 0] == 127
    # 61440 is the tie between 57344 (max) and 2^16: RNE -> "2^16" -> inf, no saturation
    assert data[0, :3].tolist() == [0x7C, 0x7B, 0xFC]
    data_s, _ = mxfp8_quantize(x, saturate=True)
    assert data_s[0, :3].tolist() == [0x7B, 0x7B, 0xFB]


def test_mxfp8_nonfinite_block():
    x = np.zeros((1, 64), dtype=np.float16)
    x[0, 0] = np.inf
    x[0, 1] = -np.float16(np.nan)  # a negative NaN input keeps its sign in the golden
    x[0, 40] = 2.0
    data, scales = mxfp8_quantize(x)
    assert scales[0].tolist() == [0xFF, 128 - 15]
    assert data[0, 0] == 0x7E and data[0, 1] == 0xFE and (data[0, 2:32] == 0x7E).all()
    assert data[0, 40] == 0x78
    deq = mxfp8_dequantize(data, scales)
    assert np.isnan(deq[0, :32]).all() and deq[0, 40] == 2.0


def test_mxfp8_extreme_exponents():
    # fp16 subnormal amax 2^-24: biased 103 -> scale 88 -> 2^-24 * 2^39 = 2^15 -> 0x78
    x = np.zeros((1, 32), dtype=np.float16)
    x[0, 0] = np.float16(2.0**-24)
    d, s = mxfp8_quantize(x)
    assert s[0, 0] == 88 and d[0, 0] == 0x78
    # bf16 amax 2^100: biased 227 -> 212; bf16 tiny amax 2^-120: biased 7 -> clamp 0
    xb = np.zeros((2, 32), dtype=BF16)
    xb[0, 0] = BF16(2.0**100)
    xb[1, 0] = BF16(2.0**-120)
    d, s = mxfp8_quantize(xb)
    assert s[:, 0].tolist() == [212, 0]
    # 2^-120 * 2^127 = 2^7 -> e5m2 exp 22 -> 0b0_10110_00
    assert d[0, 0] == 0x78 and d[1, 0] == 0x58


def _golden_style_mx(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Independent re-derivation of the sample golden's algorithm with float64 maths:
    shared exponent floor(log2(amax)) - 15 (amax 0 -> -127, clamp to [-127, 127]), private
    exponent floor(log2|v|) clipped at -14, mantissa rounded half-even on a 2-bit grid."""
    rows, h = x.shape
    nb = math.ceil(h / 32)
    v = np.zeros((rows, nb * 32))
    v[:, :h] = x.astype(np.float64)
    v = v.reshape(rows, nb, 32)
    amax = np.abs(v).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        share = np.floor(np.log2(np.where(amax == 0, 1.0, amax))) - 15
    share = np.where(amax == 0, -127, np.clip(share, -127, 127))
    scaled = v / 2.0**share
    with np.errstate(divide="ignore"):
        pexp = np.floor(np.log2(np.where(scaled == 0, 1.0, np.abs(scaled))))
    pexp = np.maximum(pexp, -14)
    q = np.rint(scaled / 2.0**pexp * 4) / 4 * 2.0**pexp
    data = q.astype(np.float32).astype(ml_dtypes.float8_e5m2).view(np.uint8)
    data = data.reshape(rows, nb * 32)[:, :h]
    sc = np.zeros((rows, nb + nb % 2), dtype=np.uint8)
    sc[:, :nb] = (share[:, :, 0] + 127).astype(np.uint8)
    return data, sc


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_mxfp8_matches_golden_algorithm(dtype):
    rng = np.random.default_rng(1)
    rows, h = 64, 7 * 32 + 5
    mant = rng.uniform(-2, 2, size=(rows, h))
    lo, hi = (-20, 15) if dtype is np.float16 else (-60, 60)
    row_exp = rng.integers(lo, hi, size=(rows, 1))
    elem_exp = rng.integers(-18, 1, size=(rows, h))  # spread inside a block -> subnormals
    x = (mant * 2.0 ** (row_exp + elem_exp)).astype(np.float32).astype(dtype)
    x[0, :40] = 0
    x[1, 3] = np.float32(-0.0)
    data, scales = mxfp8_quantize(x)
    gd, gs = _golden_style_mx(x)
    np.testing.assert_array_equal(scales, gs)
    np.testing.assert_array_equal(data, gd)


def test_mxfp8_dequantize_error_bound():
    rng = np.random.default_rng(2)
    x = rng.uniform(-10, 10, size=(16, 7168)).astype(np.float16)
    xf = x.astype(np.float32)
    d, s = mxfp8_quantize(x, saturate=True)
    back = mxfp8_dequantize(d, s)
    assert back.dtype == np.float32
    # 2 mantissa bits: |err| <= 2^-3 |x| for normals; e5m2 subnormals sit 2^-16 * 2^(s-127)
    # apart; saturation at 1.75 * 2^(s-112) costs up to 2^-4 * 2^(s-111) for |x| < 2^(s-111)
    scale = np.repeat(2.0 ** (s[:, :224].astype(np.float64) - 127), 32, axis=1)
    assert np.all(np.abs(back - xf) <= 0.125 * np.abs(xf) + scale * 2.0**-17)
    assert mxfp8_dequantize(d, s, out_dtype="float16").dtype == np.float16
    # without saturation (the sample) exactly the elements with |x| * 2^(127-s) >= 61440
    # (mantissa >= 1.875 times the block's power of two) become inf
    d0, s0 = mxfp8_quantize(x)
    assert np.array_equal(s0, s)
    back0 = mxfp8_dequantize(d0, s0)
    overflow = np.abs(xf) / scale >= 61440
    assert overflow.any()
    assert np.array_equal(np.isinf(back0), overflow)
    assert np.array_equal(back0[~overflow], back[~overflow])


# ----------------------------------------------------------------------------- per-token INT8


def test_int8_token_hand():
    x = np.array([[1.0, -2.0, 0.5, 0.0]], dtype=np.float16)
    q, scale = int8_token_quantize(x)
    # d = 127/2 = 63.5: 63.5 -> 64 (half even), -127, 31.75 -> 32, 0
    assert q.dtype == np.int8 and q.tolist() == [[64, -127, 32, 0]]
    assert scale.dtype == np.float32 and scale[0] == np.float32(1) / np.float32(63.5)
    back = int8_token_dequantize(q, scale)
    assert np.allclose(back, x.astype(np.float32), atol=1 / 63.5 / 2 + 1e-7)


def test_int8_token_zero_row_has_no_nan():
    x = np.zeros((2, 16), dtype=BF16)
    x[1, 5] = BF16(3.0)
    q, scale = int8_token_quantize(x)
    assert not q[0].any() and scale[0] == 0.0 and np.isfinite(scale).all()
    assert q[1, 5] == 127
    back = int8_token_dequantize(q, scale, out_dtype=BF16)
    assert back.dtype == BF16 and not np.isnan(back.astype(np.float32)).any()


# ----------------------------------------------------------------------------- combine INT8 block


def test_int8_block_hand():
    x = np.zeros((1, 20), dtype=np.float16)  # 3 real blocks, Align16(20)/8 = 4 scales
    x[0, :3] = [0.5, -1.0, 0.25]
    x[0, 8:16] = np.arange(1, 9)
    q, s = int8_block_quantize(x)
    assert q.shape == (1, 32) and q.dtype == np.int8
    assert s.shape == (1, 4) and s.dtype == np.float16
    # block 0: m = 1, s = 1/127; 0.5/s = 63.5 -> fp16 63.5 -> rint 64; 0.25/s = 31.75 -> 32
    assert q[0, :3].tolist() == [64, -127, 32]
    # fp16(1/127): 1/127 = 2^-7 * 1.00787..., 10-bit mantissa 8.06/1024 -> 8 -> 0x2008
    assert s.view(np.uint16)[0, 0] == 0x2008
    # block 1: m = 8, q = rint(fp16(i * 127 / 8)): 15.875 -> 16, 31.75 -> 32, 47.625 -> 48 ...
    assert q[0, 8:16].tolist() == [16, 32, 48, 64, 79, 95, 111, 127]
    # block 2 (all zero) and the pad block: max 0 -> scale 1.0, no NaN
    assert s[0, 2:].tolist() == [1.0, 1.0] and not q[0, 16:].any()
    back = int8_block_dequantize(q, s, 20, out_dtype=np.float16)
    assert back.shape == (1, 20) and np.isfinite(back.astype(np.float32)).all()
    assert back[0, 1] == np.float16(-127 * np.float32(s[0, 0]))


def test_int8_block_zero_rows():
    x = np.zeros((3, 7168), dtype=np.float16)
    q, s = int8_block_quantize(x)
    assert s.shape == (3, 896) and (s == 1.0).all() and not q.any()
    assert not int8_block_round_trip(x).any()


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_int8_block_round_trip_error(dtype):
    rng = np.random.default_rng(3)
    x = rng.uniform(-10, 10, size=(8, 1000)).astype(np.float32).astype(dtype)
    back = int8_block_round_trip(x)
    assert back.dtype == np.dtype(dtype)
    xf = x.astype(np.float32)
    m = np.repeat(np.abs(xf).reshape(8, 125, 8).max(axis=2), 8, axis=1)
    tol = m / 127 * 0.5 + m / 127 * 2.0**-7 * 127 + np.abs(xf) * 2.0**-7
    assert np.all(np.abs(back.astype(np.float32) - xf) <= tol)


def test_int8_block_scale_dtype_is_selectable():
    x = np.array([[300.0] + [0.0] * 7], dtype=BF16)
    _, s16 = int8_block_quantize(x)
    _, sb = int8_block_quantize(x, scale_dtype=BF16)
    assert s16.dtype == np.float16 and sb.dtype == BF16
    assert float(sb[0, 0]) == float(BF16(np.float32(300.0) / np.float32(127)))


def test_int8_block_recip_equals_divide_for_every_fp16():
    """The kernel multiplies by fp32(1/127), the golden divides: for every positive fp16 block
    max the stored fp16 scale and the q of every fp16 element in [0, max] agree."""
    m = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    s_div = m / np.float32(127)
    s_rec = m * (np.float32(1) / np.float32(127))
    assert (s_div != s_rec).sum() > 1000  # the fp32 scales do differ ...
    assert np.array_equal(s_div.astype(np.float16), s_rec.astype(np.float16))  # ... not stored
    f = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    for i in np.nonzero(s_div != s_rec)[0]:
        ff = f[f <= m[i]]
        qa = np.rint((ff / s_div[i]).astype(np.float16))
        qb = np.rint((ff / s_rec[i]).astype(np.float16))
        assert np.array_equal(qa, qb)


def test_token_dtype_names():
    assert token_dtype("float16") == np.float16
    assert token_dtype("bfloat16") == BF16
    with pytest.raises(ValueError, match="allowed"):
        token_dtype("float32")
