"""What MoeDistributeDispatchV3 / CombineV3 compute, in plain numpy (family ``mc2``).

The golden of the ops-transformer family, written from the operators' documentation
(``mc2/moe_distribute_dispatch_v2/docs/aclnnMoeDistributeDispatchV4.md``, the CombineV4 page)
and the element maths of the V2 kernels they instantiate. No window, cores, slots or timing:
only which rows go where, in which order, with which numbers.

Ranks 0..S_r-1 hold the S shared experts (R = S_r / S replicas each), ranks S_r..W-1 the E MoE
experts, L = E / (W - S_r) each. Ids in [E, E + Z) are zero experts, then C copy experts, then
N const experts ("special" experts): dispatch never sends them; combine handles them alone.

Dispatch, per source rank r with BS_r tokens:
* active tokens: all; with a 1-D ``x_active_mask`` the first sum(mask) (the operator requires
  the trues first and counts them); with a 2-D mask (BS, K) pair (t, k) is active iff
  mask[t, k] and token t iff any pair of it is.
* pair (t, k) of an active token, mask true and id e < E, goes to rank S_r + e // L, local
  expert e % L, as the triplet (r, t, k); every active token also goes, for each shared
  expert j, to rank (r mod R) + j R as (r, t, K + j).
* a MoE rank's rows are ordered by local expert, then source rank, then the source's flat
  index t * K + k; a shared rank's by source rank, then token. ``ep_recv_count`` is the
  inclusive cumulative count over local_expert * W + src (over src on a shared rank);
  ``expert_token_nums`` (int64) holds counts per local expert (type 1, the default) or their
  cumulative sum (type 0).
* quantisation (``dispatch_quant``): ``none`` (rows as they are); ``static_int8``
  (quant_mode 1: q = int8 of rint(fp32(x) * scale), scale of shape (1,), (H,) or (E', H) with
  E' = S + E rows when S_r > 0, row S + e for MoE expert e and j for shared expert j; no
  scale output); ``int8`` (quant_mode 2, per token: optional smooth scales of shape (E', H)
  indexed the same way, d = 127 / max|x|, ``dynamic_scales`` = 1/d fp32); the 950's FP8
  modes (``quant_dtype`` e5m2 or e4m3; :func:`pergroup_row`, :func:`mx_row`): ``pergroup``
  (quant_mode 3: per 128 elements d = fp8max / max|x|, fp8(x * d), scales 1/d fp32, [A,
  ceil(H/128)]), ``mxfp8`` (4: per 32 elements the power of two 2^(floor(log2 max|x|) -
  emax), at least 2^-127, E8M0 scales [A, Align2(ceil(H/32))], elements saturated) and
  ``mxfp8_clip`` (5: the smallest power of two >= max(max|x|, 1e-4) / fp8max),
  ``mxfp4_e2m1`` (4 with an FP4 expand_x: OCP MXFP4, [A, ceil(H/2)] bytes of two codes,
  the first in the low nibble, E8M0 scales as mxfp8's; :func:`deepep_a5_row`) and, for
  DeepEP's 950 fork only, ``pertoken_fp8`` (e4m3, d = 448 / max|x| or 1 for a zero row,
  ``dynamic_scales`` = 1/d fp32).
* ``expand_scales`` (optional): the pair's expert_scales value per MoE row.

Combine, per rank r and active token t: fp32 sum in this order of
* each active MoE pair k (id < E): fp32(row) * expert_scales[t, k] (row INT8 block round
  tripped first with ``combine_quant: int8``; with ``mxfp8_e5m2`` / ``mxfp8_e4m3`` the
  950's MX round trip of :func:`mx_combine_row`);
* zero experts: nothing; copy experts: fp32(ori_x[t]) * scale; const expert c:
  (a1 * x + a2 * v[c]) * scale with x = fp32(ori_x[t]), (a1, a2) = softmax(<alpha1[c], x>,
  <alpha2[c], x>) (dot products summed in fp32 by :func:`fp32_dot`);
* the S shared rows with weight 1; then ``shared_expert_x[t]`` if given;
then cast round-to-nearest-even to the token dtype. Rows of tokens that are not active are
not written by the operator; here they are zero (npusim allocates outputs zeroed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npusim.formats import tables
from npusim.kernels.exchange import Received, received
from npusim.kernels.quant import (
    fp8_format,
    int8_block_round_trip,
    int8_token_quantize,
    token_dtype,
)
from npusim.kernels.quant.golden import (
    mx_combine_row,
    mx_row,
    mxfp4_row,
    pergroup_row,
    pertoken_row,
)
from npusim.units import ceil_div
from npusim.workload.shape import MoeShape

DISPATCH_QUANTS = ("none", "static_int8", "int8", "pergroup", "mxfp8", "mxfp8_clip",
                   "mxfp4_e2m1", "pertoken_fp8")
FP8_QUANTS = ("pergroup", "mxfp8", "mxfp8_clip")
COMBINE_QUANTS = ("none", "int8", "mxfp8_e5m2", "mxfp8_e4m3")


def mc2_shape(W: int, bs: tuple[int, ...], H: int, K: int, E: int, S: int = 0, S_r: int = 0,
              global_bs: int = 0, zero_experts: int = 0, copy_experts: int = 0,
              const_experts: int = 0, dtype: str = "bfloat16") -> MoeShape:
    """The shape of one MoeDistributeDispatchV3 / CombineV3 call from the attributes both
    operators take: BS per rank, E MoE experts (L = E / (W - S_r) per MoE rank)."""
    if len(bs) != W:
        raise ValueError(f"bs has {len(bs)} entries for W={W} ranks")
    if S_r >= W or E % (W - S_r):
        raise ValueError(f"E={E} MoE experts do not split over W - S_r = {W - S_r} ranks")
    return MoeShape(W, max(bs), H, K, E // (W - S_r), S, S_r, dtype, tuple(bs), global_bs,
                    zero_experts, copy_experts, const_experts)


@dataclass
class DispatchInputs:
    """One rank's dispatch inputs (the optional ones None when absent)."""

    x: np.ndarray  # (BS, H) token dtype
    expert_ids: np.ndarray  # (BS, K) int32
    expert_scales: np.ndarray | None = None  # (BS, K) fp32
    x_active_mask: np.ndarray | None = None  # (BS,) or (BS, K) bool
    scales: np.ndarray | None = None  # static: (1,), (H,), (E', H); int8: smooth (E', H)


