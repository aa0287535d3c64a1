"""FusedDeepMoe's host tiling on the A3 (sgl-kernel-npu csrc/deepep/ops/op_host/
fused_deep_moe_tiling.cpp, "tiling.cpp" below; the kernel's tile constants in
op_kernel/fused_deep_moe_tiling.h, "tiling.h") and the shapes it refuses.

Why a separate module: the fused kernel's limits are its own host checks (CheckData and
the attribute checks, compiled in by ``#define ENABLE_TILING_CHECK``, tiling.cpp:14, and
the HCCL window check that always runs), not those of the low-latency kernels the unfused
chain runs; a refusal names the key, the limit and the line that sets it.

Sizes, all per rank on a MoE rank (shared-expert ranks are refused):

- capacity M = maxBs * W * min(K, L) rows (fused_deep_moe.h:319-325, tiling.cpp:279-283),
  maxBs = globalBs / W;
- the window's data area: two halves of W * L slots of maxBs * H * 2 B (one slot per
  (source rank, local expert), expertPerSizeOnWin), a dispatched token a record of H + 512 B
  in it (int8 row, fp32 scale at byte H, flag word at H + 4); the host asks
  W * maxBs * L * H * 2 * 2 <= HCCL_BUFFSIZE MB (tiling.cpp:343-359);
- GMM1 blocks of 256 x 128 (L1 K 512, L0 K 128), GMM2 blocks of 128 x 256 (tiling.h:40-58);
- the requant's rows per step: min(8, 16384 / (N1 / 2)) (CalQuantRow).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npusim.kernels.family import Misfit
from npusim.kernels.moe_layer.fused_deep_moe_base.sizes import FusedSizes
from npusim.kernels.moe_layer.fused_deep_moe_base.window import TOKEN_EXTRA_SPACE
from npusim.units import MiB, ceil_div
from npusim.workload.shape import MoeShape

SRC = "fused_deep_moe_tiling.cpp"
MIN_BATCH_SIZE, MAX_BATCH_SIZE = 1, 256  # tiling.cpp:77-78
MAX_MOE_EXPERT_NUM = 512  # tiling.cpp:79 (MAX_MOE_EXERT_NUM)
SUPPORT_TOP_K = 12  # tiling.cpp:80
MIN_TOKEN_LENGTH, MAX_TOKEN_LENGTH = 512, 7168  # tiling.cpp:82-83
MIN_GMM1_HIDDEN, MAX_GMM1_HIDDEN = 1024, 6144  # tiling.cpp:84-85
DEFAULT_HCCL_BUFFSIZE_MB = 200  # tiling.cpp:33 (GetMaxWindowSize)
DOUBLE_BUFFER = 2  # tiling.cpp:350: the window's two data halves
GMM_TILE_N_DIM = 64  # test_fused_deep_moe.py:16: gate (then up) columns per GMM1 N tile

GMM1_L1M, GMM1_L1N, GMM1_L1K, GMM1_L0K = 256, 128, 512, 128  # tiling.h:40-43
GMM1_EPIM = 64  # tiling.h:44: rows of one dequant-SwiGLU epilogue tile
GMM2_L1M, GMM2_L1N, GMM2_L1K, GMM2_L0K = 128, 256, 512, 128  # tiling.h:52-55
GMM2_EPIM = 32  # tiling.h:56
WORKSPACE_STAGES = 4  # tiling.h:60: the AIC -> AIV swap ring's stages
MAX_QUANT_ROW_ONCE = 8  # GMM1K:31
QUANT_UB_ELEMENTS = 16384  # CalQuantRow's budget (GMM1K:32, 354-358)


@dataclass(frozen=True)
class FusedTiling(FusedSizes):
    """One rank's FusedDeepMoe launch on a MoE rank: the shape, GMM1's columns (N1 =
    gmm1HLen = 2I) and the AIC count (block dim); capacity, n2 and the window slot as
    both builds size them (FusedSizes)."""

    W: int
    BS: int
    max_bs: int  # globalBs / W
    H: int
    K: int
    L: int
    n1: int  # gmm1HLen: gate and up columns
    aic: int

    @property
    def record_bytes(self) -> int:
        """hCommuSize: a dispatched token in a window slot (GMM1K:1406-1407)."""
        return self.H + TOKEN_EXTRA_SPACE

    @property
    def window_need_bytes(self) -> int:
        """The host's actualSize: both halves of W * L slots."""
        return self.data_half_bytes * DOUBLE_BUFFER

    @property
    def quant_rows(self) -> int:
        """CalQuantRow: rows one AIV requantises per step."""
        return max(1, min(MAX_QUANT_ROW_ONCE, QUANT_UB_ELEMENTS // self.n2))

    def gmm1_blocks(self, m: int) -> int:
        return ceil_div(m, GMM1_L1M) * ceil_div(self.n1, GMM1_L1N)

    def gmm2_blocks(self, m: int) -> int:
        return ceil_div(m, GMM2_L1M) * ceil_div(self.H, GMM2_L1N)


def least_hccl_buffsize_mb(t: FusedTiling) -> int:
    """The smallest HCCL_BUFFSIZE (MB) the window check accepts."""
    return ceil_div(t.window_need_bytes, MiB)


def fused_tiling(shape: MoeShape, n1: int, aic: int) -> FusedTiling:
    return FusedTiling(shape.W, shape.BS, shape.max_bs, shape.H, shape.K, shape.L, n1, aic)


def fused_misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any
                 ) -> Misfit | None:
    """The first host check the shape fails, in the order FusedDeepMoeTilingFuncImpl
    runs them (the attribute checks at tiling.cpp:331, the window at 343, CheckData at
    362), then the layouts npusim does not model; or None (the chip is the family's
    check: form.chip_misfit)."""
    wd = options.get("weight_dtype", "int8")
    if wd != "int8":
        return Misfit("workload.weight_dtype", f"{wd}: FusedDeepMoe's weights are INT8 "
                      "FRACTAL_NZ (fused_deep_moe.cpp:9-69); allowed: int8")
    n1 = options["intermediate"]
    return _attrs(shape) or _window(shape, options) or _check_data(shape, n1, hardware) \
        or _modelled(shape, n1, hardware)


def _check_data(shape: MoeShape, n1: int, hardware: Any) -> Misfit | None:
    """CheckData (tiling.cpp:153-190); its globalBs % W check (173-182) MoeShape already
    makes for every family."""
    if not MIN_BATCH_SIZE <= shape.BS <= MAX_BATCH_SIZE:
        return Misfit("workload.bs", f"{shape.BS}: batchSize(bs) must be in "
                      f"[{MIN_BATCH_SIZE}, {MAX_BATCH_SIZE}] ({SRC}:77-78, 155-159); "
                      f"allowed: {MIN_BATCH_SIZE}..{MAX_BATCH_SIZE}")
    if not MIN_TOKEN_LENGTH <= shape.H <= MAX_TOKEN_LENGTH:
        return Misfit("workload.h", f"{shape.H}: tokenLength(h) must be in "
                      f"[{MIN_TOKEN_LENGTH}, {MAX_TOKEN_LENGTH}] ({SRC}:82-83, 160-164); "
                      f"allowed: {MIN_TOKEN_LENGTH}..{MAX_TOKEN_LENGTH}")
    if not MIN_GMM1_HIDDEN <= n1 <= MAX_GMM1_HIDDEN:
        return Misfit("workload.intermediate", f"{n1}: gmm1 hidden size (gate + up) must be "
                      f"in [{MIN_GMM1_HIDDEN}, {MAX_GMM1_HIDDEN}] ({SRC}:84-85, 165-169); "
                      f"allowed: {MIN_GMM1_HIDDEN}..{MAX_GMM1_HIDDEN}")
    if shape.K > SUPPORT_TOP_K:
        return Misfit("workload.k", f"{shape.K}: topK(k) must be <= {SUPPORT_TOP_K} "
                      f"({SRC}:80, 170-172); allowed: 1..{SUPPORT_TOP_K}")
    recv = hardware.chip.aiv_cores // 2
    if shape.L > recv:
        return Misfit("workload.experts_per_rank", f"{shape.L}: moeExpertNumPerRank must "
                      f"be <= aivNum / 2 = {recv}, one receive core per local expert at "
                      f"least ({SRC}:183-188); allowed: 2..{recv}")
    return None


def _modelled(shape: MoeShape, n1: int, hardware: Any) -> Misfit | None:
    """What the host accepts but npusim does not run (yet): GMM1 columns the test's
    weight permutation cannot tile, and the shallow-dispatch kernel of one local expert."""
    tile = 2 * GMM_TILE_N_DIM
    if n1 % tile:
        return Misfit("workload.intermediate", f"{n1}: each {GMM1_L1N}-column GMM1 tile "
                      f"holds {GMM_TILE_N_DIM} gate then {GMM_TILE_N_DIM} up columns "
                      "(test_fused_deep_moe.py:16, 75-86 views N as [2, N/128, 64]; "
                      f"fused_deep_moe_tiling.h:41); allowed: multiples of {tile}")
    if shape.L < 2:
        return Misfit("workload.experts_per_rank", f"{shape.L}: one local expert takes "
                      f"tiling key 0, the shallow-dispatch kernel ({SRC}:368-372; "
                      "fused_deep_moe.h:379-399), which is not modelled; allowed: "
                      f"2..{hardware.chip.aiv_cores // 2}")
    return None


def _attrs(shape: MoeShape) -> Misfit | None:
    """The attribute checks (tiling.cpp:218-235) and the Buffer's fixed shared-expert
    attributes (deep_ep.hpp:36 shared_expert_num = 1; deep_ep.cpp:62
    MOE_SHARED_EXPERT_RANK_NUM, 0 by default)."""
    if shape.E > MAX_MOE_EXPERT_NUM:
        return Misfit("workload.experts_per_rank", f"E = {shape.E} MoE experts: "
                      f"moeExpertNum must be <= {MAX_MOE_EXPERT_NUM} ({SRC}:79, 228-230); "
                      f"allowed: W * L <= {MAX_MOE_EXPERT_NUM}")
    if shape.S or shape.S_r:
        return Misfit("workload.shared_experts", f"{shape.S} on {shape.S_r} ranks: the "
                      "Buffer passes sharedExpertNum 1 with no shared-expert ranks by "
                      "default (deep_ep.hpp:36, deep_ep.cpp:62; "
                      f"{SRC}:231); shared-expert ranks are not modelled; allowed: 0")
    return None


def _window(shape: MoeShape, options: Mapping[str, Any]) -> Misfit | None:
    """The HCCL window check (tiling.cpp:343-359), which runs even without
    ENABLE_TILING_CHECK."""
    t = fused_tiling(shape, options["intermediate"], 0)
    mb = options.get("hccl_buffsize", 0) or least_hccl_buffsize_mb(t)
    if t.window_need_bytes > mb * MiB:
        return Misfit("workload.hccl_buffsize", f"{mb}: HCCL_BUFFSIZE is too small: "
                      f"epRankSize * maxBs * moeExpertNumPerRank * tokenLength * 2 * 2 = "
                      f"{t.window_need_bytes} B ({SRC}:343-359); allowed: at least "
                      f"{least_hccl_buffsize_mb(t)}")
    return None
