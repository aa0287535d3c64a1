"""The simulated dispatch kernel is bit-exact with the numpy reference.

Every output of every rank (expand_x, dynamic_scales, assist_info_for_combine,
expert_token_nums, ep_recv_count) must equal cann_sample.reference.reference_dispatch byte for
byte, with the same shape and dtype, full [A, ...] buffers included (rows past the received
count are zero). The cases together cover W in {2, 4, 8, 16}, BS in {1, 8, 33, 256},
H in {1024, 7168}, K in {1, 4, 8}, L in {1, 4, 8}, every dispatch quant mode, fp16 and bf16,
balanced / uniform / zipf routing (with empty experts and ranks that receive nothing) and
expert_token_nums_type cumsum. Expected values never come from the simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from npusim.kernels.cann_sample.reference import dispatch_plan
from tests.kernels.cann_sample.samplehelp import (
    U,
    case_id,
    check_dispatch_outputs,
    dispatch_ref,
    run,
    scenario,
    simulate_with,
    workload_inputs,
)


def _c(W, BS, H, K, L, quant, dtype="float16", routing=None, empty=False, **extra):
    w = dict(op="dispatch", ep_world_size=W, bs=BS, h=H, k=K, experts_per_rank=L,
             dispatch_quant=quant, dtype=dtype, **extra)
    if routing is not None:
        w["routing"] = routing
    return pytest.param(w, empty, id=case_id(**w) + ("-empty" if empty else ""))


BF = "bfloat16"
CASES = [
    _c(2, 1, 1024, 1, 1, "mxfp8"),  # smallest: one token per rank, one expert per rank
    _c(2, 8, 7168, 4, 4, "none", BF),
    _c(2, 256, 1024, 8, 4, "mxfp8", routing=U(3)),
    _c(4, 33, 1024, 4, 4, "mxfp8", BF, U(1)),
    _c(4, 33, 1024, 8, 4, "mxfp8", routing=U(6), expert_token_nums_type="cumsum"),
    _c(4, 256, 1024, 8, 8, "int8", routing=U(2)),
    _c(4, 8, 7168, 8, 8, "mxfp8", BF, U(8)),
    # 4 tokens over 16 experts: ranks 0 and 3 receive nothing, 13 experts stay empty
    _c(4, 1, 1024, 1, 4, "int8", routing=U(1), empty=True),
    # zipf s=3 around expert 0: rank 0 gets 238 of 256 rows, ranks 4, 5, 6 get none
    _c(8, 8, 1024, 4, 8, "none", routing={"kind": "zipf", "seed": 0, "s": 3.0}, empty=True),
    _c(8, 33, 7168, 8, 1, "int8", BF, U(5)),
    _c(8, 8, 7168, 8, 4, "mxfp8"),
    # the sample's BS=256 row: several UB batches per status index in the local copy
    _c(8, 256, 7168, 8, 4, "mxfp8"),
    _c(16, 8, 1024, 8, 4, "mxfp8", BF, U(4)),
    _c(16, 33, 1024, 1, 1, "none"),
    # E = 128 experts: four cum-sum cores hand partial sums to each other
    _c(16, 8, 1024, 8, 8, "int8", routing=U(7)),
]


@pytest.mark.parametrize(("workload", "empty"), CASES)
def test_dispatch_bit_exact(tmp_path: Path, workload: dict[str, Any], empty: bool) -> None:
    sc, res = run(tmp_path, **workload)
    (op,) = res.ops
    assert op.op == "dispatch"
    inp = workload_inputs(sc)
    if empty:  # the case really has empty experts and a rank that receives nothing
        L = sc.workload.shape.L
        plans = dispatch_plan(inp.expert_ids, L)
        assert min(p.n for p in plans) == 0
        per_expert = np.concatenate([p.counts.reshape(L, -1).sum(axis=1) for p in plans])
        assert (per_expert == 0).any()
    check_dispatch_outputs(op.outputs, dispatch_ref(sc, inp.x, inp.expert_ids))


def test_dispatch_hand_table(tmp_path: Path) -> None:
    """W=2, L=2 (E=4), BS=2, K=2, balanced: the sample's round robin, worked out by hand.

    Flat ids (0 1 2 3)(1 2 3 0) -> rank 0 tokens [[0,1],[2,3]], rank 1 [[1,2],[3,0]].
    Rank 0 (experts 0, 1), by local expert, source rank, flat index:
      e0: (src0, t0, k0), (src1, t1, k1);  e1: (src0, t0, k1), (src1, t0, k0)
    Rank 1 (experts 2, 3):
      e2: (src0, t1, k0), (src1, t0, k1);  e3: (src0, t1, k1), (src1, t1, k0)
    Every (local expert, source) pair carries one row: ep_recv_count = [1, 2, 3, 4].
    """
    sc, res = run(tmp_path, ep_world_size=2, bs=2, h=1024, k=2, experts_per_rank=2,
                  dispatch_quant="none", expert_token_nums_type="cumsum")
    x = workload_inputs(sc).x
    out = res.ops[0].outputs
    rows = {0: [(0, 0, 0), (1, 1, 1), (0, 0, 1), (1, 0, 0)],
            1: [(0, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 0)]}
    for r in (0, 1):
        A = 2 * 2 * 2
        assert out[r]["assist_info_for_combine"].tolist() == [list(t) for t in rows[r]] + \
            [[0, 0, 0]] * (A - 4)
        assert out[r]["ep_recv_count"].tolist() == [1, 2, 3, 4]
        assert out[r]["expert_token_nums"].tolist() == [2, 4]  # cumsum of [2, 2]
        ex = out[r]["expand_x"]
        assert ex.shape == (A, 1024) and ex.dtype == np.float16
        for i, (src, token, _) in enumerate(rows[r]):
            assert ex[i].tobytes() == x[src][token].tobytes()
        assert not ex[4:].view(np.uint16).any()
        assert out[r]["dynamic_scales"].shape == (A, 0)


@pytest.mark.parametrize("saturate", [False, True], ids=["no-saturation", "saturate"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dispatch_mxfp8_overflow_edge(tmp_path: Path, saturate: bool, dtype: str) -> None:
    """Blocks whose elements scale past the largest e5m2 (|x| >= 1.875 * 2^floor(log2 amax)):
    inf bytes without saturation (the sample), +-57344 with it; plus a zero block."""
    W, BS, H, K, L = 2, 4, 1024, 2, 2
    sc = scenario(tmp_path, ep_world_size=W, bs=BS, h=H, k=K, experts_per_rank=L,
                  dispatch_quant="mxfp8", dtype=dtype, mxfp8_saturate=saturate)
    inp = workload_inputs(sc)
    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    x = [a.copy() for a in inp.x]
    x[0][0, :32] = np.array([7.75, -7.5, 3.0] + [1.0] * 29, np.float32).astype(dt)
    x[0][1, 32:64] = 0
    x[1][3, 992:] = np.array([-0.1234, 0.125] * 16, np.float32).astype(dt)
    inputs = [{"x": x[r], "expert_ids": inp.expert_ids[r]} for r in range(W)]
    res = simulate_with(sc, inputs)
    ref = dispatch_ref(sc, x, inp.expert_ids)
    # the edge is really there: the reference quantises 7.75 (scale exponent 2) to inf or 57344
    e5m2 = ml_dtypes.float8_e5m2
    src_row = np.nonzero((ref[0]["assist_info_for_combine"][:, :2] == [0, 0]).all(axis=1))[0]
    first = ref[0]["expand_x"][src_row[0], :2].view(e5m2).astype(np.float32)
    assert first.tolist() == ([57344.0, -57344.0] if saturate else [np.inf, -np.inf])
    check_dispatch_outputs(res.ops[0].outputs, ref)
