"""A numpy reference of the 950's unfused layer (test_fused_deep_moe_a5.py
run_small_op_baseline), written from the operators' arithmetic and independent of the
simulated programs. The steps the A3 chain shares are mc2's references; the rest:

    dispatch (mc2 reference_dispatch, quant_mode 4: MX fp8, E8M0 per 32)
      -> GMM1: fp8 x fp8 with both E8M0 scales, fp32 accumulate, bf16 out
      -> SwiGLU: silu(a) x b in fp32, one rounding to bf16
      -> MX requant of the SwiGLU rows (E8M0 per 32, fp8)
      -> GMM2 as GMM1 -> combine (mc2 reference_combine, bf16)

- GMM (grouped_matmul arch35 MX, the cube's MmadMx): per L0 K step of 128 (the host
  tiling's baseK, grouped_quant_matmul_tiling.cpp CalBasicBlock) the exact products of
  the codes' values times 2^(e - 127) summed in fp32, added to the fp32 accumulator; the
  FixPipe casts to bf16 round-to-nearest-even. One step's fp32 sum is numpy's BLAS, whose
  order depends on the matrix's rows (gemv for one, kernels by row count), so the
  reference sums over the host tiling's base blocks (tiling.mx_blocks), the shapes the
  cube's mmad takes;
- SwiGLU: a / (1 + exp(-a)) x b in fp32 (ops-nn swi_glu golden, tests/assets/golden.py:
  silu in fp32 then the product), to bf16 RNE;
- requant: npusim's 950 MX quantiser (npusim.kernels.quant.mx_quantize_bf16), the same
  function the A5 dispatch's QuantDynamicMx and mega_moe's requant use.

exp is numpy's fp32 exp; the vector unit's Exp may differ by an ulp (not published).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npusim.formats import BF16
from npusim.kernels.mc2 import reference as mc2_ref
from npusim.kernels.mega_moe import mx
from npusim.kernels.moe_layer.a5.tiling import MxGmmTiling, mx_blocks
from npusim.kernels.quant import mx_quantize_bf16, mx_values
from npusim.workload.shape import MoeShape

F32 = np.float32
L0_K = 128  # the GMM's baseK: one MmadMx's K
MX = 32


def mx_gemm(xq: np.ndarray, xs: np.ndarray, wq: np.ndarray, ws: np.ndarray, mode: str
            ) -> np.ndarray:
    """[m, K] codes with [m, K/32] E8M0 times [K, N] codes with [K/32, N] -> [m, N] bf16,
    accumulated in fp32 one L0 K step at a time."""
    m, k = xq.shape
    acc = np.zeros((m, wq.shape[1]), F32)
    for k0 in range(0, k, L0_K):
        k1 = min(k0 + L0_K, k)
        a = mx_values(xq[:, k0:k1], xs[:, k0 // MX:k1 // MX], mode)
        b = np.ascontiguousarray(mx_values(wq[k0:k1].T, ws[k0 // MX:k1 // MX].T, mode).T)
        acc = (acc + (a @ b).astype(F32)).astype(F32)
    return acc.astype(BF16)


def grouped_mx_gemm(t: MxGmmTiling, xq: np.ndarray, xs: np.ndarray, w: np.ndarray,
                    s: np.ndarray, counts: np.ndarray, mode: str) -> np.ndarray:
    """The grouped call over x's rows [n, K]: each base block of every AIC by
    :func:`mx_gemm` (a block a split tail gives two cores is the same numbers twice)."""
    y = np.zeros((xq.shape[0], t.n), BF16)
    cnt = [int(c) for c in counts]
    for core in range(t.cores):
        for g, r0, rows, n0, cols in mx_blocks(t, cnt, core):
            r = slice(r0, r0 + rows)
            y[r, n0:n0 + cols] = mx_gemm(xq[r], xs[r], w[g][:, n0:n0 + cols],
                                         s[g][:, n0:n0 + cols], mode)
    return y


def swiglu(y: np.ndarray) -> np.ndarray:
    """[m, 2I] bf16 -> [m, I] bf16: silu of the first half times the second."""
    half = y.shape[1] // 2
    return mx.swiglu(y[:, :half], y[:, half:])


@dataclass(frozen=True)
class Experts:
    """One rank's local experts as the test passes them (ND), codes and E8M0 scales."""

    w1: np.ndarray  # [L, H, 2I] fp8 codes
    s1: np.ndarray  # [L, H/32, 2I]
    w2: np.ndarray  # [L, I, H]
    s2: np.ndarray  # [L, I/32, H]


@dataclass(frozen=True)
class Stages:
    """One rank's kernels' outputs over its n received rows."""

    dispatch: mc2_ref.DispatchOutputs
    gmm1: np.ndarray  # [n, 2I] bf16
    swiglu: np.ndarray  # [n, I] bf16
    quant: np.ndarray  # [n, I] fp8 codes
    quant_scale: np.ndarray  # [n, I/32] E8M0
    gmm2: np.ndarray  # [n, H] bf16


def expert_chain(t1: MxGmmTiling, t2: MxGmmTiling, xq: np.ndarray, xs: np.ndarray,
                 counts: np.ndarray, wt: Experts, mode: str) -> tuple[np.ndarray, ...]:
    """GMM1, SwiGLU, requant and GMM2 over the received rows."""
    n, i2 = xq.shape[0], wt.w1.shape[2]
    g1 = grouped_mx_gemm(t1, xq, xs, wt.w1, wt.s1, counts, mode)
    sw = swiglu(g1)
    q, qs = mx_quantize_bf16(sw, mode) if n else (np.zeros((0, i2 // 2), np.uint8),
                                                   np.zeros((0, i2 // 2 // MX), np.uint8))
    g2 = grouped_mx_gemm(t2, q, qs, wt.w2, wt.s2, counts, mode)
    return g1, sw, q, qs, g2


def reference_layer(shape: MoeShape, gmms: tuple[MxGmmTiling, MxGmmTiling],
                    x: Sequence[np.ndarray], ids: Sequence[np.ndarray],
                    weights: Sequence[np.ndarray], experts: Sequence[Experts], mode: str
                    ) -> tuple[list[Stages], list[np.ndarray]]:
    """Every rank's stages and combined output y [BS, H] bf16 (`shape`: mc2's shape;
    `gmms`: the two GroupedMatmul calls' host tilings, for their base blocks)."""
    ins = [mc2_ref.DispatchInputs(xr, ir, wr) for xr, ir, wr in zip(x, ids, weights,
                                                                       strict=True)]
    outs = mc2_ref.reference_dispatch(shape, ins, "mxfp8", 1, mode)
    stages, back = [], []
    for d, wt in zip(outs, experts, strict=True):
        n = d.n
        xs = d.dynamic_scales[:n, :shape.H // MX]
        g1, sw, q, qs, g2 = expert_chain(*gmms, d.expand_x[:n], xs, d.expert_token_nums, wt,
                                         mode)
        stages.append(Stages(d, g1, sw, q, qs, g2))
        full = np.zeros((d.expand_x.shape[0], shape.H), BF16)
        full[:n] = g2
        back.append(mc2_ref.CombineInputs(full, ids[len(back)], weights[len(back)]))
    return stages, mc2_ref.reference_combine(shape, outs, back)
