"""The mc2 family's numpy reference (MoeDistributeDispatchV3 / CombineV3 semantics) on
hand-built tables: row order, counts, masks, special and shared experts, uneven BS, quant."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npusim.kernels.mc2.reference import (
    CombineInputs,
    DispatchInputs,
    mc2_shape,
    reference_combine,
    reference_dispatch,
    static_int8_quantize,
)

BF16 = ml_dtypes.bfloat16


def _x(rank: int, bs: int, h: int = 4) -> np.ndarray:
    # distinct small integers: exact in bf16, so hand sums are exact
    return (np.arange(bs * h).reshape(bs, h) + 1 + 100 * rank).astype(BF16)


def _tiny(mask=None, **kw):
    # W=2, L=2 (E=4), BS=2, K=2, H=4; rank 0 holds experts 0, 1; rank 1 holds 2, 3
    shape = mc2_shape(W=2, bs=(2, 2), H=4, K=2, E=4, **kw)
    ids = [np.array([[0, 1], [0, 2]], np.int32), np.array([[1, 0], [3, 0]], np.int32)]
    ins = [DispatchInputs(_x(r, 2), ids[r], x_active_mask=None if mask is None else mask[r])
           for r in range(2)]
    return shape, ids, ins


def test_dispatch_row_order_counts_and_token_nums():
    shape, ids, ins = _tiny()
    r0, r1 = reference_dispatch(shape, ins)
    # rank 0: expert 0 from src 0 (flat 0: t0k0, flat 2: t1k0), src 1 (flat 1, flat 3);
    # expert 1 from src 0 (flat 1) and src 1 (flat 0)
    assert r0.assist_info_for_combine[:r0.n].tolist() == [
        [0, 0, 0], [0, 1, 0], [1, 0, 1], [1, 1, 1], [0, 0, 1], [1, 0, 0]]
    # ep_recv_count over local_expert * W + src: counts (2, 2, 1, 1) -> cumsum
    assert r0.ep_recv_count.tolist() == [2, 4, 5, 6]
    assert r0.expert_token_nums.tolist() == [4, 2]
    # rank 1: expert 2 (local 0) from src 0 t1k1; expert 3 (local 1) from src 1 t1k0
    assert r1.assist_info_for_combine[:r1.n].tolist() == [[0, 1, 1], [1, 1, 0]]
    assert r1.ep_recv_count.tolist() == [1, 1, 1, 2]
    # rows are the source tokens
    assert np.array_equal(r0.expand_x[2], ins[1].x[0])
    # A = globalBs * min(L, K) = 4 * 2, zero beyond n
    assert r0.expand_x.shape == (8, 4) and not r1.expand_x[2:].any()
    cum = reference_dispatch(shape, ins, expert_token_nums_type=0)[0]
    assert cum.expert_token_nums.tolist() == [4, 6]


def _combine_inputs(shape, outs, ins, scales, **kw):
    return [CombineInputs(outs[r].expand_x, ins[r].expert_ids, expert_scales=scales[r], **kw)
            for r in range(shape.W)]


def test_combine_identity_experts_weighted_sum():
    shape, ids, ins = _tiny()
    outs = reference_dispatch(shape, ins)
    w = [np.array([[0.5, 0.25], [1.0, 2.0]], np.float32)] * 2
    y = reference_combine(shape, outs, _combine_inputs(shape, outs, ins, w))
    for r in range(2):
        # x * (w0 + w1), exact: small integers times dyadic weights
        want = (ins[r].x.astype(np.float32) * w[r].sum(axis=1, keepdims=True)).astype(BF16)
        assert np.array_equal(y[r], want)


def test_one_dim_mask_sends_the_prefix_and_leaves_the_rest_zero():
    shape, ids, ins = _tiny(mask=[np.array([True, False]), np.array([True, True])])
    r0, r1 = reference_dispatch(shape, ins)
    # rank 0's token 1 stays home: its (0, 1, 0) and (0, 1, 1) rows disappear
    assert [0, 1, 0] not in r0.assist_info_for_combine[:r0.n].tolist()
    assert r1.n == 1 and r1.assist_info_for_combine[0].tolist() == [1, 1, 0]
    w = [np.ones((2, 2), np.float32)] * 2
    cin = _combine_inputs(shape, [r0, r1], ins, w,
                          x_active_mask=None)
    cin[0].x_active_mask = np.array([True, False])
    y = reference_combine(shape, [r0, r1], cin)
    assert not y[0][1].any()
    assert np.array_equal(y[0][0], (ins[0].x[0].astype(np.float32) * 2).astype(BF16))


def test_two_dim_mask_drops_pairs_and_all_false_tokens():
    m = [np.array([[True, False], [False, False]]), np.array([[False, True], [True, True]])]
    shape, ids, ins = _tiny(mask=m)
    outs = reference_dispatch(shape, ins)
    sent = sorted(tuple(r) for o in outs for r in o.assist_info_for_combine[:o.n].tolist())
    assert sent == [(0, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    w = [np.full((2, 2), 0.5, np.float32)] * 2
    cin = _combine_inputs(shape, outs, ins, w)
    for r in range(2):
        cin[r].x_active_mask = m[r]
    y = reference_combine(shape, outs, cin)
    assert np.array_equal(y[0][0], (ins[0].x[0].astype(np.float32) * 0.5).astype(BF16))
    assert not y[0][1].any()  # all-false token: not written
    assert np.array_equal(y[1][1], ins[1].x[1])  # 0.5 + 0.5


def test_zero_copy_const_experts():
    # ids >= E: 4 = zero expert, 5 = copy expert, 6 = const expert 0
    shape = mc2_shape(W=2, bs=(1, 1), H=4, K=3, E=4, zero_experts=1, copy_experts=1,
                     const_experts=1)
    ids = [np.array([[0, 4, 5]], np.int32), np.array([[6, 2, 4]], np.int32)]
    ins = [DispatchInputs(_x(r, 1), ids[r]) for r in range(2)]
    outs = reference_dispatch(shape, ins)
    assert outs[0].n == 1 and outs[1].n == 1  # only ids 0 and 2 travel
    w = [np.array([[1.0, 8.0, 0.5]], np.float32), np.array([[0.5, 2.0, 8.0]], np.float32)]
    v = np.full((1, 4), 10.0, BF16)
    zeros = np.zeros((1, 4), BF16)  # <alpha, x> = 0 both: softmax gives 1/2, 1/2
    cin = [CombineInputs(outs[r].expand_x, ids[r], expert_scales=w[r], ori_x=ins[r].x,
                         const_alpha1=zeros, const_alpha2=zeros, const_v=v) for r in range(2)]
    y = reference_combine(shape, outs, cin)
    x0 = ins[0].x[0].astype(np.float32)
    assert np.array_equal(y[0][0], (x0 * 1.0 + x0 * 0.5).astype(BF16))  # zero adds nothing
    x1 = ins[1].x[0].astype(np.float32)
    assert np.array_equal(y[1][0], ((0.5 * x1 + 5.0) * 0.5 + x1 * 2.0).astype(BF16))


def test_const_expert_softmax_by_hand():
    shape = mc2_shape(W=2, bs=(1, 1), H=2, K=1, E=2, const_experts=1)
    ids = [np.array([[2]], np.int32), np.array([[0]], np.int32)]
    x = [np.array([[1.0, 0.0]], BF16), np.array([[3.0, 1.0]], BF16)]
    ins = [DispatchInputs(x[r], ids[r]) for r in range(2)]
    outs = reference_dispatch(shape, ins)
    a1 = np.array([[np.log(3.0), 0.0]], np.float32).astype(BF16)
    a2 = np.zeros((1, 2), BF16)
    v = np.array([[4.0, 8.0]], BF16)
    cin = [CombineInputs(outs[r].expand_x, ids[r], ori_x=x[r], const_alpha1=a1,
                         const_alpha2=a2, const_v=v) for r in range(2)]
    y = reference_combine(shape, outs, cin)
    # <a1, x> = ln 3 (bf16-rounded), <a2, x> = 0: a1' ~ 3/4, a2' ~ 1/4 -> (0.75 + 1, 2)
    np.testing.assert_allclose(y[0][0].astype(np.float32), [1.75, 2.0], rtol=1e-2)


def test_shared_experts_go_to_the_group_replica_and_add_with_weight_one():
    # W=4: ranks 0, 1 hold shared expert 0 (R = 2); ranks 2, 3 hold E = 4 MoE experts (L = 2)
    shape = mc2_shape(W=4, bs=(2,) * 4, H=4, K=1, E=4, S=1, S_r=2)
    ids = [np.array([[r % 4], [(r + 1) % 4]], np.int32) for r in range(4)]
    ins = [DispatchInputs(_x(r, 2), ids[r]) for r in range(4)]
    outs = reference_dispatch(shape, ins)
    # rank 0 receives from sources 0 and 2 (r mod 2 == 0), every token, k = K + 0 = 1
    assert outs[0].assist_info_for_combine[:outs[0].n].tolist() == [
        [0, 0, 1], [0, 1, 1], [2, 0, 1], [2, 1, 1]]
    assert outs[0].ep_recv_count[:4].tolist() == [2, 2, 4, 4]
    assert outs[0].expert_token_nums.tolist() == [4, 0]
    # A on a shared rank: maxBs * ceil(W / R) = 2 * 2
    assert outs[0].expand_x.shape[0] == 4
    w = [np.full((2, 1), 2.0, np.float32)] * 4
    y = reference_combine(shape, outs, _combine_inputs(shape, outs, ins, w))
    for r in range(4):
        assert np.array_equal(y[r], (ins[r].x.astype(np.float32) * 3).astype(BF16))


def test_uneven_bs_with_global_bs():
    shape = mc2_shape(W=2, bs=(3, 1), H=4, K=1, E=2, global_bs=6)
    ids = [np.array([[1], [1], [0]], np.int32), np.array([[1]], np.int32)]
    ins = [DispatchInputs(_x(r, shape.bs[r]), ids[r]) for r in range(2)]
    outs = reference_dispatch(shape, ins)
    assert shape.max_bs == 3 and outs[1].expand_x.shape[0] == 6  # A = globalBs * min(L, K)
    assert outs[1].assist_info_for_combine[:outs[1].n].tolist() == [[0, 0, 0], [0, 1, 0],
                                                                     [1, 0, 0]]
    with pytest.raises(ValueError, match="global_bs"):
        mc2_shape(W=2, bs=(3, 1), H=4, K=1, E=2)
    with pytest.raises(ValueError, match="global_bs"):
        mc2_shape(W=2, bs=(3, 1), H=4, K=1, E=2, global_bs=4)


def test_static_int8_rounding_and_saturation():
    x = np.array([1.25, -2.5, 3.5, 100.0], BF16)
    assert static_int8_quantize(x, np.array([2.0], np.float32)).tolist() == [2, -5, 7, 127]
    assert static_int8_quantize(x, np.array([1.0, 1.0, 1.0, -2.0], np.float32)).tolist() == [
        1, -2, 4, -128]  # rint: ties to even; 100 * -2 saturates


@pytest.mark.parametrize("layout", ["scalar", "per_channel", "per_expert"])
def test_static_int8_scale_shapes(layout):
    shape, ids, ins = _tiny()
    if layout == "scalar":
        sc = np.array([0.5], np.float32)
    elif layout == "per_channel":
        sc = np.array([1.0, 0.5, 0.25, 2.0], np.float32)
    else:
        sc = (np.arange(4, dtype=np.float32)[:, None] + 1) * np.ones((1, 4), np.float32) / 8
    for i in ins:
        i.scales = sc
    r0 = reference_dispatch(shape, ins, quant="static_int8")[0]
    assert r0.dynamic_scales is None and r0.expand_x.dtype == np.int8
    # row 4 is (src 0, t 0, k 1), expert 1: x = 1, 2, 3, 4
    x = np.array([1, 2, 3, 4], np.float32)
    s = sc[1] if layout == "per_expert" else sc
    assert r0.expand_x[4].tolist() == np.clip(np.rint(x * s), -128, 127).astype(int).tolist()


def test_int8_per_token_with_smooth_scales():
    shape, ids, ins = _tiny()
    smooth = np.ones((4, 4), np.float32)
    smooth[2] = [1, 1, 1, 0.5]  # expert 2 halves the last channel
    for i in ins:
        i.scales = smooth
    r1 = reference_dispatch(shape, ins, quant="int8")[1]
    # row 0: (src 0, t 1, k 1) -> expert 2: x = 5, 6, 7, 8 * 0.5 = 4 -> max 7
    assert r1.expand_x[0].tolist() == [91, 109, 127, 73]  # rint(127/7 * (5, 6, 7, 4))
    assert r1.dynamic_scales[0] == np.float32(1) / (np.float32(127) / np.float32(7))


def test_combine_int8_is_the_block_round_trip():
    shape, ids, ins = _tiny()
    outs = reference_dispatch(shape, ins)
    w = [np.ones((2, 2), np.float32)] * 2
    exact = reference_combine(shape, outs, _combine_inputs(shape, outs, ins, w))
    q = reference_combine(shape, outs, _combine_inputs(shape, outs, ins, w), quant="int8")
    for r in range(2):
        rel = np.abs(q[r].astype(np.float32) - exact[r].astype(np.float32))
        assert (rel <= np.abs(exact[r].astype(np.float32)) / 127 + 1e-6).all()


def test_expand_scales_carry_the_pair_weight():
    shape, ids, ins = _tiny()
    for r, i in enumerate(ins):
        i.expert_scales = np.array([[1, 2], [3, 4]], np.float32) + 10 * r
    r0 = reference_dispatch(shape, ins)[0]
    # rows: (0,0,0) (0,1,0) (1,0,1) (1,1,1) (0,0,1) (1,0,0)
    assert r0.expand_scales[:r0.n].tolist() == [1, 3, 12, 14, 2, 11]
