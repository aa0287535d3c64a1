"""The SHMEM ports' dispatch golden (npusim.kernels.common.padded) on a case worked by
hand: W 2 ranks, BS 2 tokens, K 2, L 2 local experts (expert e on rank e // 2)."""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.padded import padded_chain, padded_dispatch, padded_specs, returned
from npusim.kernels.kernel import Kernel, TensorSpec, const

# ids[src][token] = the token's two experts
IDS = [np.array([[0, 3], [1, 0]], np.int32), np.array([[2, 0], [3, 1]], np.int32)]
X = [np.array([[1, 1], [2, 2]], np.float32), np.array([[3, 3], [4, 4]], np.float32)]


def test_rows_are_by_local_expert_then_source_then_token_and_k():
    got = padded_dispatch(X, IDS, 2, capacity=6)
    # rank 0: expert 0 from src 0 (token 0 k 0, token 1 k 1), from src 1 (token 0 k 1);
    # expert 1 from src 0 (token 1 k 0), from src 1 (token 1 k 1)
    r0 = got[0]
    assert r0.triples[:5].tolist() == [[0, 0, 0], [0, 1, 1], [1, 0, 1], [0, 1, 0], [1, 1, 1]]
    assert r0.rows[:5, 0].tolist() == [1, 2, 3, 2, 4]
    assert r0.running.tolist() == [2, 3, 4, 5]  # entries (le 0, src 0), (0, 1), (1, 0), (1, 1)
    assert r0.per_expert.tolist() == [3, 2]
    assert not r0.rows[5:].any() and not r0.triples[5:].any()  # past the count: zero
    # rank 1: expert 2 from src 1 (token 0 k 0); expert 3 from src 0 (token 0 k 1), src 1
    # (token 1 k 0)
    r1 = got[1]
    assert r1.triples[:3].tolist() == [[1, 0, 0], [0, 0, 1], [1, 1, 0]]
    assert r1.running.tolist() == [0, 1, 2, 3] and r1.per_expert.tolist() == [1, 2]


def test_each_row_comes_back_to_its_triples_slot():
    got = padded_dispatch(X, IDS, 2, capacity=6)
    back = returned([g.rows for g in got], [g.triples for g in got],
                    [g.running for g in got], BS=2, K=2)
    for s in range(2):
        for t in range(2):
            for k in range(2):
                assert back[s, t, k].tolist() == X[s][t].tolist()  # every pair was routed


def test_combine_reads_back_the_three_padded_outputs_under_its_own_names():
    out = padded_specs(const(np.float32), ("rows_out", "ids_out", "count_out"), "M")
    back = padded_specs(const(np.float32), ("rows_in", "ids_in", "count_in"), "M")
    scales = TensorSpec("expert_scales", const(np.float32), lambda t, r: (t.BS, t.K), "")

    class Dispatch(Kernel):
        name, outputs = "dispatch", out

    class Combine(Kernel):
        name, inputs = "combine", (*back, scales)

    chain = padded_chain(Dispatch(), Combine())
    assert dict(chain.links) == {"rows_in": "rows_out", "ids_in": "ids_out",
                                 "count_in": "count_out"}
    assert chain.counts == "count_out" and chain.rows == ("rows_out", "ids_out")
