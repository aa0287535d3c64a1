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
from typing import Any

import numpy as np

from npusim.kernels.exchange import Received, received
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
) -> list[Received]:
    """Who receives which (src, token, k), in output order; needs only the routing.

    ``S`` shared experts live on ranks 0..S_r-1; the MoE experts E = L * (W - S_r) on
    ranks S_r.. (expert e on rank S_r + e // L), received as `received` orders them."""
    W = len(expert_ids_per_rank)
    if W < 1 or L < 1:
        raise ValueError(f"need at least one rank and L >= 1 (W={W}, L={L})")
    R = check_shared(W, S, S_r)
    BS, K = np.asarray(expert_ids_per_rank[0]).shape
    for s, ids in enumerate(expert_ids_per_rank):
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] != K:
            raise ValueError(f"expert_ids of rank {s} has shape {ids.shape}, expected [BS, {K}]")
        if S and ids.shape[0] != BS:
            raise ValueError(f"expert_ids of rank {s} has {ids.shape[0]} tokens, expected {BS}")
    moe = received(expert_ids_per_rank, L, S_r)
    return [_shared_plan(r, R, W, BS, K) for r in range(S_r)] + moe[S_r:]


def _shared_plan(r: int, R: int, W: int, BS: int, K: int) -> Received:
    """Shared rank r holds replica r % R of shared expert r // R: every token of the
    sources s with s % R == r % R, by source then token, as the row (s, t, K + r // R);
    its counts are one entry per source rank."""
    senders = np.arange(r % R, W, R, dtype=np.int64)
    src = np.repeat(senders, BS)
    counts = np.zeros((1, W), dtype=np.int64)
    counts[0, senders] = BS
    return Received(src, np.tile(np.arange(BS, dtype=np.int64), senders.size),
                    np.full(src.size, K + r // R, dtype=np.int64), counts)


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
    quantised = _quantise(xs, quant, saturate)
    cumsum = expert_token_nums_type == "cumsum"
    return [_rank_outputs(plan, rows_of[r], quantised, cumsum)
            for r, plan in enumerate(dispatch_plan(expert_ids_per_rank, L, S, S_r))]


@dataclass(frozen=True)
class _Quantised:
    """Every source's tokens quantised once (each copy of a token carries the same bytes)."""

    rows: list[np.ndarray]  # per source [BS, H]
    rows_dtype: Any  # expand_x's: uint8 e5m2 bytes, int8 or the token dtype
    scales: list[np.ndarray] | None  # per source its rows' scales (None: "none")
    scales_shape: tuple[int, ...]  # a scales row's shape ((H/32 aligned,), (), (0,))
    scales_dtype: Any


def _quantise(xs: list[np.ndarray], quant: str, saturate: bool) -> _Quantised:
    """The per-token quantisation before the send: MXFP8 E5M2 blocks, INT8 or none."""
    H = xs[0].shape[1]
    if quant == "mxfp8":
        q, s = zip(*(mxfp8_quantize(x, saturate=saturate) for x in xs), strict=True)
        return _Quantised(list(q), np.uint8, list(s), (mxfp8_scale_count(H),), np.uint8)
    if quant == "int8":
        q, s = zip(*(int8_token_quantize(x) for x in xs), strict=True)
        return _Quantised(list(q), np.int8, list(s), (), np.float32)
    return _Quantised(xs, xs[0].dtype, None, (0,), np.float32)


def _rank_outputs(plan: Received, A: int, q: _Quantised, cumsum: bool
                  ) -> dict[str, np.ndarray]:
    """One rank's full-size outputs from what it receives: the rows (and their scales)
    in receive order, zero beyond the count."""
    n = plan.n
    if n > A:
        raise ValueError(f"a rank receives {n} rows > A={A} (duplicate expert ids in a token?)")
    expand_x = np.zeros((A, q.rows[0].shape[1]), dtype=q.rows_dtype)
    plan.rows(q.rows, out=expand_x[:n])
    scales = np.zeros((A, *q.scales_shape), dtype=q.scales_dtype)
    if q.scales is not None:
        plan.rows(q.scales, out=scales[:n])
    assist = np.zeros((A, 3), dtype=np.int32)
    assist[:n] = plan.triples()
    per_expert = plan.per_expert()
    return {"expand_x": expand_x, "dynamic_scales": scales, "assist_info_for_combine": assist,
            "expert_token_nums": np.cumsum(per_expert).astype(np.int64) if cumsum
            else per_expert,
            "ep_recv_count": plan.running()}


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
