"""The numpy reference of FusedDeepMoe on the A3, as far as it differs from the unfused
chain's (npusim.kernels.moe_layer.reference, whose steps it reuses):

- dispatch quant, GMM1's int32 sums, the dequant and SwiGLU (fp32), GMM2's int32 sums and
  the weighted combine are the same operations in the same order (sgl-kernel-npu
  GMM1K:745-785 vs moe_distribute_dispatch_v2.h:1005-1033; block_epilogue_per_token_
  dequant_swiglu.h:242-267; cam_moe_distribute_combine.h LocalWindowCopy 693-745);
- the requant of the SwiGLU rows (BlockQuant, GMM1K:199-266) multiplies by 127 and then
  by the scalar reciprocal of the row's absmax, where DequantSwigluQuant divides by
  amax / 127: the int8 rows may differ by one LSB; the scale (amax * (1/127)) is the same;
  its casts (RINT to int32, RINT to half, RINT to int8) agree with DequantSwigluQuant's
  (RINT, ROUND, TRUNC) on the integers they see;
- GMM2's dequant takes the fp32 weight scale (deep_ep.cpp:1216-1217 passes it as fp32),
  where the baseline's GroupedMatmul gets w2_scale.to(bfloat16);
- w13 and its scale arrive permuted (test_fused_deep_moe.py reshape_fusion_gmm_weight and
  permute_weight, 63-86): each 128-column tile holds 64 gate columns, then the 64 up
  columns of the same positions, so one 256 x 128 GMM1 block carries both halves of its
  SwiGLU. `permute_gate_up` / `unpermute_gate_up` move between the two orders.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npusim.kernels.moe_layer import reference as ref
from npusim.kernels.moe_layer.reference import ExpertWeights, Layer, to_int8

F32 = np.float32
QUANT_FACTOR = F32(127.0)
GMM_TILE_N_DIM = 64  # test_fused_deep_moe.py:16: columns of one half of a GMM1 N tile


def permute_gate_up(w: np.ndarray, tile_n: int = 2 * GMM_TILE_N_DIM) -> np.ndarray:
    """[..., N] gate columns then up columns -> the fused kernel's order: N tile j holds
    gate columns [j*h, (j+1)*h) then the up columns at the same positions (h = tile_n/2)."""
    *dims, n = w.shape
    half = tile_n // 2
    v = w.reshape(*dims, 2, n // tile_n, half)
    return np.ascontiguousarray(np.swapaxes(v, -3, -2)).reshape(*dims, n)


def unpermute_gate_up(w: np.ndarray, tile_n: int = 2 * GMM_TILE_N_DIM) -> np.ndarray:
    """The inverse of permute_gate_up."""
    *dims, n = w.shape
    half = tile_n // 2
    v = w.reshape(*dims, n // tile_n, 2, half)
    return np.ascontiguousarray(np.swapaxes(v, -3, -2)).reshape(*dims, n)


def block_quant(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BlockQuant: [m, I] fp32 -> ([m, I] int8, [m] fp32). amax = max |v| per row; v * 127
    (Muls), then * (1 / amax) with the reciprocal a scalar fp32 division; the scale is
    amax * fp32(1 / 127). A zero row's 0 * inf (no guard in the kernel) quantises to 0."""
    amax = np.abs(out).max(axis=1).astype(F32) if out.shape[1] else np.zeros(len(out), F32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        inv = (F32(1.0) / amax).astype(F32)
        y = (out * QUANT_FACTOR).astype(F32)
        y = (y * inv[:, None]).astype(F32)
    return to_int8(y), (amax * ref.INV_127).astype(F32)


def dequant_swiglu_block_quant(acc: np.ndarray, wscale: np.ndarray, ascale: np.ndarray
                               ) -> tuple[np.ndarray, np.ndarray]:
    """GMM1's epilogue (dequant + SwiGLU, fp32 to the workspace) then the requant, on the
    un-permuted columns: [m, 2I] int32 -> ([m, I] int8, [m] fp32)."""
    return block_quant(ref.dequant_swiglu(acc, wscale, ascale))


def fused_expert_chain(xq: np.ndarray, xs: np.ndarray, counts: np.ndarray,
                       wt: ExpertWeights) -> tuple[np.ndarray, ...]:
    """The experts' part of the fused layer; wt holds w13 and its scale un-permuted and
    the fp32 w2 scale (GMM2's dequant widens it unchanged)."""
    return ref.expert_chain(xq, xs, counts, wt, requant=dequant_swiglu_block_quant)


def reference_fused_layer(x: Sequence[np.ndarray], ids: Sequence[np.ndarray],
                          weights: Sequence[np.ndarray], experts: Sequence[ExpertWeights],
                          L: int) -> Layer[ref.RankStages]:
    """The fused layer over all ranks (reference.reference_layer's arguments; experts in
    the un-permuted order with fp32 w2 scales)."""
    return ref.reference_layer(x, ids, weights, experts, L, chain=fused_expert_chain)
