"""FusedDeepMoe's reference steps that differ from the unfused chain's, by hand."""

from __future__ import annotations

import numpy as np

from npusim.kernels.moe_layer import reference as ref
from npusim.kernels.moe_layer.fused_deep_moe import reference as fr
from npusim.kernels.quant.golden import bf16

F32 = np.float32


def test_gate_up_permutation_puts_64_gate_then_64_up_columns_per_tile():
    n = 256  # I = 128: two tiles
    cols = np.arange(n)[None, :]
    p = fr.permute_gate_up(cols)[0]
    assert list(p[:64]) == list(range(0, 64))  # tile 0: gate 0..63
    assert list(p[64:128]) == list(range(128, 192))  # then up 0..63 (original I + 0..63)
    assert list(p[128:192]) == list(range(64, 128))  # tile 1: gate 64..127
    assert list(p[192:]) == list(range(192, 256))
    w = np.random.default_rng(0).integers(-16, 16, (3, 5, 512), dtype=np.int8)
    assert np.array_equal(fr.unpermute_gate_up(fr.permute_gate_up(w)), w)


def test_block_quant_multiplies_by_127_then_by_the_reciprocal():
    v = np.array([[1.0, -0.5, 0.25, 3.0]], F32)
    q, s = fr.block_quant(v)
    inv = F32(1.0) / F32(3.0)
    want = np.rint((v * F32(127.0)).astype(F32) * inv).astype(np.int8)
    assert np.array_equal(q, want)
    assert q[0, 3] == 127
    assert s[0] == F32(F32(3.0) * F32(1.0 / 127.0))


def test_block_quant_of_a_zero_row_is_zero():
    q, s = fr.block_quant(np.zeros((1, 8), F32))
    assert not q.any() and s[0] == 0


def test_block_quant_and_dequant_swiglu_quant_differ_by_an_lsb_at_most():
    rng = np.random.default_rng(7)
    acc = rng.integers(-200_000, 200_000, (64, 512)).astype(np.int32)
    ws = rng.uniform(0.0015, 0.0019, 512).astype(F32)
    ts = rng.uniform(0.001, 0.01, 64).astype(F32)
    qu, su = ref.dequant_swiglu_quant(acc, ws, ts)
    qf, sf = fr.dequant_swiglu_block_quant(acc, ws, ts)
    assert np.array_equal(su, sf)  # the same scale
    d = np.abs(qu.astype(np.int16) - qf.astype(np.int16))
    assert d.max() <= 1


def test_one_expert_by_hand_uses_the_fp32_w2_scale():
    """One token, one expert: H = 2, I = 1 (w13 [1, 2, 2], w2 [1, 1, 2])."""
    x = [bf16(np.array([[1.0, -2.0]], F32))]
    ids = [np.array([[0]], np.int32)]
    weights = [np.array([[1.0]], F32)]
    s2 = np.array([[0.0015001, 0.0019]], F32)  # not a bf16 value
    wt = ref.ExpertWeights(np.array([[[3, 2], [1, -4]]], np.int8), np.array([[0.5, 0.25]], F32),
                           np.array([[[5, -7]]], np.int8), s2)
    got = fr.reference_fused_layer(x, ids, weights, [wt], 1)
    st = got.stages[0]
    # dispatch: amax 2, s = 63.5; q = [64 (63.5 rounds to even), -127]; scale 1 / 63.5
    assert list(st.recv_x[0]) == [64, -127]
    a_s = F32(1.0) / F32(63.5)
    assert list(st.gmm1[0]) == [64 * 3 - 127 * 1, 64 * 2 - 127 * -4]
    out = ref.dequant_swiglu(st.gmm1, wt.s1[0], np.array([a_s], F32))
    q, s = fr.block_quant(out)
    assert np.array_equal(st.swiglu, q) and np.array_equal(st.swiglu_scale, s)
    acc = np.array([[int(q[0, 0]) * 5, int(q[0, 0]) * -7]], np.int32)
    y = bf16(((acc.astype(F32) * s2).astype(F32) * s[:, None]).astype(F32))
    assert np.array_equal(st.gmm2.view(np.uint16), y.view(np.uint16))
    assert np.array_equal(got.y[0].view(np.uint16), bf16((y.astype(F32) * F32(1.0)).astype(F32)
                                                         ).view(np.uint16))
