"""A numpy reference of the unfused MoE layer DeepEP-Ascend's tests time on the A3
(tests/python/deepep/test_fused_deep_moe.py baseline_test), written from the kernels'
arithmetic and independent of the simulated programs:

    dispatch (per-token INT8) -> GMM1 int8 x int8 -> int32
        -> DequantSwigluQuant (fp32 dequant, SwiGLU, per-token INT8)
        -> GMM2 int8 x int8 -> int32 -> dequant to bf16 -> weighted combine (bf16)

Every step is fp32 elementwise as the vector unit runs it, in the kernels' order:

- dispatch quant (moe_distribute_dispatch_v2.h QuantDynamicPerToken): amax of |x| in fp32,
  s = 127 / amax (scalar), y = x * s, RINT to int32, to half (exact), TRUNC to int8; the
  stored scale is 1 / s;
- GMM1: exact int32 sums (|acc| < 2^31 for K <= 7168 at int8);
- DequantSwigluQuant (ops-nn dequant_swiglu_quant.h ComputeDequant / ComputeSwiGLU /
  DynamicQuant / CastFloatToInt8): x = f32(acc) * weight_scale[g] * activation_scale[m]
  (two Muls), A = the first half (activate_left), B the second; silu(A) = A / (exp(-A) + 1);
  out = B * silu(A); scale = amax * f32(1 / 127); y = out / scale (a Div); RINT, half,
  TRUNC to int8;
- GMM2 (ops-transformer grouped_matmul_quant_mixcore.h ComputeDequantAndActivate):
  f32(acc) * f32(bf16 scale[n]), then * per_token_scale[m], cast to bf16 (RINT);
- combine (moe_distribute_combine_v2.h): per token, in k order, acc += f32(row) * weight
  (a Muls then an Add, no FMA), to bf16 (RINT).

exp is numpy's fp32 exp; the vector unit's Exp may differ by an ulp (not published).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from npusim.kernels.exchange import received
from npusim.kernels.quant.golden import bf16

F32 = np.float32
INV_127 = F32(1.0 / 127.0)  # DYNAMIC_QUANT_FACTOR


@dataclass(frozen=True)
class ExpertWeights:
    """One rank's local experts as the baseline passes them (ND here; NZ on the device)."""

    w1: np.ndarray  # [L, H, 2I] int8 (gate columns, then up)
    s1: np.ndarray  # [L, 2I] fp32 per-channel
    w2: np.ndarray  # [L, I, H] int8
    s2: np.ndarray  # [L, H] bf16 (w2_scale.to(bfloat16))


def to_int8(y: np.ndarray) -> np.ndarray:
    """CastFloatToInt8: RINT to int32, to half (CAST_ROUND), TRUNC to int8. The kernels'
    values are within +-127.x, where half and int8 hold the rounded integers exactly;
    NaN (a zero row's 0 / 0, which no kernel guards) is taken as 0."""
    with np.errstate(invalid="ignore"):
        q = np.rint(np.nan_to_num(y, nan=0.0, posinf=127.0, neginf=-128.0))
    return np.clip(q, -128, 127).astype(np.int8)


def dispatch_quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, H] bf16 -> (int8 rows, fp32 per-token scales)."""
    xf = np.asarray(x).astype(F32)
    amax = np.abs(xf).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (F32(127.0) / amax).astype(F32)
        q = to_int8((xf * s[:, None]).astype(F32))
        return q, (F32(1.0) / s).astype(F32)


def dequant_swiglu(acc: np.ndarray, wscale: np.ndarray, ascale: np.ndarray) -> np.ndarray:
    """[m, 2I] int32, [2I] fp32, [m] fp32 -> [m, I] fp32: the dequant and the SwiGLU,
    shared by DequantSwigluQuant and FusedDeepMoe's GMM1 epilogue (same operations in
    the same order)."""
    x = acc.astype(F32)
    x = (wscale[None, :].astype(F32) * x).astype(F32)
    x = (ascale[:, None].astype(F32) * x).astype(F32)
    half = x.shape[1] // 2
    a, b = x[:, :half], x[:, half:]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        t = np.exp((a * F32(-1.0)).astype(F32)).astype(F32)
        t = (t + F32(1.0)).astype(F32)
        act = (a / t).astype(F32)
        return (b * act).astype(F32)


def dequant_swiglu_quant(acc: np.ndarray, wscale: np.ndarray, ascale: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """[m, 2I] int32, [2I] fp32, [m] fp32 -> ([m, I] int8, [m] fp32)."""
    out = dequant_swiglu(acc, wscale, ascale)
    half = out.shape[1]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scale = (np.abs(out).max(axis=1) * INV_127).astype(F32) if half else np.zeros(
            len(out), F32)
        y = (out / scale[:, None]).astype(F32)
    return to_int8(y), scale


def gmm2_dequant(acc: np.ndarray, scale_bf16: np.ndarray, token_scale: np.ndarray
                 ) -> np.ndarray:
    """[m, H] int32 -> bf16: per-channel (bf16 widened) then per-token, RINT to bf16."""
    y = (acc.astype(F32) * scale_bf16.astype(F32)[None, :]).astype(F32)
    y = (y * token_scale.astype(F32)[:, None]).astype(F32)
    return bf16(y)


def int_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact int8 x int8 -> int32 (float64 sums of int8 products are exact here)."""
    return (x.astype(np.float64) @ w.astype(np.float64)).astype(np.int64).astype(np.int32)


