"""The simulated combine kernel is bit-exact with the numpy reference, and dispatch -> combine
with identity experts returns the tokens within an independently derived quantisation bound.

Op combine: x of every rank equals reference_combine on the same expand_x, routing and
weights (assist info and counts as dispatch would produce them). Op dispatch_combine:
combine consumes the simulated dispatch outputs through identity experts; the expected x is
reference_dispatch -> expert_outputs_from_dispatch -> reference_combine. The kernel's INT8
arithmetic multiplies by fp32(1/127) (recip=True); for fp16 tokens that is bit-identical to
the golden's division (recip=False), so fp16 cases check both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from npusim.kernels.cann_sample.reference import expert_outputs_from_dispatch, reference_dispatch
from tests.kernels.cann_sample.samplehelp import (
    U,
    assert_bytes_equal,
    case_id,
    check_dispatch_outputs,
    check_x,
    combine_ref,
    dispatch_ref,
    round_trip_bound,
    run,
    scenario,
    simulate_with,
    workload_inputs,
)

BF = "bfloat16"
ZIPF3 = {"kind": "zipf", "seed": 0, "s": 3.0}


def _c(op, W, BS, H, K, L, cq, dq="none", dtype="float16", routing=None):
    w = dict(op=op, ep_world_size=W, bs=BS, h=H, k=K, experts_per_rank=L,
             dispatch_quant=dq, combine_quant=cq, dtype=dtype)
    if routing is not None:
        w["routing"] = routing
    return pytest.param(w, id=case_id(**w))


COMBINE_CASES = [
    _c("combine", 2, 1, 1024, 1, 1, "int8"),
    _c("combine", 2, 8, 7168, 4, 4, "none", dtype=BF),
    _c("combine", 4, 33, 1024, 4, 4, "int8", dtype=BF, routing=U(1)),
    _c("combine", 4, 256, 1024, 8, 8, "int8", routing=U(3)),
    _c("combine", 4, 1, 1024, 1, 4, "none", routing=U(1)),  # ranks 0 and 3 send nothing
    _c("combine", 8, 8, 7168, 8, 4, "none"),
    _c("combine", 8, 33, 7168, 8, 1, "int8", dtype=BF, routing=U(5)),
    _c("combine", 8, 8, 1024, 4, 8, "int8", routing=ZIPF3),  # one hot rank, three idle
    _c("combine", 16, 8, 1024, 8, 8, "int8", routing=U(2)),
    _c("combine", 16, 33, 1024, 1, 1, "none", dtype=BF),
]
CHAIN_CASES = [
    _c("dispatch_combine", 2, 8, 1024, 4, 4, "int8", "none"),
    _c("dispatch_combine", 2, 256, 1024, 8, 4, "int8", "int8", routing=U(3)),
    _c("dispatch_combine", 4, 33, 1024, 4, 4, "int8", "mxfp8", routing=U(4)),
    _c("dispatch_combine", 4, 1, 1024, 1, 4, "none", "mxfp8", BF, U(1)),
    _c("dispatch_combine", 8, 8, 7168, 8, 4, "int8", "mxfp8"),  # the sample's BS=8 pair
    _c("dispatch_combine", 8, 8, 7168, 8, 1, "none", "int8", BF, U(5)),
    _c("dispatch_combine", 8, 33, 1024, 4, 8, "int8", "none", BF, ZIPF3),
    _c("dispatch_combine", 16, 8, 1024, 8, 4, "int8", "mxfp8", BF, U(6)),
]


@pytest.mark.parametrize("workload", COMBINE_CASES)
def test_combine_bit_exact(tmp_path: Path, workload: dict[str, Any]) -> None:
    sc, res = run(tmp_path, **workload)
    (op,) = res.ops
    assert op.op == "combine"
    inp = workload_inputs(sc)
    disp = reference_dispatch(inp.x, inp.expert_ids, sc.workload.shape.L, "none")
    ref = combine_ref(sc, inp.expand_x, inp.expert_ids, inp.expert_scales, True, disp)
    check_x(op.outputs, ref, "kernel arithmetic, recip")
    if sc.workload.dtype == "float16":
        golden = combine_ref(sc, inp.expand_x, inp.expert_ids, inp.expert_scales, False, disp)
        check_x(op.outputs, golden, "golden arithmetic, divide")


# Unsaturated MXFP8 (the sample's rule) turns an element >= 1.875 * 2^floor(log2 amax) of its
# block into inf (blocks whose amax lies in [7.5, 8) with U(-10, 10) tokens); the INT8 block
# of 8 holding it then dequantises 0 * inf = NaN, in the kernel and the reference alike.
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("workload", CHAIN_CASES)
def test_dispatch_combine_bit_exact(tmp_path: Path, workload: dict[str, Any]) -> None:
    sc, res = run(tmp_path, **workload)
    assert [op.op for op in res.ops] == ["dispatch", "combine"]
    w = sc.workload
    inp = workload_inputs(sc)
    disp = dispatch_ref(sc, inp.x, inp.expert_ids)
    check_dispatch_outputs(res.ops[0].outputs, disp)  # so combine sees what we assume
    experts = [expert_outputs_from_dispatch(d, w.dispatch_quant, w.shape.H, w.dtype) for d in disp]
    ref = combine_ref(sc, experts, inp.expert_ids, inp.expert_scales, True, disp)
    check_x(res.ops[1].outputs, ref, "kernel arithmetic, recip")
    if w.dtype == "float16":
        golden = combine_ref(sc, experts, inp.expert_ids, inp.expert_scales, False, disp)
        check_x(res.ops[1].outputs, golden, "golden arithmetic, divide")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_combine_divide_arithmetic_selectable(tmp_path: Path, dtype: str) -> None:
    """combine_recip: false runs the golden's m / 127 and matches reference recip=False."""
    sc, res = run(tmp_path, op="combine", ep_world_size=4, bs=8, h=1024, k=4,
                  experts_per_rank=4, dispatch_quant="none", combine_quant="int8", dtype=dtype,
                  combine_recip=False, routing=U(9))
    assert sc.workload.combine_recip is False
    inp = workload_inputs(sc)
    ref = combine_ref(sc, inp.expand_x, inp.expert_ids, inp.expert_scales, False)
    check_x(res.ops[0].outputs, ref, "golden arithmetic, divide")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_combine_int8_zero_blocks(tmp_path: Path, dtype: str) -> None:
    """INT8 blocks whose max is 0 (+0 or -0, a whole zero row) give zeros, never NaN."""
    sc = scenario(tmp_path, op="combine", ep_world_size=4, bs=8, h=1024, k=4,
                  experts_per_rank=4, dispatch_quant="none", combine_quant="int8", dtype=dtype)
    inp = workload_inputs(sc)
    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    ex = [e.copy() for e in inp.expand_x]
    ex[0][:, :8] = 0
    ex[1][3] = 0
    ex[2][:, 16:24] = dt(-0.0)
    ex[3][:, 1016:] = 0
    inputs = [{"x": inp.x[r], "expert_ids": inp.expert_ids[r],
               "expert_scales": inp.expert_scales[r], "expand_x": ex[r]} for r in range(4)]
    res = simulate_with(sc, inputs)
    ref = combine_ref(sc, ex, inp.expert_ids, inp.expert_scales, True)
    for r in range(4):
        assert not np.isnan(res.ops[0].outputs[r]["x"].astype(np.float32)).any()
    check_x(res.ops[0].outputs, ref, "zero blocks")


