"""A numpy reference of FusedDeepMoe on the Ascend 950, written from the kernel's
arithmetic (sgl-kernel-npu main, op_kernel/fused_deep_moe_a5) and independent of the
simulated program. G1 = fused_deep_moe/gemm/kernel/dispatch_mx_gmm1_swiglu.h.

1. dispatch: each (token, k) pair's bf16 row to MX (QuantDynamicMx, G1 522-541: E8M0
   per 32 from the largest bf16 exponent, elements scaled and cast RINT, saturated);
   written here with the OCP golden (quant.golden.mx_quantize), which equals that rule
   on bf16 rows. Rows arrive per local expert, source rank by source rank, each
   source's pairs in (token, k) order (RecvToken, G1 986-1045);
2. GMM1 (MmadMx, L1 tile 256 x 256, L0 K 128): per 256 x 256 block, fp32 products of
   the MX values summed per 128-element K chunk and the chunks added in fp32 in K
   order (L0C), written to GM as fp32 (fixpipe, no conversion);
3. SiLU-half epilogue (block_epilogue_silu_half.h 142-157): c to bf16 (CAST_RINT, the
   baseline's bf16 GEMM output), back to fp32; the left half (block column < N1/2)
   silu(c) = c / (exp(-c) + 1) in fp32 (Muls -1, Exp, Adds 1, Div), the right half c;
4. requant (PostSwigluDynamicQuant, G1 1318-1335): left * right in fp32, to bf16 RINT,
   MX again (step 1's rule) over N1/2;
5. GMM2 as step 2 over K = N1/2, then to bf16 RINT (block_epilogue_cast_combine.h 214);
6. combine (LocalWindowCopy, cam_moe_distribute_combine.h 661-688): per token, in k
   order, acc += f32(row) * weight (Muls, then Add), to bf16 RINT: the unfused
   combine's arithmetic, moe_layer.reference.weighted_combine.

exp is numpy's fp32 exp (the vector unit's Exp ulp is not published). The fp32 sums of
step 2 use numpy's BLAS on the same 256 x 128 by 128 x 256 operands the cube model
multiplies, so the two agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npusim.kernels.exchange import received
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import L0_K, TILE_M, TILE_N
from npusim.kernels.moe_layer.reference import Layer, weighted_combine
from npusim.kernels.quant.golden import bf16, mx_quantize
from npusim.kernels.quant.recipes import mx_values

F32 = np.float32


@dataclass(frozen=True)
class MxWeights:
    """One rank's experts as the A5 test hands them (ND): [K, N] FP8 codes and E8M0
    scales per 32 along K (npu_dynamic_mx_quant(axis=1)), held [K/32, N]."""

    w1: np.ndarray  # [L, H, N1] uint8 (gate columns, then up)
    s1: np.ndarray  # [L, H/32, N1] uint8
    w2: np.ndarray  # [L, N1/2, H] uint8
    s2: np.ndarray  # [L, N1/64, H] uint8


def mx_gemm(a: np.ndarray, a_s: np.ndarray, b: np.ndarray, b_s: np.ndarray, mode: str
            ) -> np.ndarray:
    """[m, k] x [k, n] MX -> fp32 [m, n] as the cube sums it (step 2)."""
    av = mx_values(a, a_s, mode)
    bv = mx_values(b.T, b_s.T, mode).T  # scales run along K, B's rows
    m, k = av.shape
    n = bv.shape[1]
    out = np.zeros((m, n), F32)
    for r in range(0, m, TILE_M):
        for c in range(0, n, TILE_N):
            acc = out[r:r + TILE_M, c:c + TILE_N]
            for k0 in range(0, k, L0_K):
                x = np.ascontiguousarray(av[r:r + TILE_M, k0:k0 + L0_K])
                y = np.ascontiguousarray(bv[k0:k0 + L0_K, c:c + TILE_N])
                acc[...] = (acc + x @ y).astype(F32)
    return out


def silu_half(c: np.ndarray) -> np.ndarray:
    """Step 3 on a group's [m, N1] fp32 GEMM output -> [m, N1] fp32."""
    v = bf16(c).astype(F32)
    half = v.shape[1] // 2
    left = v[:, :half]
    with np.errstate(over="ignore"):
        d = np.exp((left * F32(-1)).astype(F32)).astype(F32)
        d = (d + F32(1)).astype(F32)
        out = v.copy()
        out[:, :half] = (left / d).astype(F32)
    return out


def requant(s: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Step 4: [m, N1] fp32 -> MX codes [m, N1/2] and E8M0 [m, N1/64]."""
    half = s.shape[1] // 2
    return mx_quantize(bf16((s[:, :half] * s[:, half:]).astype(F32)), mode)


@dataclass(frozen=True)
class RankStages:
    """What the kernel leaves in a rank's workspace, up to the rows received."""

    counts: np.ndarray  # [L] rows per local expert
    x1: np.ndarray  # [n, H] FP8 codes received
    x1_scales: np.ndarray  # [n, H/32]
    swiglu: np.ndarray  # [n, N1] fp32 (the GMM1 swap after the epilogue)
    x2: np.ndarray  # [n, N1/2] FP8 codes
    x2_scales: np.ndarray  # [n, N1/64]
    gmm2: np.ndarray  # [n, H] bf16


def reference_layer(x: Sequence[np.ndarray], ids: Sequence[np.ndarray],
                    weights: Sequence[np.ndarray], experts: Sequence[MxWeights], L: int,
                    mode: str) -> Layer[RankStages]:
    """The layer over all ranks: x [BS, H] bf16, ids [BS, K] (expert e on rank e // L),
    routing weights [BS, K] fp32, experts[r] rank r's local experts."""
    K = ids[0].shape[1]
    quant = [mx_quantize(xr, mode) for xr in x]
    back = [np.zeros((xr.shape[0], K, xr.shape[1]), F32) for xr in x]
    stages = []
    for r, got in enumerate(received([np.asarray(i) for i in ids], L)):
        x1, x1s = got.rows([q for q, _ in quant]), got.rows([s for _, s in quant])
        counts = got.per_expert(np.int64)
        wt = experts[r]
        n = x1.shape[0]
        n1 = wt.w1.shape[2]
        sw = np.zeros((n, n1), F32)
        x2 = np.zeros((n, n1 // 2), np.uint8)
        x2s = np.zeros((n, n1 // 64), np.uint8)
        out = np.zeros((n, wt.w2.shape[2]), bf16(np.zeros(0)).dtype)
        ends = np.cumsum(counts)
        for e in np.flatnonzero(counts):
            rows = slice(int(ends[e] - counts[e]), int(ends[e]))
            sw[rows] = silu_half(mx_gemm(x1[rows], x1s[rows], wt.w1[e], wt.s1[e], mode))
            x2[rows], x2s[rows] = requant(sw[rows], mode)
            out[rows] = bf16(mx_gemm(x2[rows], x2s[rows], wt.w2[e], wt.s2[e], mode))
        for i in range(n):
            back[int(got.src[i])][int(got.token[i]), int(got.k[i])] = out[i].astype(F32)
        stages.append(RankStages(counts, x1, x1s, sw, x2, x2s, out))
    return Layer(stages, weighted_combine(back, weights))
