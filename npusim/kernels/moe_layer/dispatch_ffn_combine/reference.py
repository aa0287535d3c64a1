"""A numpy reference of DeepEP-Ascend's DispatchFFNCombine layer (sgl-kernel-npu
csrc/deepep/ops/op_kernel/dispatch_ffn_combine_kernel.hpp), independent of the simulated
program. It reuses moe_layer/reference.py where the arithmetic is the same (int8 sums,
bf16 rounding) and replaces the steps whose arithmetic differs from the unfused chain,
each with the source line it follows (paths under .../dispatch_ffn_combine_kernel/):

- routing quant (moe_init_routing_quant_v2/moe_v2_fullload_dynamic_quant.h:235-253):
  s = amax / 127.0f (a scalar division), y = x / s (a vector Div), CAST_TRUNC to fp16,
  then CAST_ROUND (half away from zero) to int8; the stored scale is s itself;
- row order (SortCompute, 89-166): a sort of the (token, k) routes by expert id, ties in
  (token, k) order; a rank's experts receive each source's rows in source order
  (the pulls' rowStart, dispatch_ffn_combine_kernel.hpp GetCumsumForMMAIV + the pull loop);
- GMM1 / GMM2 (utils/copy_l0c_to_gm_custom.hpp:13-36, QuantMode per channel): FixPipe
  writes fp16(f32(acc) * scale[n]), the scale an int64 holding fp32 bits;
- epilogue 1 (utils/block_epilogue_pertoken_swiglu.hpp:190-240): c = f32(c16) * tscale
  (Muls), SwiGLU over the row (gate = the first N/2: Muls -1, Exp, Adds 1, Div, Mul by
  up), amax, scale = amax / 127.f, q = out * (127.f / amax) (scalar then Muls), RINT to
  int32, RINT to fp16, RINT to int8;
- epilogue 2 (utils/block_epilogue_pertoken_v2.hpp:126-154): y = bf16_RINT(f32(c16) *
  tscale2) row by row;
- unpermute (unpermute/moe_token_unpermute.h:226-340): per token, the first route's row
  times its prob, then + row * prob for the others (Muls then Add), RINT to bf16.

max_output_size is the test's BS * K * W, so no row is ever dropped (tiling.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npusim.kernels.moe_layer.reference import Layer, int_matmul
from npusim.kernels.quant.golden import bf16

F32, F16 = np.float32, np.float16


@dataclass(frozen=True)
class DfcWeights:
    """One rank's local experts as DispatchFFNCombine takes them (ND here; NZ on device)."""

    w1: np.ndarray  # [L, H, N] int8, N = 2I (gate columns, then up)
    s1: np.ndarray  # [L, N] fp32 (handed over as int64 holding the bits)
    w2: np.ndarray  # [L, N/2, H] int8
    s2: np.ndarray  # [L, H] fp32


def trunc_f16(y: np.ndarray) -> np.ndarray:
    """CAST_TRUNC fp32 -> fp16: the fp16 nearest to y that is not farther from zero."""
    h = y.astype(F16)
    over = np.abs(h.astype(F32)) > np.abs(y)
    h[over] = np.nextafter(h[over], F16(0))
    return h


def round_i8(h: np.ndarray) -> np.ndarray:
    """CAST_ROUND fp16 -> int8: half away from zero, saturated."""
    v = h.astype(F32)
    return np.clip(np.sign(v) * np.floor(np.abs(v) + F32(0.5)), -128, 127).astype(np.int8)


def routing_quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[BS, H] bf16 -> ([BS, H] int8, [BS] fp32 scale s = amax / 127)."""
    xf = np.asarray(x).astype(F32)
    amax = np.abs(xf).max(axis=1)
    s = (amax / F32(127.0)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (xf / s[:, None]).astype(F32)
    return round_i8(trunc_f16(y)), s


def expert_order(ids: np.ndarray) -> np.ndarray:
    """The routes (flat token * K + k) in SortCompute's order: by expert, ties in order."""
    return np.argsort(np.asarray(ids).reshape(-1), kind="stable")