@dataclass(frozen=True)
class RankStages:
    """What each kernel writes on one rank, up to the rows received (n)."""

    recv_x: np.ndarray  # [n, H] int8
    recv_scales: np.ndarray  # [n] fp32
    counts: np.ndarray  # [L] int64 rows per local expert
    gmm1: np.ndarray  # [n, 2I] int32
    swiglu: np.ndarray  # [n, I] int8
    swiglu_scale: np.ndarray  # [n] fp32
    gmm2: np.ndarray  # [n, H] bf16


S = TypeVar("S")


@dataclass(frozen=True)
class Layer(Generic[S]):
    """A form's reference over all ranks: per rank the record of its own steps (each form
    keeps its own, as its kernels write different things) and the combined output."""

    stages: list[S]
    y: list[np.ndarray]  # per rank [BS, H] bf16, the combined output


def expert_chain(xq: np.ndarray, xs: np.ndarray, counts: np.ndarray, wt: ExpertWeights,
                 requant: Callable[[np.ndarray, np.ndarray, np.ndarray],
                                   tuple[np.ndarray, np.ndarray]] = dequant_swiglu_quant
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """GMM1, DequantSwigluQuant (or another form's dequant-SwiGLU-requant, `requant`) and
    GMM2 over the received rows, expert by expert."""
    n = xq.shape[0]
    I2, H = wt.w1.shape[2], wt.w1.shape[1]
    g1 = np.zeros((n, I2), np.int32)
    q2 = np.zeros((n, I2 // 2), np.int8)
    s2 = np.zeros(n, F32)
    out = np.zeros((n, H), bf16(np.zeros(0)).dtype)
    ends = np.cumsum(counts)
    for e in np.flatnonzero(counts):
        rows = slice(int(ends[e] - counts[e]), int(ends[e]))
        g1[rows] = int_matmul(xq[rows], wt.w1[e])
        q2[rows], s2[rows] = requant(g1[rows], wt.s1[e], xs[rows])
        out[rows] = gmm2_dequant(int_matmul(q2[rows], wt.w2[e]), wt.s2[e], s2[rows])
    return g1, q2, s2, out


def reference_layer(x: Sequence[np.ndarray], ids: Sequence[np.ndarray],
                    weights: Sequence[np.ndarray], experts: Sequence[ExpertWeights],
                    L: int, chain: Callable[..., tuple] = expert_chain) -> Layer[RankStages]:
    """The layer over all ranks: x [BS, H] bf16, ids [BS, K] (expert e on rank e // L),
    routing weights [BS, K] fp32; experts[r] the local experts of rank r; `chain` the
    experts' part (expert_chain's signature), the form's."""
    K = ids[0].shape[1]
    quant = [dispatch_quant(xr) for xr in x]
    back = [np.zeros((xr.shape[0], K, xr.shape[1]), F32) for xr in x]
    stages = []
    for r, got in enumerate(received([np.asarray(i) for i in ids], L)):
        xq, xs = got.rows([q for q, _ in quant]), got.rows([s for _, s in quant])
        counts = got.per_expert(np.int64)
        g1, q2, s2, out = chain(xq, xs, counts, experts[r])
        for i in range(got.n):
            back[int(got.src[i])][int(got.token[i]), int(got.k[i])] = out[i].astype(F32)
        stages.append(RankStages(xq, xs, counts, g1, q2, s2, out))
    return Layer(stages, weighted_combine(back, weights))


def weighted_combine(back: Sequence[np.ndarray], weights: Sequence[np.ndarray]
                     ) -> list[np.ndarray]:
    """The combine of every rank: back[s] [BS, K, H] fp32 (the experts' bf16 rows of
    rank s's pairs), weights[s] [BS, K]; per token, in k order, acc += row * weight (a
    Muls then an Add), to bf16 (RINT)."""
    ys = []
    for s, rows in enumerate(back):
        acc = np.zeros((rows.shape[0], rows.shape[2]), F32)
        for k in range(rows.shape[1]):
            acc = (acc + (rows[:, k] * weights[s][:, k, None].astype(F32)).astype(F32)
                   ).astype(F32)
        ys.append(bf16(acc))
    return ys