@dataclass
class DispatchOutputs:
    """One rank's dispatch outputs; rows beyond ``n`` (= ep_recv_count's last entry) are 0."""

    expand_x: np.ndarray  # (A, H) token dtype or int8
    dynamic_scales: np.ndarray | None  # (A,) fp32, int8 mode only
    assist_info_for_combine: np.ndarray  # (A, 3) int32: (src rank, token, k)
    expert_token_nums: np.ndarray  # (L,) int64 (first entry only on a shared rank)
    ep_recv_count: np.ndarray  # (W * L,) int32 (first W on a shared rank)
    expand_scales: np.ndarray | None = None  # (A,) fp32 when expert_scales was given
    n: int = 0


@dataclass
class CombineInputs:
    """One rank's combine inputs beyond what its own dispatch returned."""

    expand_x: np.ndarray  # (A, H) token dtype: the expert outputs of this rank's rows
    expert_ids: np.ndarray  # (BS, K) int32 (the dispatch's)
    expert_scales: np.ndarray | None = None  # (BS, K) fp32
    x_active_mask: np.ndarray | None = None
    shared_expert_x: np.ndarray | None = None  # (BS, H)
    ori_x: np.ndarray | None = None  # (BS, H): copy / const experts
    const_alpha1: np.ndarray | None = None  # (N, H)
    const_alpha2: np.ndarray | None = None  # (N, H)
    const_v: np.ndarray | None = None  # (N, H)
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- routing


