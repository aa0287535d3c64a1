"""Reference dispatch/combine semantics on hand-built tables and golden-style re-derivations."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npusim.kernels.cann_sample.reference import (
    dispatch_plan,
    expert_outputs_from_dispatch,
    reference_combine,
    reference_dispatch,
)
from npusim.kernels.quant import int8_block_round_trip, int8_token_quantize, mxfp8_quantize
from npusim.workload.inputs import generate_inputs
from npusim.workload.shape import MoeShape


def _tiny():
    # W=2 ranks, L=2 experts per rank (E=4), BS=2, K=2, H=4; rank 0 hosts experts 0,1
    ids = [np.array([[0, 1], [0, 2]], np.int32), np.array([[1, 0], [3, 0]], np.int32)]
    x = [
        np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float16),
        np.array([[-1, -2, -3, -4], [-5, -6, -7, -8]], np.float16),
    ]
    return x, ids


def test_dispatch_hand_table():
    x, ids = _tiny()
    out = reference_dispatch(x, ids, L=2, quant="none")
    A = 2 * 2 * 2
    r0, r1 = out
    # rank 0, by local expert, then source rank, then flat index token*K+k:
    # expert 0: src0 flat0 (t0,k0), src0 flat2 (t1,k0), src1 flat1 (t0,k1), src1 flat3 (t1,k1)
    # expert 1: src0 flat1 (t0,k1), src1 flat0 (t0,k0)
    assert r0["assist_info_for_combine"].tolist() == [
        [0, 0, 0],
        [0, 1, 0],
        [1, 0, 1],
        [1, 1, 1],
        [0, 0, 1],
        [1, 0, 0],
        [0, 0, 0],
        [0, 0, 0],
    ]
    assert r0["ep_recv_count"].tolist() == [2, 4, 5, 6]  # counts [2, 2, 1, 1] at le*W+src
    assert r0["ep_recv_count"].dtype == np.int32
    assert r0["expert_token_nums"].tolist() == [4, 2]
    assert r0["expert_token_nums"].dtype == np.int64
    ex = r0["expand_x"]
    assert ex.shape == (A, 4) and ex.dtype == np.float16
    assert ex[:6, 0].tolist() == [1, 5, -1, -5, 1, -1] and not ex[6:].any()
    assert r0["dynamic_scales"].shape == (A, 0)
    # rank 1: expert 2: src0 flat3 (t1,k1); expert 3: src1 flat2 (t1,k0)
    assert r1["assist_info_for_combine"][:2].tolist() == [[0, 1, 1], [1, 1, 0]]
    assert not r1["assist_info_for_combine"][2:].any()
    assert r1["ep_recv_count"].tolist() == [1, 1, 1, 2]
    assert r1["expert_token_nums"].tolist() == [1, 1]
    cum = reference_dispatch(x, ids, L=2, quant="none", expert_token_nums_type="cumsum")
    assert cum[0]["expert_token_nums"].tolist() == [4, 6]


def test_dispatch_quantised_rows():
    x, ids = _tiny()
    mx = reference_dispatch(x, ids, L=2, quant="mxfp8")
    d1, s1 = mxfp8_quantize(x[1][1:2])
    assert mx[0]["expand_x"].dtype == np.uint8 and mx[0]["expand_x"].shape == (8, 4)
    assert mx[0]["dynamic_scales"].shape == (8, 2) and mx[0]["dynamic_scales"].dtype == np.uint8
    assert np.array_equal(mx[0]["expand_x"][3], d1[0])  # row 3 is (src1, t1)
    assert np.array_equal(mx[0]["dynamic_scales"][3], s1[0])
    assert not mx[0]["dynamic_scales"][6:].any()
    i8 = reference_dispatch(x, ids, L=2, quant="int8")
    q, s = int8_token_quantize(x[0][1:2])
    assert i8[0]["expand_x"].dtype == np.int8 and i8[0]["dynamic_scales"].shape == (8,)
    assert np.array_equal(i8[0]["expand_x"][1], q[0]) and i8[0]["dynamic_scales"][1] == s[0]


def _golden_style_plan(ids_per_rank, L):
    """The golden script's construction: per source, stable sort of flat entries by expert;
    exchange concatenated by source rank; receiver stable sort by local expert."""
    W = len(ids_per_rank)
    K = ids_per_rank[0].shape[1]
    recv = [[] for _ in range(W)]
    for s, ids in enumerate(ids_per_rank):
        flat = ids.reshape(-1)
        for f in sorted(range(flat.size), key=lambda i: flat[i]):  # sorted() is stable
            e = int(flat[f])
            recv[e // L].append((e % L, s, f // K, f % K))
    out = []
    for r in range(W):
        rows = sorted(recv[r], key=lambda t: t[0])
        counts = np.zeros(L * W, np.int64)
        for le, s, _, _ in rows:
            counts[le * W + s] += 1
        out.append(([(s, t, k) for _, s, t, k in rows], np.cumsum(counts)))
    return out


@pytest.mark.parametrize("routing", ["uniform", "zipf", "balanced"])
def test_dispatch_matches_golden_construction(routing):
    inp = generate_inputs(MoeShape(W=4, BS=9, H=32, K=3, L=3), routing=routing, seed=5,
                          with_combine=False)
    plans = dispatch_plan(inp.expert_ids, 3)
    for plan, (rows, cum) in zip(plans, _golden_style_plan(inp.expert_ids, 3), strict=True):
        assert list(zip(plan.src.tolist(), plan.token.tolist(), plan.k.tolist(), strict=True)) == [
            tuple(r) for r in rows
        ]
        assert np.array_equal(np.cumsum(plan.counts), cum)


def test_dispatch_drops_out_of_range_ids():
    x, ids = _tiny()
    ids = [ids[0].copy(), ids[1].copy()]
    ids[0][0, 1] = 4  # == E: a "special" expert, never sent
    ids[1][1, 0] = -1
    out = reference_dispatch(x, ids, L=2, quant="none")
    assert out[0]["ep_recv_count"][-1] == 5 and out[1]["ep_recv_count"][-1] == 1


def test_combine_hand_sum():
    x, ids = _tiny()
    disp = reference_dispatch(x, ids, L=2, quant="none")
    # expert outputs: rank 0 rows 0..5 = 1..6 (all H), rank 1 rows 0..1 = 10, 20
    exp = [np.zeros((8, 4), np.float16), np.zeros((8, 4), np.float16)]
    exp[0][:6] = np.arange(1, 7, dtype=np.float16)[:, None]
    exp[1][:2] = np.array([10, 20], np.float16)[:, None]
    w = [np.array([[0.5, 0.25], [2.0, -1.0]], np.float32), np.array([[1, 2], [3, 4]], np.float32)]
    res = reference_combine(
        exp,
        [d["assist_info_for_combine"] for d in disp],
        [d["ep_recv_count"] for d in disp],
        ids,
        w,
        MoeShape(W=2, BS=2, H=4, K=2, L=2, dtype="float16"),
        quant="none",
    )
    # rank 0 token 0: (k0 -> r0 row0 = 1) * 0.5 + (k1 -> r0 row4 = 5) * 0.25 = 1.75
    # rank 0 token 1: (k0 -> r0 row1 = 2) * 2 + (k1 -> r1 row0 = 10) * -1 = -6
    # rank 1 token 0: (k0 -> r0 row5 = 6) * 1 + (k1 -> r0 row2 = 3) * 2 = 12
    # rank 1 token 1: (k0 -> r1 row1 = 20) * 3 + (k1 -> r0 row3 = 4) * 4 = 76
    assert res[0].dtype == np.float16
    assert res[0][:, 0].tolist() == [1.75, -6.0] and res[1][:, 0].tolist() == [12.0, 76.0]
    assert (res[0] == res[0][:, :1]).all()


def test_combine_int8_and_skip_and_compact():
    x, ids = _tiny()
    disp = reference_dispatch(x, ids, L=2, quant="none")
    rng = np.random.default_rng(0)
    exp = [rng.uniform(-10, 10, (8, 4)).astype(np.float16) for _ in range(2)]
    w = [np.array([[0.5, 0.25], [2.0, -1.0]], np.float32), np.ones((2, 2), np.float32)]
    args = (
        [d["assist_info_for_combine"] for d in disp],
        [d["ep_recv_count"] for d in disp],
    )
    got = reference_combine(exp, *args, ids, w, MoeShape(2, 2, 4, 2, 2), quant="int8")
    rt0 = int8_block_round_trip(exp[0][:6]).astype(np.float32)
    rt1 = int8_block_round_trip(exp[1][:2]).astype(np.float32)
    expect_t1 = np.float32(0) + rt0[1] * np.float32(2.0) + rt1[0] * np.float32(-1.0)
    assert np.array_equal(got[0][1], expect_t1.astype(np.float16))
    # an id outside [0, E) is skipped; compact weights shift the next weight forward
    ids2 = [ids[0].copy(), ids[1]]
    ids2[0][1, 0] = 7
    skip = reference_combine(exp, *args, ids2, w, MoeShape(2, 2, 4, 2, 2), quant="none")
    assert np.array_equal(skip[0][1], (exp[1][0].astype(np.float32) * -1).astype(np.float16))
    comp = reference_combine(exp, *args, ids2, w, MoeShape(2, 2, 4, 2, 2), quant="none",
                             compact_weights=True)
    assert np.array_equal(comp[0][1], (exp[1][0].astype(np.float32) * 2).astype(np.float16))


def test_combine_missing_row_is_an_error():
    x, ids = _tiny()
    disp = reference_dispatch(x, ids, L=2, quant="none")
    recv = [d["ep_recv_count"].copy() for d in disp]
    recv[1][-1] = 1  # rank 1 claims to hold only one row
    with pytest.raises(ValueError, match="received no row"):
        reference_combine(
            [d["expand_x"] for d in disp],
            [d["assist_info_for_combine"] for d in disp],
            recv,
            ids,
            [np.ones((2, 2), np.float32)] * 2,
            MoeShape(2, 2, 4, 2, 2),
            quant="none",
        )


@pytest.mark.parametrize(
    ("dquant", "dtype"), [("mxfp8", "float16"), ("int8", "bfloat16"), ("none", "float16")]
)
def test_round_trip_identity_experts(dquant, dtype):
    W, BS, H, K, L = 4, 16, 256, 4, 2
    inp = generate_inputs(MoeShape(W, BS, H, K, L, dtype=dtype), routing="uniform", seed=3)
    # saturate: unsaturated e5m2 turns |x| >= 1.875 * 2^floor(log2 amax) into inf
    disp = reference_dispatch(inp.x, inp.expert_ids, L, quant=dquant, saturate=True)
    experts = [expert_outputs_from_dispatch(d, dquant, H, dtype) for d in disp]
    rng = np.random.default_rng(4)
    w = [rng.uniform(0.1, 1.0, (BS, K)).astype(np.float32) for _ in range(W)]
    w = [(a / a.sum(axis=1, keepdims=True)).astype(np.float32) for a in w]
    out = reference_combine(
        experts,
        [d["assist_info_for_combine"] for d in disp],
        [d["ep_recv_count"] for d in disp],
        inp.expert_ids,
        w,
        MoeShape(W, BS, H, K, L, dtype=dtype),
        quant="int8",
    )
    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    for r in range(W):
        assert out[r].dtype == dt
        x = inp.x[r].astype(np.float32)
        err = np.abs(out[r].astype(np.float32) - x)
        qerr = {"mxfp8": 0.125, "int8": 10 / 127, "none": 0.0}[dquant]
        tol = qerr * (np.abs(x) if dquant == "mxfp8" else 1) + 10 / 127 + 0.02 * np.abs(x) + 1e-3
        assert np.all(err <= tol), float(err.max())
