"""The exchange template's receive order, checked on routings small enough to write out by
hand, and against a plain loop over (expert, source, token, k) on random ones."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.kernels.exchange import received


def test_two_ranks_one_expert_each_by_hand():
    # rank 0's tokens go to experts (1, 0), (0, 1); rank 1's to (1, 0), (1, 0)
    ids = [np.array([[1, 0], [0, 1]]), np.array([[1, 0], [1, 0]])]
    r0, r1 = received(ids, L=1)
    # rank 0 holds expert 0: from source 0 (token 0 k 1), (token 1 k 0); source 1 (0,1), (1,1)
    assert r0.triples().tolist() == [[0, 0, 1], [0, 1, 0], [1, 0, 1], [1, 1, 1]]
    assert r0.counts.tolist() == [[2, 2]]
    assert r0.running().tolist() == [2, 4]
    assert r1.triples().tolist() == [[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 0]]
    x = [np.array([[10.0], [11.0]]), np.array([[20.0], [21.0]])]
    assert r0.rows(x)[:, 0].tolist() == [10.0, 11.0, 20.0, 21.0]


def test_local_experts_come_before_sources_and_out_of_range_ids_go_nowhere():
    # W 2, L 2: rank 1 holds experts 2 and 3; -1 and 4 are sent nowhere
    ids = [np.array([[3, 2], [-1, 4]]), np.array([[2, 3]])]
    _, r1 = received(ids, L=2)
    # local expert 0 (id 2): source 0 token 0 k 1, source 1 token 0 k 0; then expert 3
    assert r1.triples().tolist() == [[0, 0, 1], [1, 0, 0], [0, 0, 0], [1, 0, 1]]
    assert r1.counts.tolist() == [[1, 1], [1, 1]]
    assert r1.per_expert().tolist() == [2, 2]


def test_shared_expert_ranks_receive_nothing_here_and_shift_the_moe_ranks():
    ids = [np.array([[0]]), np.array([[1]]), np.array([[0]])]  # S_r 1: experts on ranks 1, 2
    r0, r1, r2 = received(ids, L=1, S_r=1)
    assert (r0.n, r1.n, r2.n) == (0, 2, 1)
    assert r1.triples()[:, 0].tolist() == [0, 2]


@pytest.mark.parametrize("seed", range(4))
def test_the_order_is_a_loop_over_expert_source_token_k(seed):
    rng = np.random.default_rng(seed)
    W, L, K = 3, 2, 2
    ids = [np.stack([rng.choice(W * L, K, replace=False) for _ in range(int(bs))])
           for bs in rng.integers(1, 5, W)]
    got = received(ids, L)
    for d in range(W):
        want = [(s, t, k) for le in range(L) for s in range(W)
                for t in range(len(ids[s])) for k in range(K) if ids[s][t, k] == d * L + le]
        assert [tuple(row) for row in got[d].triples().tolist()] == want
        x = [rng.normal(size=(len(a), 4)) for a in ids]
        assert np.array_equal(got[d].rows(x), np.array([x[s][t] for s, t, _ in want])
                              .reshape(-1, 4))


def test_rows_into_a_given_array_and_none_received():
    # W 2, L 1: rank 1 gets token 1 of source 0 and token 0 of source 1; rank 0 nothing
    ids = [np.array([[-1], [1]]), np.array([[1]])]
    r0, r1 = received(ids, L=1)
    x = [np.array([[1, 2], [3, 4]], np.int16), np.array([[5, 6]], np.int16)]
    out = np.full((3, 2), -7, np.int32)
    assert r1.rows(x, out=out[:2]) is not None
    assert out.tolist() == [[3, 4], [5, 6], [-7, -7]]
    assert r0.rows(x).shape == (0, 2)