def active_pairs(shape: MoeShape, ids: np.ndarray, mask: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(active token indices in order, bool (BS, K) of pairs that travel to a MoE expert)."""
    bs = ids.shape[0]
    pair = np.ones(ids.shape, dtype=bool)
    if mask is None:
        tokens = np.arange(bs)
    elif mask.ndim == 1:
        n = int(np.count_nonzero(mask))
        tokens = np.arange(n)
        pair[n:] = False
    else:
        pair &= mask.astype(bool)
        tokens = np.flatnonzero(pair.any(axis=1))
    pair &= ids < shape.E
    return tokens, pair


def dispatch_rows(shape: MoeShape, ids_per_rank: list[np.ndarray],
                  masks: list[np.ndarray | None]) -> list[Received]:
    """Per destination rank what it receives, in output order: the active MoE pairs as
    `received` orders them (a pair that does not travel is sent nowhere, id -1), a
    shared rank's the active tokens of its sources."""
    sent, active = [], []
    for src, ids in enumerate(ids_per_rank):
        tokens, pair = active_pairs(shape, ids, masks[src])
        sent.append(np.where(pair, ids, -1))
        active.append(tokens)
    moe = received(sent, shape.L, shape.S_r)
    return [_shared_rows(shape, r, active) for r in range(shape.S_r)] + moe[shape.S_r:]


def _shared_rows(shape: MoeShape, rank: int, active: list[np.ndarray]) -> Received:
    """Shared rank `rank` holds replica rank % R of shared expert j = rank // R: the active
    tokens of the sources src with src % R == rank % R, by source then token, as rows
    (src, t, K + j); counts per source rank."""
    R, W = shape.R, shape.W
    senders = range(rank % R, W, R)
    src = np.concatenate([np.full(active[s].size, s, np.int64) for s in senders])
    token = np.concatenate([np.asarray(active[s], np.int64) for s in senders])
    counts = np.zeros((1, W), np.int64)
    for s in senders:
        counts[0, s] = active[s].size
    return Received(src, token, np.full(src.size, shape.K + rank // R, np.int64), counts)


# --------------------------------------------------------------------------- quantisation


def static_int8_quantize(x: np.ndarray, scale_row: np.ndarray) -> np.ndarray:
    """quant_mode 1: int8(rint(fp32(x) * scale)); scale a scalar (1,) or per channel (H,).

    The kernel casts fp32 -> int32 (RINT), -> fp16 (exact up to 2048), -> int8 (TRUNC of an
    integer); out-of-range values saturate to [-128, 127] (assumed: the conversion's
    saturation mode is not stated in the source)."""
    f = np.asarray(x).astype(np.float32) * np.asarray(scale_row, dtype=np.float32)
    return np.clip(np.rint(f), -128, 127).astype(np.int8)


def scale_row(shape: MoeShape, scales: np.ndarray, expert_index: int) -> np.ndarray:
    """The static / smooth scale used for one row: the whole (1,) / (H,) tensor, or row
    ``expert_index`` (S + e for MoE expert e with shared ranks, e without; j for shared j)."""
    scales = np.asarray(scales, dtype=np.float32)
    if scales.ndim == 1:
        if scales.size not in (1, shape.H):
            raise ValueError(f"1-D scales must have 1 or H={shape.H} entries, got {scales.size}")
        return scales
    if scales.shape != (shape.scale_rows(), shape.H):
        raise ValueError(f"2-D scales must be ({shape.scale_rows()}, {shape.H}), "
                         f"got {scales.shape}")
    return scales[expert_index]


def expert_index(shape: MoeShape, k: int, e: int) -> int:
    """Row of the scale tensor for a pair: shared expert j = k - K, or MoE expert e."""
    if k >= shape.K:
        return k - shape.K
    return e + (shape.S if shape.S_r else 0)


# --------------------------------------------------------------------------- dispatch


def reference_dispatch(shape: MoeShape, inputs: list[DispatchInputs], quant: str = "none",
                       expert_token_nums_type: int = 1, quant_dtype: str = "e5m2"
                       ) -> list[DispatchOutputs]:
    """Every rank's dispatch outputs for one call."""
    if quant not in DISPATCH_QUANTS:
        raise ValueError(f"dispatch_quant {quant!r}; allowed: {', '.join(DISPATCH_QUANTS)}")
    if expert_token_nums_type not in (0, 1):
        raise ValueError("expert_token_nums_type must be 0 (cumsum) or 1 (counts)")
    if quant == "static_int8" and any(i.scales is None for i in inputs):
        raise ValueError("static_int8 needs scales on every rank")
    ids = [np.asarray(i.expert_ids) for i in inputs]
    plan = dispatch_rows(shape, ids, [i.x_active_mask for i in inputs])
    has_es = any(i.expert_scales is not None for i in inputs)
    outs = []
    for dst, got in enumerate(plan):
        A = shape.rows_capacity(dst)
        if got.n > A:
            raise ValueError(f"rank {dst} receives {got.n} rows, more than A = {A}")
        expand_x, dyn = _row_buffers(shape, quant, A)
        es_out = np.zeros(A, dtype=np.float32) if has_es else None
        for i, (src, t, k) in enumerate(got.triples(np.int64).tolist()):
            src_in = inputs[src]
            e = int(ids[src][t, k]) if k < shape.K else -1
            row, scale = _quantised_row(shape, quant, quant_dtype, src_in, t, k, e)
            expand_x[i] = row
            if scale is not None:
                dyn[i] = scale
            if es_out is not None and k < shape.K and src_in.expert_scales is not None:
                es_out[i] = np.float32(src_in.expert_scales[t, k])
        outs.append(_counted(shape, got, expand_x, dyn, es_out, expert_token_nums_type))
    return outs


def _row_buffers(shape: MoeShape, quant: str, A: int) -> tuple[np.ndarray, np.ndarray | None]:
    """expand_x [A, H] in the mode's element type and dynamic_scales (None: the mode has
    none): [A] fp32 (int8), [A, ceil(H/128)] fp32 (pergroup), [A, Align2(ceil(H/32))] E8M0
    bytes (mxfp8, mxfp8_clip)."""
    H = shape.H
    out_dt = token_dtype(shape.dtype) if quant == "none" else np.dtype(np.int8)
    dyn = np.zeros(A, dtype=np.float32) if quant in ("int8", "pertoken_fp8") else None
    cols = H
    if quant == "pergroup":
        out_dt, dyn = np.dtype(np.uint8), np.zeros((A, ceil_div(H, 128)), np.float32)
    elif quant in ("mxfp8", "mxfp8_clip", "mxfp4_e2m1"):
        nb = ceil_div(H, 32)
        out_dt, dyn = np.dtype(np.uint8), np.zeros((A, nb + nb % 2), np.uint8)
        cols = ceil_div(H, 2) if quant == "mxfp4_e2m1" else H
    elif quant == "pertoken_fp8":
        out_dt = fp8_format("e4m3")[0]
    return np.zeros((A, cols), dtype=out_dt), dyn


def _quantised_row(shape: MoeShape, quant: str, quant_dtype: str, src_in: DispatchInputs,
                   t: int, k: int, e: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Token t of a source as the row (and its scales) one pair carries: the static /
    smooth scale row is the pair's expert's (expert_index)."""
    x = src_in.x[t:t + 1]
    if quant == "none":
        return x[0], None
    if quant in ("mxfp8", "mxfp8_clip"):
        return mx_row(x[0], quant_dtype, quant == "mxfp8_clip")
    if quant in ("mxfp4_e2m1", "pertoken_fp8"):
        return deepep_a5_row(x[0], quant)
    scale = (None if src_in.scales is None
             else scale_row(shape, src_in.scales, expert_index(shape, k, e)))
    if quant == "pergroup":
        return pergroup_row(x[0], quant_dtype, scale)
    if quant == "static_int8":
        return static_int8_quantize(x[0], scale), None
    q, s = int8_token_quantize(x, scale)
    return q[0], s[0]


def deepep_a5_row(x: np.ndarray, quant: str) -> tuple[np.ndarray, np.ndarray]:
    """One token as DeepEP's 950 low-latency dispatch records it (mxfp4_e2m1: also
    ops-transformer's 950 dispatch), from the goldens:
    mxfp4_e2m1: the token zero-padded to whole blocks of 32, :func:`mxfp4_row`, the
    ceil(H/2) bytes and the scales padded to an even count with 0; pertoken_fp8:
    :func:`pertoken_row` to e4m3, a zero token all zero codes with scale 1."""
    h = x.size
    if quant == "mxfp4_e2m1":
        padded = np.zeros(ceil_div(h, 32) * 32, x.dtype)
        padded[:h] = x
        q, sc = mxfp4_row(padded)
        scales = np.zeros(sc.size + sc.size % 2, np.uint8)
        scales[:sc.size] = sc
        return q[:ceil_div(h, 2)], scales
    e4m3 = fp8_format("e4m3")[0]
    if not np.any(x.astype(np.float32)):
        return np.zeros(h, np.uint8).view(e4m3), np.float32(1.0)
    q, s = pertoken_row(x, "e4m3")
    return q.view(e4m3), s


def _counted(shape: MoeShape, got: Received, expand_x: np.ndarray, dyn: np.ndarray | None,
             es_out: np.ndarray | None, expert_token_nums_type: int) -> DispatchOutputs:
    """One rank's outputs with its assist info and counts: ep_recv_count [W*L] (the first
    W entries on a shared rank), expert_token_nums [L] (one entry on a shared rank)."""
    W, L, A = shape.W, shape.L, expand_x.shape[0]
    assist = np.zeros((A, 3), dtype=np.int32)
    assist[:got.n] = got.triples()
    running = got.running()
    ep_recv = np.zeros(W * L, dtype=np.int32)
    ep_recv[:running.size] = running
    per_expert = got.per_expert()
    etn = np.zeros(L, dtype=np.int64)
    etn[:per_expert.size] = np.cumsum(per_expert) if expert_token_nums_type == 0 else per_expert
    return DispatchOutputs(expand_x, dyn, assist, etn, ep_recv, es_out, got.n)


def dequantized_rows(out: DispatchOutputs, quant: str, dtype: str, quant_dtype: str = "e5m2",
                     h: int | None = None) -> np.ndarray:
    """expand_x back in the token dtype (int8: fp32(q) * dynamic_scale; static: fp32(q),
    the scale being the caller's; FP8 modes: fp32(fp8) * the group's scale; MXFP4: the
    E2M1 pairs unpacked, ``h`` columns), for identity-expert round trips. Only the first n
    rows are converted: the rest stay untouched zeros (no memory until written)."""
    dt = token_dtype(dtype)
    if quant == "none":
        return out.expand_x
    n = out.n
    if quant == "mxfp4_e2m1":
        cols = out.expand_x.shape[1]
        h = 2 * cols if h is None else h
        rows = np.zeros((out.expand_x.shape[0], h), dtype=dt)
        rows[:n] = _mxfp4_values(out.expand_x[:n], out.dynamic_scales[:n], cols)[:, :h].astype(dt)
        return rows
    rows = np.zeros(out.expand_x.shape, dtype=dt)
    if quant == "pertoken_fp8":
        v = np.ascontiguousarray(out.expand_x[:n]).view(np.uint8).view(fp8_format("e4m3")[0])
        rows[:n] = (v.astype(np.float32) * out.dynamic_scales[:n, None]).astype(dt)
        return rows
    if quant in FP8_QUANTS:
        ty = fp8_format(quant_dtype)[0]
        v = np.ascontiguousarray(out.expand_x[:n]).view(ty).astype(np.float32)
        sc = np.asarray(out.dynamic_scales[:n])
        if quant == "pergroup":
            f = np.repeat(sc, 128, axis=1)
        else:
            f = np.repeat(sc.view(tables().e8m0).astype(np.float32), 32, axis=1)
        with np.errstate(invalid="ignore", over="ignore"):
            rows[:n] = (v * f[:, :v.shape[1]]).astype(dt)
        return rows
    q = out.expand_x[:n].astype(np.float32)
    if quant == "int8":
        q = q * out.dynamic_scales[:n, None]
    rows[:n] = q.astype(dt)
    return rows


def _mxfp4_values(packed: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """fp32 of E2M1 pairs (low nibble first) times each block's E8M0 scale 2^(b - 127):
    DeepEP's per_token_cast_back of an MXFP4 row, [n, 2 cols]."""
    b = np.asarray(packed, np.uint8)
    codes = np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], 2 * cols)
    vals = codes.view(tables().fp4_e2m1).astype(np.float32)
    sc = np.asarray(scales, np.uint8).view(tables().e8m0).astype(np.float32)
    return vals * np.repeat(sc, 32, axis=1)[:, :2 * cols]


# --------------------------------------------------------------------------- combine


def fp32_dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """<a, b> in fp32: the products rounded to fp32, summed by numpy's float32 pairwise sum.
    (The vector unit's Sum reduces in its own tree order; npusim fixes this one.)"""
    return np.float32(np.sum(a.astype(np.float32) * b.astype(np.float32), dtype=np.float32))


def const_expert_row(x: np.ndarray, alpha1: np.ndarray, alpha2: np.ndarray, v: np.ndarray
                     ) -> np.ndarray:
    """a1 * x + a2 * v in fp32 with (a1, a2) = softmax(<alpha1, x>, <alpha2, x>)."""
    xf = x.astype(np.float32)
    s1, s2 = fp32_dot(alpha1, xf), fp32_dot(alpha2, xf)
    m = max(s1, s2)
    e = np.exp(np.array([s1 - m, s2 - m], dtype=np.float32))
    tot = np.float32(e[0] + e[1])
    a1, a2 = np.float32(e[0] / tot), np.float32(e[1] / tot)
    return xf * a1 + v.astype(np.float32) * a2


def reference_combine(shape: MoeShape, dispatch_out: list[DispatchOutputs],
                      inputs: list[CombineInputs], quant: str = "none") -> list[np.ndarray]:
    """Every rank's combine output x (BS_r, H) for one call."""
    if quant not in COMBINE_QUANTS:
        raise ValueError(f"combine_quant {quant!r}; allowed: {', '.join(COMBINE_QUANTS)}")
    W, K, S, H, E = shape.W, shape.K, shape.S, shape.H, shape.E
    dt = token_dtype(shape.dtype)
    # slot[r][(t, k)] = the row rank q sends back for (t, k): what lands in r's window
    slots: list[dict[tuple[int, int], np.ndarray]] = [{} for _ in range(W)]
    for q in range(W):
        d = dispatch_out[q]
        rows = np.asarray(inputs[q].expand_x[:d.n])
        if quant == "int8" and d.n:
            rows = int8_block_round_trip(rows, recip=True)
        elif quant.startswith("mxfp8") and d.n:
            rows = np.stack([mx_combine_row(row, quant[-4:]) for row in rows])
        for i in range(d.n):
            src, t, k = (int(v) for v in d.assist_info_for_combine[i])
            slots[src][(t, k)] = rows[i]
    Z, C = shape.zero_experts, shape.copy_experts
    outs = []
    for r in range(W):
        inp = inputs[r]
        ids = np.asarray(inp.expert_ids)
        tokens, _ = active_pairs(shape, ids, inp.x_active_mask)
        live = np.ones(ids.shape, dtype=bool)
        if inp.x_active_mask is not None and np.asarray(inp.x_active_mask).ndim == 2:
            live = np.asarray(inp.x_active_mask, dtype=bool)
        out = np.zeros((shape.bs[r], H), dtype=dt)
        for t in tokens.tolist():
            acc = np.zeros(H, dtype=np.float32)
            for k in range(K):
                if not live[t, k]:
                    continue
                e = int(ids[t, k])
                w = None if inp.expert_scales is None else np.float32(inp.expert_scales[t, k])
                if e < E:
                    row = slots[r][(t, k)].astype(np.float32)
                elif e < E + Z:
                    continue
                elif e < E + Z + C:
                    row = inp.ori_x[t].astype(np.float32)
                else:
                    c = e - E - Z - C
                    row = const_expert_row(inp.ori_x[t], inp.const_alpha1[c],
                                           inp.const_alpha2[c], inp.const_v[c])
                acc = acc + (row if w is None else row * w)
            for j in range(S):
                acc = acc + slots[r][(t, K + j)].astype(np.float32)
            if inp.shared_expert_x is not None:
                acc = acc + inp.shared_expert_x[t].astype(np.float32)
            out[t] = acc.astype(dt)
        outs.append(out)
    return outs