def fixpipe_f16(acc: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FixPipe's per-channel dequant: fp16(f32(acc) * scale[n])."""
    return (acc.astype(F32) * scale.astype(F32)[None, :]).astype(F32).astype(F16)


def swiglu_quant(c16: np.ndarray, tscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Epilogue 1 on [m, N] fp16 rows -> ([m, N/2] int8, [m] fp32)."""
    c = (c16.astype(F32) * tscale.astype(F32)[:, None]).astype(F32)
    half = c.shape[1] // 2
    gate, up = c[:, :half], c[:, half:]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        t = np.exp((gate * F32(-1.0)).astype(F32)).astype(F32)
        t = (t + F32(1.0)).astype(F32)
        out = ((gate / t).astype(F32) * up).astype(F32)
        amax = np.abs(out).max(axis=1).astype(F32)
        scale = (amax / F32(127.0)).astype(F32)
        mul = (F32(127.0) / amax).astype(F32)
        y = (out * mul[:, None]).astype(F32)
        q = np.rint(np.nan_to_num(y, nan=0.0, posinf=127.0, neginf=-128.0))
    return np.clip(q, -128, 127).astype(np.int8), scale


@dataclass(frozen=True)
class RankStages:
    """What one rank holds after each step, over its received rows (expert-major)."""

    expanded_x: np.ndarray  # [BS*K, H] int8, this rank's routes sorted by expert
    expanded_scale: np.ndarray  # [BS*K] fp32
    expanded_row_idx: np.ndarray  # [BS*K] int32: route -> its sorted position
    counts: np.ndarray  # [E] int32 this rank's routes per global expert
    recv_x: np.ndarray  # [n, H] int8, pulled rows
    recv_scale: np.ndarray  # [n] fp32
    expert_token_nums: np.ndarray  # [L] int32 rows per local expert
    gmm1: np.ndarray  # [n, N] fp16
    swiglu: np.ndarray  # [n, N/2] int8
    swiglu_scale: np.ndarray  # [n] fp32
    gmm2: np.ndarray  # [n, H] bf16


def reference_layer(x: Sequence[np.ndarray], ids: Sequence[np.ndarray],
                    probs: Sequence[np.ndarray], experts: Sequence[DfcWeights], L: int
                    ) -> Layer[RankStages]:
    """The layer over all ranks: expert e lives on rank e // L."""
    W = len(x)
    E = W * L
    K = np.asarray(ids[0]).shape[1]
    src = []
    for r in range(W):
        q, s = routing_quant(x[r])
        order = expert_order(ids[r])
        row_idx = np.empty(order.size, np.int32)
        row_idx[order] = np.arange(order.size, dtype=np.int32)
        flat = np.asarray(ids[r]).reshape(-1)
        counts = np.bincount(flat, minlength=E).astype(np.int32)
        src.append((q[order // K], s[order // K], row_idx, counts))
    starts = [np.concatenate([[0], np.cumsum(c[3])[:-1]]) for c in src]
    # combine: every source's expanded rows, written back by the expert ranks
    back = [np.zeros((c[0].shape[0], c[0].shape[1]), bf16(np.zeros(0)).dtype) for c in src]
    stages = []
    for r in range(W):
        wt = experts[r]
        xs, ss, where = [], [], []
        nums = np.zeros(L, np.int32)
        for g in range(L):
            e = r * L + g
            for s_ in range(W):
                a, n = int(starts[s_][e]), int(src[s_][3][e])
                xs.append(src[s_][0][a:a + n])
                ss.append(src[s_][1][a:a + n])
                where.extend((s_, a + i) for i in range(n))
                nums[g] += n
        rx, rs = np.concatenate(xs), np.concatenate(ss)
        ends = np.cumsum(nums)
        n_all = rx.shape[0]
        g1 = np.zeros((n_all, wt.w1.shape[2]), F16)
        q2 = np.zeros((n_all, wt.w1.shape[2] // 2), np.int8)
        s2 = np.zeros(n_all, F32)
        y2 = np.zeros((n_all, rx.shape[1]), back[0].dtype)
        for g in range(L):
            rows = slice(int(ends[g] - nums[g]), int(ends[g]))
            g1[rows] = fixpipe_f16(int_matmul(rx[rows], wt.w1[g]), wt.s1[g])
            q2[rows], s2[rows] = swiglu_quant(g1[rows], rs[rows])
            c2 = fixpipe_f16(int_matmul(q2[rows], wt.w2[g]), wt.s2[g])
            y2[rows] = bf16((c2.astype(F32) * s2[rows, None]).astype(F32))
        for i, (s_, pos) in enumerate(where):
            back[s_][pos] = y2[i]
        stages.append(RankStages(src[r][0], src[r][1], src[r][2], src[r][3], rx, rs, nums,
                                 g1, q2, s2, y2))
    ys = []
    for r in range(W):
        idx = stages[r].expanded_row_idx.reshape(-1, K)
        p = np.asarray(probs[r]).astype(F32)
        acc = (back[r][idx[:, 0]].astype(F32) * p[:, :1]).astype(F32)
        for k in range(1, K):
            acc = (acc + (back[r][idx[:, k]].astype(F32) * p[:, k:k + 1]).astype(F32)
                   ).astype(F32)
        ys.append(bf16(acc))
    return Layer(stages, ys)
