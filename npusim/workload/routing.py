"""Which experts each token goes to (expert_ids per rank).

``balanced`` is the CANN sample's deterministic round robin, reproduced exactly. ``uniform``,
``zipf`` and ``lognormal`` are seeded numpy (PCG64) draws: the sample seeds torch, whose
random stream numpy cannot reproduce, so only the *structure* of random cases matches the
sample, never the values. (Routing read from a file is :mod:`npusim.workload.routing_file`.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROUTING_KINDS = ("balanced", "uniform", "zipf", "lognormal")
LOGNORMAL_SIGMA = 1.0
ZIPF_DEFAULT_S = 1.2


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
    W: int, BS: int, K: int, E: int, rng: np.random.Generator, s: float = ZIPF_DEFAULT_S,
    hot_expert: int = 0
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


def lognormal_routing(
    W: int, BS: int, K: int, E: int, rng: np.random.Generator, sigma: float = LOGNORMAL_SIGMA
) -> list[np.ndarray]:
    """Log-normal expert popularity: w_e = exp(sigma * z_e), z_e ~ N(0, 1), one draw of E
    values shared by all ranks; then every token picks K distinct experts, each next one
    with probability w_e / (sum of w over the experts it has not picked yet).

    A token's first pick is exactly proportional to w, so the experts' loads are log-normal
    with log-variance sigma^2 (plus counting noise) as long as K * max(w) / sum(w) is small;
    a token cannot pick an expert twice, which caps the hottest ones.
    """
    _check(W, BS, K, E, distinct=True)
    if not sigma > 0:
        raise ValueError(f"lognormal sigma must be > 0, got {sigma}")
    logw = sigma * rng.standard_normal(E)
    return [weighted_distinct(logw, BS, K, rng) for _ in range(W)]


def weighted_distinct(logw: np.ndarray, BS: int, K: int, rng: np.random.Generator
                      ) -> np.ndarray:
    """[BS, K] int32: per row K distinct ids in draw order, drawn without replacement with
    weights exp(logw) (Plackett-Luce), in O(BS * K) instead of Gumbel top-K's O(BS * E).

    Draws with replacement, keeping first appearances, are that draw exactly (a repeat is
    discarded, and the next new id is again proportional to the weights of those not yet
    drawn). The few rows without K distinct ids after 2K draws finish with a Gumbel top-K
    over the ids they lack: later draws are independent of earlier ones, so this is the
    same law. Exact up to float64 rounding of the cumulative weights.
    """
    E = logw.size
    w = np.exp(logw - logw.max())
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    cand = np.searchsorted(cdf, rng.random((BS, 2 * K)), side="right")
    order = np.argsort(cand, axis=1, kind="stable")
    in_order = np.take_along_axis(cand, order, axis=1)
    new = np.ones(cand.shape, dtype=bool)
    new[:, 1:] = in_order[:, 1:] != in_order[:, :-1]
    first = np.empty_like(new)
    np.put_along_axis(first, order, new, axis=1)  # first appearance, at its draw position
    keep = first & (np.cumsum(first, axis=1) <= K)
    have = keep.sum(axis=1)
    out = np.empty((BS, K), dtype=np.int32)
    full = have == K
    out[full] = cand[full][keep[full]].reshape(-1, K)
    lack = np.flatnonzero(~full)  # rare unless a few experts take nearly all the weight
    if lack.size:
        got, cand = keep[lack], cand[lack]
        r, c = np.nonzero(got)
        part = np.empty((lack.size, K), dtype=np.int32)
        part[r, np.cumsum(got, axis=1)[r, c] - 1] = cand[r, c]
        keys = logw[None, :] + rng.gumbel(size=(lack.size, E))
        keys[r, cand[r, c]] = -np.inf  # drawn already
        rest = np.arange(K)[None, :] - have[lack, None]  # column j takes the (j - have)-th
        top = np.take_along_axis(_top_k(keys, K), np.maximum(rest, 0), axis=1)
        part[rest >= 0] = top[rest >= 0]
        out[lack] = part
    return out


def make_routing(
    kind: str,
    W: int,
    BS: int,
    K: int,
    E: int,
    rng: np.random.Generator | None = None,
    zipf_s: float = ZIPF_DEFAULT_S,
    hot_expert: int = 0,
    sigma: float = LOGNORMAL_SIGMA,
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
    if kind == "lognormal":
        return lognormal_routing(W, BS, K, E, rng, sigma=sigma)
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


@dataclass(frozen=True)
class Routing(Mapping[str, Any]):
    """How expert ids are drawn (or read); seed also seeds the generated token data.

    What a family's make_inputs receives. Read as a mapping it is the keywords of
    :func:`npusim.workload.inputs.generate_inputs` (routing, seed, zipf_s, and sigma or
    the file's expert_ids), so ``generate_inputs(shape, **routing)`` draws the run's inputs."""

    kind: str = "balanced"
    seed: int = 0
    s: float | None = None  # zipf exponent; only for kind == "zipf"
    sigma: float | None = None  # log-normal sigma; only for kind == "lognormal"
    path: str | None = None  # kind == "file": the .npy as the scenario names it
    sha256: str | None = None  # ... and the digest of the bytes its ids came from
    ids: np.ndarray | None = field(default=None, compare=False, repr=False)  # [W, BS, K]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "seed": self.seed}
        for name in ("s", "sigma", "path", "sha256"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def file_ids(self) -> list[np.ndarray] | None:
        """The checked per-rank ids of kind file ([BS, K] each), else None."""
        return None if self.ids is None else [np.ascontiguousarray(a) for a in self.ids]

    @property
    def zipf_s(self) -> float:
        return self.s if self.s is not None else ZIPF_DEFAULT_S

    def draw_args(self) -> dict[str, Any]:
        """The keywords past kind and zipf_s: sigma (lognormal), or the file's ids."""
        if self.kind == "lognormal":
            return {"sigma": self.sigma}
        return {"expert_ids": self.file_ids()} if self.kind == "file" else {}

    def expert_ids(self, W: int, BS: int, K: int, E: int, rng: np.random.Generator
                   ) -> list[np.ndarray]:
        """Per rank [BS, K] int32: the file's ids, else :func:`make_routing`'s draw."""
        ids = self.file_ids()
        if ids is not None:
            return ids
        extra = {"sigma": self.sigma} if self.kind == "lognormal" else {}
        return make_routing(self.kind, W, BS, K, E, rng=rng, zipf_s=self.zipf_s, **extra)

    # ---- the generate_inputs keywords, as a read-only mapping
    def _kwargs(self) -> dict[str, Any]:
        return {"routing": self.kind, "seed": self.seed, "zipf_s": self.zipf_s,
                **self.draw_args()}

    def __getitem__(self, key: str) -> Any:
        return self._kwargs()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kwargs())

    def __len__(self) -> int:
        return len(self._kwargs())
