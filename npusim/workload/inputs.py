"""Input tensors of one dispatch/combine run, generated like the CANN sample's gen_data.py.

Per rank: x [BS, H] ~ U(-10, 10) in the token dtype, expert_ids [BS, K] int32 (see routing),
expert_scales [BS, K] ~ U(-1, 1) fp32, and the standalone combine input expand_x [A, H]
(A = BS * W * min(K, L)) whose first n rows (n = rows this rank receives in dispatch) are
~ U(-10, 10) and the rest zero, as the sample pads it.

With shared experts (S on the first S_r ranks) the routing names only the E = L * (W - S_r)
MoE experts, and a shared rank's expand_x has A = BS * ceil(W / R) rows (R = S_r / S) of
which BS * (number of ranks sending to it) are filled.

Determinism: one ``numpy.random.SeedSequence(seed)`` is split into independent streams for
x, routing, expert_scales and expand_x, so e.g. changing the routing kind does not change x.
Given ``expert_ids`` (routing read from a file) replace the drawn ones; the seed still draws
the token data, the same as for any other kind.
Values differ from the sample's (torch) for the same seed; the structure is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npusim.workload.routing import LOGNORMAL_SIGMA, ZIPF_DEFAULT_S, make_routing
from npusim.workload.shape import MoeShape

BOUND = 10.0


@dataclass
class RunInputs:
    """Inputs for W ranks; lists are indexed by rank."""

    shape: MoeShape
    x: list[np.ndarray]
    expert_ids: list[np.ndarray]
    expert_scales: list[np.ndarray]
    expand_x: list[np.ndarray] = field(default_factory=list)
    recv_counts: list[int] = field(default_factory=list)

    @property
    def A(self) -> int:
        """Rows of a MoE rank's expand_x (see rows_of for every rank)."""
        return self.shape.A

    def rows_of(self, rank: int) -> int:
        """Rows of this rank's expand_x: A on a MoE rank, BS * ceil(W / R) on a shared one."""
        return self.shape.rows_of(rank)

    def per_rank(self) -> list[dict[str, np.ndarray]]:
        """One dict per rank with the sample's input names."""
        out = []
        for r in range(self.shape.W):
            d = {
                "x": self.x[r],
                "expert_ids": self.expert_ids[r],
                "expert_scales": self.expert_scales[r],
            }
            if self.expand_x:
                d["expand_x"] = self.expand_x[r]
            out.append(d)
        return out


def max_recv_rows(W: int, BS: int, K: int, L: int) -> int:
    """A = BS * W * min(K, L): the most rows one rank can receive (distinct ids per token)."""
    return BS * W * min(K, L)


def recv_counts(expert_ids: list[np.ndarray], L: int, S: int = 0, S_r: int = 0) -> list[int]:
    """Rows each rank receives in dispatch: ids e in [0, E) land on rank S_r + e // L; a
    shared rank d gets all BS tokens of every rank r with r mod R == d mod R."""
    W = len(expert_ids)
    E = (W - S_r) * L
    flat = np.concatenate([np.asarray(ids).reshape(-1) for ids in expert_ids])
    flat = flat[(flat >= 0) & (flat < E)]
    counts = np.bincount(S_r + flat // L, minlength=W).astype(int).tolist()
    if S_r:
        R = S_r // S
        bs = np.asarray(expert_ids[0]).shape[0]
        for d in range(S_r):
            counts[d] = bs * sum(1 for r in range(W) if r % R == d % R)
    return counts


def uniform_tokens(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """U(-10, 10): numpy float64 draws rounded (RNE) to fp32, then to the token dtype."""
    return rng.uniform(-BOUND, BOUND, size=shape).astype(np.float32).astype(dtype)


def generate_inputs(
    shape: MoeShape,
    routing: str = "balanced",
    seed: int = 0,
    zipf_s: float = ZIPF_DEFAULT_S,
    hot_expert: int = 0,
    with_combine: bool = True,
    payload: bool = True,
    sigma: float = LOGNORMAL_SIGMA,
    expert_ids: list[np.ndarray] | None = None,
) -> RunInputs:
    """Generate every rank's inputs for a run; see the module docstring for distributions."""
    W, BS, H, K, L = shape.W, shape.BS, shape.H, shape.K, shape.L
    if L < 1 or H < 1:
        raise ValueError(f"need L >= 1 and H >= 1 (got L={L}, H={H})")
    dt = shape.np_dtype
    s_x, s_route, s_scales, s_expand = (
        np.random.default_rng(c) for c in np.random.SeedSequence(seed).spawn(4)
    )
    # payload=False (timing-only runs): token values are zeros; routing and weights stay
    x = [uniform_tokens(s_x, (BS, H), dt) if payload else np.zeros((BS, H), dt)
         for _ in range(W)]
    ids = expert_ids if expert_ids is not None else make_routing(
        routing, W, BS, K, shape.E, rng=s_route, zipf_s=zipf_s, hot_expert=hot_expert,
        sigma=sigma)
    scales = [s_scales.uniform(-1.0, 1.0, size=(BS, K)).astype(np.float32) for _ in range(W)]
    inp = RunInputs(shape, x, ids, scales)
    if with_combine:
        inp.recv_counts = recv_counts(ids, L, shape.S, shape.S_r)
        for r, n in enumerate(inp.recv_counts):
            A = inp.rows_of(r)
            if n > A:
                raise ValueError(f"a rank receives {n} rows > A={A}: expert ids not distinct")
            ex = np.zeros((A, H), dtype=dt)
            if payload:
                ex[:n] = uniform_tokens(s_expand, (n, H), dt)
            inp.expand_x.append(ex)
    return inp