# --------------------------------------------------------------------------- round trip
# dispatch -> identity experts -> combine with weights summing to 1 returns x within
# the quantisation error bound derived in samplehelp.round_trip_bound.


ROUND_TRIPS = [
    ("none", "none", "float16"),
    ("none", "none", "bfloat16"),
    ("mxfp8", "int8", "float16"),
    ("mxfp8", "none", "bfloat16"),
    ("int8", "int8", "bfloat16"),
    ("int8", "none", "float16"),
    ("none", "int8", "float16"),
    ("mxfp8", "int8", "bfloat16"),
]


@pytest.mark.parametrize("weights", ["one_over_k", "random_normalised"])
@pytest.mark.parametrize(("dquant", "cquant", "dtype"), ROUND_TRIPS,
                         ids=[f"{d}-c{c}-{t}" for d, c, t in ROUND_TRIPS])
def test_round_trip_identity_experts(tmp_path: Path, dquant: str, cquant: str, dtype: str,
                                     weights: str) -> None:
    W, BS, H, K, L = 4, 8, 1024, 4, 4
    # saturating e5m2: without it an element >= 1.875 * 2^floor(log2 amax) of its block
    # becomes inf (the sample's behaviour, checked bit-exactly in test_dispatch)
    sc = scenario(tmp_path, op="dispatch_combine", ep_world_size=W, bs=BS, h=H, k=K,
                  experts_per_rank=L, dispatch_quant=dquant, combine_quant=cquant,
                  dtype=dtype, mxfp8_saturate=True, routing=U(11))
    inp = workload_inputs(sc)
    if weights == "one_over_k":  # 1/4 is exact: the weights sum to exactly 1
        ws = [np.full((BS, K), 1.0 / K, np.float32) for _ in range(W)]
    else:
        rng = np.random.default_rng(12)
        ws = [rng.uniform(0.05, 1.0, (BS, K)).astype(np.float32) for _ in range(W)]
        ws = [(a / a.sum(axis=1, keepdims=True)).astype(np.float32) for a in ws]
    inputs = [{"x": inp.x[r], "expert_ids": inp.expert_ids[r], "expert_scales": ws[r]}
              for r in range(W)]
    res = simulate_with(sc, inputs)
    assert [op.op for op in res.ops] == ["dispatch", "combine"]
    for r in range(W):
        x = inp.x[r]
        got = res.ops[1].outputs[r]["x"]
        assert got.dtype == x.dtype and got.shape == x.shape
        g = got.astype(np.float64)
        assert np.isfinite(g).all()
        if dquant == cquant == "none" and weights == "one_over_k":
            # K equal rows times 1/4 add up exactly in fp32: the tokens come back unchanged
            assert_bytes_equal(got, x, f"rank {r} x round trip")
            continue
        err = np.abs(g - x.astype(np.float64))
        bound = round_trip_bound(x, ws[r], dquant, cquant, dtype)
        worst = np.unravel_index(int(np.argmax(err - bound)), err.shape)
        assert (err <= bound).all(), (
            f"rank {r} token {worst[0]} element {worst[1]}: x={float(x[worst]):g}, "
            f"got {float(g[worst]):g}, error {float(err[worst]):g} > bound {bound[worst]:g}")
        # the bound is not vacuous: within 2^-3 of |x| plus 3 % of the token's max
        ax = np.abs(x.astype(np.float64))
        assert (bound <= 0.14 * ax + 0.03 * ax.max(axis=1, keepdims=True)).all()
