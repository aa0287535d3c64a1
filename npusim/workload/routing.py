"""Which experts each token goes to (expert_ids per rank).

``balanced`` is the CANN sample's deterministic round robin, reproduced exactly. ``uniform``
and ``zipf`` are seeded numpy (PCG64) draws: the sample seeds torch, whose random stream
numpy cannot reproduce, so only the *structure* of random cases matches the sample, never
the values.
"""

from __future__ import annotations

import numpy as np

ROUTING_KINDS = ("balanced", "uniform", "zipf")


def balanced_routing(W: int, BS: int, K: int, E: int) -> list[np.ndarray]:
    """The sample's ids: flat list (0..E-1), (1..E), (2..E+1), ... each mod E, cut to BS*K*W,
    viewed as [W*BS, K] and split into W chunks of [BS, K] (gen_dst_expert_indices_per_chip).

    The K ids of a token are distinct whenever K <= E.
    """
    _check(W, BS, K, E)
    n = BS * K * W
    rounds = n // E + 1
    flat = (np.arange(E, dtype=np.int64)[None, :] + np.arange(rounds)[:, None]) % E
    flat = flat.reshape(-1)[:n].astype(np.int32)
    return [np.ascontiguousarray(c) for c in np.split(flat.reshape(W * BS, K), W)]


def uniform_routing(W: int, BS: int, K: int, E: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every token picks K distinct experts uniformly (a random top-K of iid keys)."""
    _check(W, BS, K, E, distinct=True)
    return [_top_k(rng.random((BS, E)), K) for _ in range(W)]


def zipf_routing(
    W: int, BS: int, K: int, E: int, rng: np.random.Generator, s: float = 1.2, hot_expert: int = 0
) -> list[np.ndarray]:
    """K distinct experts per token drawn without replacement with p(e) ~ 1 / rank(e)^s.

    rank(hot_expert) = 1, then (hot_expert + 1) % E gets rank 2, and so on: one hot expert
    whose rank (hence load) concentrates on one destination rank. Sampling without
    replacement uses Gumbel top-K (Plackett-Luce), which is exact and vectorised.
    """
    _check(W, BS, K, E, distinct=True)
    if s < 0:
        raise ValueError(f"zipf exponent s must be >= 0, got {s}")
    ranks = (np.arange(E) - hot_expert) % E + 1
    logp = -s * np.log(ranks.astype(np.float64))
    return [_top_k(logp[None, :] + rng.gumbel(size=(BS, E)), K) for _ in range(W)]


def make_routing(
    kind: str,
    W: int,
    BS: int,
    K: int,
    E: int,
    rng: np.random.Generator | None = None,
    zipf_s: float = 1.2,
    hot_expert: int = 0,
) -> list[np.ndarray]:
    """expert_ids [BS, K] int32 for each of the W ranks."""
    if kind == "balanced":
        return balanced_routing(W, BS, K, E)
    if rng is None:
        raise ValueError(f"routing {kind!r} needs a numpy Generator")
    if kind == "uniform":
        return uniform_routing(W, BS, K, E, rng)
    if kind == "zipf":
        return zipf_routing(W, BS, K, E, rng, s=zipf_s, hot_expert=hot_expert)
    raise ValueError(f"routing kind {kind!r} not one of {ROUTING_KINDS}")


def _top_k(keys: np.ndarray, K: int) -> np.ndarray:
    """Indices of the K largest keys per row, largest first (the draw order)."""
    part = np.argpartition(-keys, K - 1, axis=1)[:, :K]
    order = np.argsort(-np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1).astype(np.int32)


def _check(W: int, BS: int, K: int, E: int, distinct: bool = False) -> None:
    if W < 1 or BS < 0 or K < 1 or E < 1:
        raise ValueError(f"need W >= 1, BS >= 0, K >= 1, E >= 1 (got W={W}, BS={BS}, K={K}, E={E})")
    if distinct and K > E:
        raise ValueError(f"cannot pick K={K} distinct experts out of E={E}")
