"""Routing kinds and generated run inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npusim.workload.inputs import generate_inputs, max_recv_rows, recv_counts
from npusim.workload.routing import balanced_routing, make_routing
from npusim.workload.shape import MoeShape


def test_balanced_matches_hand_list():
    # W=2, BS=3, K=2, E=4: rounds (0,1,2,3) (1,2,3,0) (2,3,0,1) ... cut to 12 ids
    ids = balanced_routing(2, 3, 2, 4)
    assert [a.dtype for a in ids] == [np.int32, np.int32]
    assert ids[0].tolist() == [[0, 1], [2, 3], [1, 2]]
    assert ids[1].tolist() == [[3, 0], [2, 3], [0, 1]]


def test_balanced_sample_default_case():
    # sample defaults: 2 chips, 8 experts, BS=8, K=8: every token sees all experts once
    ids = balanced_routing(2, 8, 8, 8)
    flat = np.concatenate(ids).reshape(-1)
    assert flat[:16].tolist() == list(range(8)) + list(range(1, 8)) + [0]
    for a in ids:
        assert all(len(set(row)) == 8 for row in a.tolist())


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_random_routing_distinct_and_deterministic(kind):
    a = make_routing(kind, 4, 64, 6, 16, rng=np.random.default_rng(7))
    b = make_routing(kind, 4, 64, 6, 16, rng=np.random.default_rng(7))
    c = make_routing(kind, 4, 64, 6, 16, rng=np.random.default_rng(8))
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    for ids in a:
        assert ids.shape == (64, 6) and ids.dtype == np.int32
        assert ids.min() >= 0 and ids.max() < 16
        assert all(len(set(r)) == 6 for r in ids.tolist())


def test_zipf_has_one_hot_expert():
    ids = make_routing("zipf", 2, 2000, 2, 32, rng=np.random.default_rng(0), hot_expert=5)
    counts = np.bincount(np.concatenate(ids).reshape(-1), minlength=32)
    assert counts.argmax() == 5
    assert counts[5] > 3 * np.median(counts)
    flat = make_routing("uniform", 2, 2000, 2, 32, rng=np.random.default_rng(0))
    u = np.bincount(np.concatenate(flat).reshape(-1), minlength=32)
    assert u.max() < 1.5 * u.mean()


def test_routing_errors():
    with pytest.raises(ValueError, match="distinct"):
        make_routing("uniform", 1, 4, 5, 4, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="not one of"):
        make_routing("hash", 1, 4, 2, 4, rng=np.random.default_rng(0))


def _shape(dtype: str) -> MoeShape:
    return MoeShape(W=4, BS=5, H=96, K=3, L=2, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_generate_inputs(dtype):
    inp = generate_inputs(_shape(dtype), routing="uniform", seed=11)
    again = generate_inputs(_shape(dtype), routing="uniform", seed=11)
    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    A = max_recv_rows(4, 5, 3, 2)
    assert A == 5 * 4 * 2 == inp.A
    assert inp.recv_counts == recv_counts(inp.expert_ids, 2) and sum(inp.recv_counts) == 4 * 5 * 3
    for r in range(4):
        assert inp.x[r].shape == (5, 96) and inp.x[r].dtype == dt
        xf = inp.x[r].astype(np.float32)
        assert np.abs(xf).max() <= 10 and np.abs(xf).max() > 5
        assert inp.expert_scales[r].dtype == np.float32 and np.abs(inp.expert_scales[r]).max() <= 1
        ex = inp.expand_x[r]
        n = inp.recv_counts[r]
        assert ex.shape == (A, 96) and ex.dtype == dt
        assert not ex[n:].astype(np.float32).any() and ex[:n].astype(np.float32).all(axis=1).any()
        assert np.array_equal(inp.x[r], again.x[r])
        assert np.array_equal(inp.expand_x[r], again.expand_x[r])
    # the routing stream is separate: a different kind keeps x and the scales
    bal = generate_inputs(_shape(dtype), routing="balanced", seed=11)
    assert np.array_equal(bal.x[0], inp.x[0])
    assert np.array_equal(bal.expert_scales[3], inp.expert_scales[3])
    assert set(bal.per_rank()[0]) == {"x", "expert_ids", "expert_scales", "expand_x"}
