"""What dispatch and combine compute, in plain numpy: the golden the simulated kernels must match.

Independent of the simulator: no window, cores, records or timing, only the semantics of the
CANN sample's golden script (gen_data.py) generalised to the quant modes npusim supports.
The element maths (MXFP8, INT8) comes from :mod:`npusim.kernels.quant`, which is verified on
its own against hand-computed values and a re-derivation of the golden's algorithm.

Row order of a rank's dispatch output: by local expert, then source rank, then the source's
flat index token * K + k. Ids outside [0, E) are dropped (the kernels neither count nor send
them); combine skips them too.

Shared experts (ops-transformer MoeDistributeDispatchV2 / CombineV2,
docs/kernels/cann_sample.md): with
S shared experts on the first S_r ranks (R = S_r / S replicas each), MoE expert e lives on
rank S_r + e // L, and every token t of every rank r also goes to shared expert j on rank
(r mod R) + j R, as the row (r, t, K + j). A shared rank's rows are ordered by source rank,
then token; its counts are per source rank. Combine adds the S shared rows with weight 1
after the K weighted MoE rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.kernels.quant import (
    int8_block_round_trip,
    int8_token_dequantize,
    int8_token_quantize,
    mxfp8_dequantize,
    mxfp8_quantize,
    mxfp8_scale_count,
    token_dtype,
)
from npusim.units import ceil_div
from npusim.workload.shape import MoeShape

DISPATCH_QUANTS = ("none", "int8", "mxfp8")
COMBINE_QUANTS = ("none", "int8")
TOKEN_NUMS_TYPES = ("count", "cumsum")


@dataclass
class RecvPlan:
    """Rows one rank receives in dispatch, already in output order."""

    src: np.ndarray  # int64 (n,) source rank
    token: np.ndarray  # int64 (n,)
    k: np.ndarray  # int64 (n,): top-k index, or K + j for shared expert j
    local_expert: np.ndarray  # int64 (n,)
    counts: np.ndarray  # int64 (L*W,) indexed local_expert * W + src_rank; (W,) on a shared rank

    @property
    def n(self) -> int:
        return int(self.src.size)


def check_shared(W: int, S: int, S_r: int) -> int:
    """R = S_r / S ranks per shared expert (0 without shared experts); ValueError if the
    V2 rules do not hold: S in 0..4, S_r in 0..W-1, both zero or both not, S_r % S == 0."""
    if not 0 <= S <= 4 or not 0 <= S_r < W or (S == 0) != (S_r == 0) or (S and S_r % S):
        raise ValueError(
            f"shared experts S={S} on S_r={S_r} of W={W} ranks: need S in 0..4, "
            "S_r in 0..W-1, both zero or both nonzero, S_r % S == 0"
        )
    return S_r // S if S else 0


def dispatch_plan(
    expert_ids_per_rank: list[np.ndarray], L: int, S: int = 0, S_r: int = 0
) -> list[RecvPlan]:
    """Who receives which (src, token, k), in output order; needs only the routing.

    ``S`` shared experts live on ranks 0..S_r-1; the MoE experts E = L * (W - S_r) on
    ranks S_r.. (expert e on rank S_r + e // L)."""
    W = len(expert_ids_per_rank)
    if W < 1 or L < 1:
        raise ValueError(f"need at least one rank and L >= 1 (W={W}, L={L})")
    R = check_shared(W, S, S_r)
    E = (W - S_r) * L
    K = np.asarray(expert_ids_per_rank[0]).shape[1]
    BS = np.asarray(expert_ids_per_rank[0]).shape[0]
    srcs, flats, experts = [], [], []
    for s, ids in enumerate(expert_ids_per_rank):
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] != K:
            raise ValueError(f"expert_ids of rank {s} has shape {ids.shape}, expected [BS, {K}]")
        if S and ids.shape[0] != BS:
            raise ValueError(f"expert_ids of rank {s} has {ids.shape[0]} tokens, expected {BS}")
        f = ids.reshape(-1).astype(np.int64)
        idx = np.nonzero((f >= 0) & (f < E))[0]
        srcs.append(np.full(idx.size, s, dtype=np.int64))
        flats.append(idx)
        experts.append(f[idx])
    src, flat, exp = np.concatenate(srcs), np.concatenate(flats), np.concatenate(experts)
    dst, le = S_r + exp // L, exp % L
    plans = []
    for r in range(S_r):  # shared rank r: replica r % R of shared expert r // R
        senders = np.array([s for s in range(W) if s % R == r % R], dtype=np.int64)
        s_r = np.repeat(senders, BS)
        t_r = np.tile(np.arange(BS, dtype=np.int64), senders.size)
        counts = np.zeros(W, dtype=np.int64)
        counts[senders] = BS
        plans.append(
            RecvPlan(
                s_r,
                t_r,
                np.full(s_r.size, K + r // R, dtype=np.int64),
                np.zeros(s_r.size, dtype=np.int64),
                counts,
            )
        )
    for r in range(S_r, W):
        m = dst == r
        s_r, f_r, le_r = src[m], flat[m], le[m]
        order = np.lexsort((f_r, s_r, le_r))
        s_r, f_r, le_r = s_r[order], f_r[order], le_r[order]
        counts = np.bincount(le_r * W + s_r, minlength=L * W).astype(np.int64)
        plans.append(RecvPlan(s_r, f_r // K, f_r % K, le_r, counts))
    return plans


def max_rows(W: int, BS: int, K: int, L: int, S: int = 0, S_r: int = 0) -> list[int]:
    """Every rank's output rows A: BS * W * min(K, L) on a MoE rank, BS * ceil(W / R) on a
    shared rank (the most it can receive)."""
    R = check_shared(W, S, S_r)
    return [BS * ceil_div(W, R) if r < S_r else BS * W * min(K, L) for r in range(W)]


def reference_dispatch(
    x_per_rank: list[np.ndarray],
    expert_ids_per_rank: list[np.ndarray],
    L: int,
    quant: str = "mxfp8",
    expert_token_nums_type: str = "count",
    saturate: bool = False,
    shared_experts: int = 0,
    shared_expert_ranks: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Every rank's dispatch outputs, full-size buffers as the kernel writes them.

    expand_x [A, H]: uint8 e5m2 bytes (mxfp8), int8 (int8) or the token dtype (none);
    dynamic_scales: [A, Align2(ceil(H/32))] uint8 E8M0 (mxfp8), [A] fp32 (int8), and for
    "none" an empty [A, 0] fp32 array (the op has no scales; nothing is written to a case);
    assist_info_for_combine [A, 3] int32 (src_rank, token, k); expert_token_nums [L] int64
    (counts, or their inclusive cumsum); ep_recv_count [W*L] int32 inclusive cumsum over
    local_expert * W + src_rank. Rows at and beyond ep_recv_count[-1] are zero.
    A = BS * W * min(K, L).

    A shared rank (rank < ``shared_expert_ranks``) outputs A = BS * ceil(W / R) rows ordered
    by (source rank, token) with assist info (src, token, K + j), expert_token_nums [1]
    (the total, the same for count and cumsum) and ep_recv_count [W], the inclusive cumsum
    of the rows per source rank.
    """
    if quant not in DISPATCH_QUANTS:
        raise ValueError(f"dispatch quant {quant!r} not one of {DISPATCH_QUANTS}")
    if expert_token_nums_type not in TOKEN_NUMS_TYPES:
        raise ValueError(
            f"expert_token_nums_type {expert_token_nums_type!r} not in {TOKEN_NUMS_TYPES}"
        )
    W = len(x_per_rank)
    if len(expert_ids_per_rank) != W:
        raise ValueError(f"{W} x arrays but {len(expert_ids_per_rank)} expert_ids arrays")
    BS, H = np.asarray(x_per_rank[0]).shape
    K = np.asarray(expert_ids_per_rank[0]).shape[1]
    S, S_r = shared_experts, shared_expert_ranks
    rows_of = max_rows(W, BS, K, L, S, S_r)
    xs = [np.asarray(x) for x in x_per_rank]
    if any(x.shape != (BS, H) or x.dtype != xs[0].dtype for x in xs):
        raise ValueError("every rank's x must be [BS, H] with the same BS, H and dtype")
    dt = xs[0].dtype

    # quantise each source token once (every copy of a token carries the same bytes)
    if quant == "mxfp8":
        qs = [mxfp8_quantize(x, saturate=saturate) for x in xs]
        x_out_dtype, s_dtype = np.uint8, np.uint8
    elif quant == "int8":
        qs = [int8_token_quantize(x) for x in xs]
        x_out_dtype, s_dtype = np.int8, np.float32
    else:
        qs = [(x, None) for x in xs]
        x_out_dtype, s_dtype = dt, np.float32

    outs = []
    for r, plan in enumerate(dispatch_plan(expert_ids_per_rank, L, S, S_r)):
        A = rows_of[r]
        s_shape = {"mxfp8": (A, mxfp8_scale_count(H)), "int8": (A,), "none": (A, 0)}[quant]
        n = plan.n
        if n > A:
            raise ValueError(f"a rank receives {n} rows > A={A} (duplicate expert ids in a token?)")
        expand_x = np.zeros((A, H), dtype=x_out_dtype)
        scales = np.zeros(s_shape, dtype=s_dtype)
        for src, (q, sc) in enumerate(qs):
            sel = np.nonzero(plan.src == src)[0]
            expand_x[sel] = q[plan.token[sel]]
            if sc is not None:
                scales[sel] = sc[plan.token[sel]]
        assist = np.zeros((A, 3), dtype=np.int32)
        assist[:n] = np.stack([plan.src, plan.token, plan.k], axis=1)
        n_local = 1 if r < S_r else L  # a shared rank holds one expert
        per_expert = plan.counts.reshape(n_local, W).sum(axis=1).astype(np.int64)
        if expert_token_nums_type == "cumsum":
            per_expert = np.cumsum(per_expert).astype(np.int64)
        outs.append(
            {
                "expand_x": expand_x,
                "dynamic_scales": scales,
                "assist_info_for_combine": assist,
                "expert_token_nums": per_expert,
                "ep_recv_count": np.cumsum(plan.counts).astype(np.int32),
            }
        )
    return outs


def expert_outputs_from_dispatch(
    dispatch_out: dict[str, np.ndarray], quant: str, H: int, dtype: str | np.dtype
) -> np.ndarray:
    """Identity experts: each received row dequantised to the token dtype ([A, H]).

    This is what chains dispatch -> combine in tests and in 'dispatch+combine' runs when no
    expert model is given. Rows at and beyond the received count stay zero.
    """
    dt = token_dtype(dtype)
    ex = dispatch_out["expand_x"]
    n = int(dispatch_out["ep_recv_count"][-1]) if dispatch_out["ep_recv_count"].size else 0
    out = np.zeros((ex.shape[0], H), dtype=dt)
    if n == 0:
        return out
    if quant == "mxfp8":
        out[:n] = mxfp8_dequantize(ex[:n], dispatch_out["dynamic_scales"][:n], out_dtype=dt)
    elif quant == "int8":
        out[:n] = int8_token_dequantize(ex[:n], dispatch_out["dynamic_scales"][:n], out_dtype=dt)
    elif quant == "none":
        out[:n] = ex[:n].astype(dt)
    else:
        raise ValueError(f"dispatch quant {quant!r} not one of {DISPATCH_QUANTS}")
    return out


def reference_combine(
    expand_x_per_rank: list[np.ndarray],
    assist_info_per_rank: list[np.ndarray],
    ep_recv_count_per_rank: list[np.ndarray],
    expert_ids_per_rank: list[np.ndarray],
    expert_scales_per_rank: list[np.ndarray],
    shape: MoeShape,
    quant: str = "int8",
    recip: bool = False,
    compact_weights: bool = False,
) -> list[np.ndarray]:
    """Every rank's combine output x [BS, H] in the token dtype.

    Row i < ep_recv_count[-1] of an expert rank goes back to (src_rank, token, k) from its
    assist info; with quant="int8" it first makes the INT8 block round trip (scale stored in
    the token dtype, as the sample's kernel and golden do; ``recip`` picks the kernel's
    multiply by fp32(1/127) instead of the golden's division, bit-identical for fp16).
    Then x[t] = (((0 + p_0) + p_1) + ... ) over k = 0..K-1 in fp32 with
    p_k = fp32(row(t, k)) * w[t, k] (product rounded, no FMA), skipping ids outside [0, E);
    the sum starts from +0.0 like the kernel's Duplicate(0) and torch's sum (the golden's
    torch sum is this sequential order for K <= 16). Cast to the token dtype RNE.

    ``compact_weights`` reproduces the sample kernel's weight indexing, which advances the
    weight index only past valid experts (w[t, j] for the j-th valid id). Identical unless a
    token has an id outside [0, E) before its last slot.

    With S = ``shared_experts`` > 0 (on ranks 0..S_r-1, E = L * (W - S_r)) a token has
    K + S slots; the row of shared expert j (assist k = K + j) is added with weight 1 after
    the K weighted rows: x[t] = ((... + p_{K-1}) + fp32(sh_0)) + ... + fp32(sh_{S-1}).
    """
    if quant not in COMBINE_QUANTS:
        raise ValueError(f"combine quant {quant!r} not one of {COMBINE_QUANTS}")
    if len(expand_x_per_rank) != shape.W:
        raise ValueError(f"{len(expand_x_per_rank)} ranks of expand_x for W={shape.W}")
    slots, filled = _return_rows(
        expand_x_per_rank, assist_info_per_rank, ep_recv_count_per_rank, shape, quant, recip
    )
    return [
        _weighted_sum(
            slots[s],
            filled[s],
            expert_ids_per_rank[s],
            expert_scales_per_rank[s],
            s,
            shape,
            compact_weights,
        )
        for s in range(shape.W)
    ]


def _return_rows(
    expand_x_per_rank: list[np.ndarray],
    assist_info_per_rank: list[np.ndarray],
    ep_recv_count_per_rank: list[np.ndarray],
    shape: MoeShape,
    quant: str,
    recip: bool,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every expert rank's received rows (after the INT8 round trip) back to their source
    rank's (token, k) slot: per rank the [BS * (K + S), H] slots and which were filled."""
    dt = shape.np_dtype
    W, BS, H, KS = shape.W, shape.BS, shape.H, shape.K + shape.S
    slots = [np.zeros((BS * KS, H), dtype=dt) for _ in range(W)]
    filled = [np.zeros(BS * KS, dtype=bool) for _ in range(W)]
    for r in range(W):
        recv = np.asarray(ep_recv_count_per_rank[r])
        n = int(recv[-1]) if recv.size else 0
        if n == 0:
            continue
        ex = np.asarray(expand_x_per_rank[r])
        if ex.dtype != dt:
            raise ValueError(f"rank {r} expand_x has dtype {ex.dtype}, expected {dt}")
        if ex.shape[0] < n or ex.shape[1] < H:
            raise ValueError(f"rank {r} expand_x {ex.shape} has fewer than {n} rows of H={H}")
        rows = ex[:n, :H]
        if quant == "int8":
            rows = int8_block_round_trip(rows, recip=recip, scale_dtype=dt)
        info = np.asarray(assist_info_per_rank[r])[:n].astype(np.int64)
        src, tok, kk = info[:, 0], info[:, 1], info[:, 2]
        bad = (src < 0) | (src >= W) | (tok < 0) | (tok >= BS) | (kk < 0) | (kk >= KS)
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            raise ValueError(f"rank {r} assist info row {i} = {info[i].tolist()} out of range")
        for s in np.unique(src):
            m = src == s
            slot_idx = tok[m] * KS + kk[m]
            if filled[s][slot_idx].any() or np.unique(slot_idx).size != slot_idx.size:
                raise ValueError(f"two rows of expert ranks address the same slot of rank {s}")
            slots[s][slot_idx] = rows[m]
            filled[s][slot_idx] = True
    return slots, filled


def _weighted_sum(
    slots: np.ndarray,
    filled: np.ndarray,
    expert_ids: np.ndarray,
    expert_scales: np.ndarray,
    s: int,
    shape: MoeShape,
    compact_weights: bool,
) -> np.ndarray:
    """Rank s's x: per token the fp32 sum of its valid rows times their weights, then its
    shared experts' rows, cast to the token dtype."""
    BS, H, K, S, E = shape.BS, shape.H, shape.K, shape.S, shape.E
    KS = K + S
    ids = np.asarray(expert_ids).astype(np.int64)
    w = np.asarray(expert_scales, dtype=np.float32)
    valid = (ids >= 0) & (ids < E)
    if compact_weights:
        widx = np.cumsum(valid, axis=1) - 1
        w = np.take_along_axis(w, np.clip(widx, 0, K - 1), axis=1)
    got = filled.reshape(BS, KS)
    missing = valid & ~got[:, :K]
    if missing.any():
        t, k = (int(v[0]) for v in np.nonzero(missing))
        raise ValueError(f"rank {s} token {t} k {k} (expert {ids[t, k]}) received no row")
    if not got[:, K:].all():
        t, j = (int(v[0]) for v in np.nonzero(~got[:, K:]))
        raise ValueError(f"rank {s} token {t} received no row from shared expert {j}")
    acc = np.zeros((BS, H), dtype=np.float32)
    sl = slots.reshape(BS, KS, H)
    for k in range(K):
        m = valid[:, k]
        if m.any():
            acc[m] = acc[m] + sl[m, k, :].astype(np.float32) * w[m, k][:, None]
    for j in range(S):  # shared experts: weight 1, no multiply
        acc = acc + sl[:, K + j, :].astype(np.float32)
    return acc.astype(shape.np_dtype)
