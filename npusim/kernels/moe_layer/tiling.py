"""The host tilings of the two expert kernels between dispatch and combine, computed as the
operators' tiling code computes them from the preset's buffer sizes.

GroupedMatmul (ops-transformer gmm/grouped_matmul/op_host/op_tiling/grouped_matmul_tiling.cpp,
A8W8 on ascend910_93, no tuning_config):
- CalMMTiling (1640-1700): baseN = BEST_BASEN 256 (grouped_matmul_host_util.h:38);
  baseK = (l0B / 2) / (baseN * 1 B) rounded to 16; baseM = min((l0A / 2) / baseK,
  l0C / (baseN * 4)), the rows of x when fewer (SixteenAlign up), at most MAX_BASEM 256;
- CalcStepKaKb (1469-1515): L1 less baseN * 8 B of per-channel scale; A takes what is left
  after L1_PARTA_SIZE 256 KiB when baseM <= baseN; stepKa / stepKb = half of each part over
  one base block, the larger a multiple of the smaller; depthA1/B1 = 2 steps (double buffer);
- CalUsedCoreNum (1600-1620): fewer cores than the AIC when the blocks are fewer;
- SetWorkspscesPerTokenQuant (883-905), GMM2's per-token-quant output only: with the weight
  NZ (aclnnGroupedMatmulWeightNz, npu_format_cast 29) and x at most 32 rows per group
  (maxM_, x's rows: the dispatch's whole capacity, not the rows received), singleN =
  FindBestSingleNPertoken (842-868); GMM1's int32 output returns before it (DivideUbAndSet-
  Workspace 808-810) and no tuning config means no DynamicTilingSingleN;
- the per-token-quant AIV epilogue (GMMCalUbSize 1046-1060 and GMMSetUbDivideBlkQuant):
  ubCalSize = (UB - 2 (baseN * 2 B + baseM * 4 B)) / 28, aligned
  down to 2 Ki elements; an AIV dequantises ubCalSize / baseN rows at a time.

DequantSwigluQuant (ops-nn quant/dequant_swiglu_quant/op_host dequant_swiglu_quant_tiling.cpp,
DequantSwigluQuantDskTiling):
- CountMaxDim: 2I at most 2 maxOutDimy, maxOutDimy = (UB - 1024 - 32 - 64 - 4) / 37 aligned
  down to 32; UbFactorDimx rows per UB pass from the UB budget, 16384 / 2I when 2I is 2048
  or 4096 (PERFORMANCE_UB_FACTOR);
- DoOpTiling: cores = min(ceil(rows / UbFactorDimx), PERFORMANCE_CORE_NUM 36, the AIV);
- CountTilingKey (562-581): the cut-group kernel (TILING_KEY_CUT_GROUP) for a 1-D
  group_index of at least CUT_GROUP_LARGE_THAN_32 groups with rows / groups <=
  EACH_GROUP_TOKEN_LESS_THAN 16 (int32 x, no bias, no quant_scale: the chain's call), on
  min(the AIV, rows) cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from npusim.units import KiB, align_up, ceil_div

BEST_BASEN = 256
MAX_BASEM = 256
PER_TOKEN_ROWS_PER_GROUP = 32  # SetWorkspscesPerTokenQuant's factor
PER_TOKEN_MAX_SINGLE_N = 1024
PER_TOKEN_WIDE_N = 2048  # FindBestSingleNPertoken's threshold
L1_PARTA_SIZE = 256 * KiB
SCALE_BYTES_A8W8 = 8  # uint64 per-channel scale kept in L1 (CalcStepKaKb)
UB_DYNAMIC_QUANT_BLOCK_NUM = 28
UB_QUANT_BLOCK_ALIGN = 2 * KiB
PIPELINE_NUM = 4  # grouped_matmul_quant_mixcore.h: workspace stages between AIC and AIV

DSQ_UB_RESERVE = 1024
DSQ_BLOCK = 32
DSQ_PERFORMANCE_CORE_NUM = 36
DSQ_PERFORMANCE_UB_FACTOR = 4096 * 4
DSQ_PERFORMANCE_H = (2048, 4096)
DSQ_CUT_GROUP_GROUPS = 32  # CUT_GROUP_LARGE_THAN_32
DSQ_CUT_GROUP_TOKENS = 16  # EACH_GROUP_TOKEN_LESS_THAN


def sixteen_align(v: int) -> int:
    return align_up(max(v, 1), 16)


@dataclass(frozen=True)
class GmmTiling:
    """One GroupedMatmul call: x [rows, k] int8 by group, weight [L, k, n] int8."""

    rows: int  # x's rows (the dispatch's capacity A)
    k: int
    n: int
    groups: int
    base_m: int
    base_n: int
    base_k: int
    step_ka: int
    step_kb: int
    cores: int  # AIC cores launched (usedCoreNum)
    vec_rows: int  # rows an AIV dequantises per pass (GMM2's epilogue)
    single_n: int = 0  # gmmBaseParams.singleN: a block's columns when set (else baseN)

    @property
    def l0_steps(self) -> int:
        return ceil_div(self.k, self.base_k)


def per_token_single_n(rows: int, groups: int, n: int, base_n: int, aic_cores: int,
                       weight_nz: bool = True, transpose_weight: bool = False) -> int:
    """SetWorkspscesPerTokenQuant's singleN: 0 (the basic strategy) unless x has at most 32
    rows per group and the weight is NZ; then FindBestSingleNPertoken's pick."""
    if not (rows <= PER_TOKEN_ROWS_PER_GROUP * groups and weight_nz
            and (not transpose_weight or n >= PER_TOKEN_WIDE_N)):
        return 0
    if ceil_div(n, base_n) * groups <= aic_cores:
        return base_n
    if n >= PER_TOKEN_WIDE_N:
        return PER_TOKEN_MAX_SINGLE_N
    best = base_n
    best_last = groups * ceil_div(n, best) % aic_cores
    for single in range(PER_TOKEN_MAX_SINGLE_N // base_n * base_n, base_n, -base_n):
        last = groups * ceil_div(n, single) % aic_cores
        if last == 0:
            return single
        if last > best_last or (last == best_last and n % single == 0):
            best, best_last = single, last
    return best


def gmm_tiling(aic: Any, ub_bytes: int, rows: int, k: int, n: int, groups: int,
               per_token_quant: bool = False) -> GmmTiling:
    """`per_token_quant`: the call has a per-token scale and a bf16 output (GMM2); the
    weight is NZ, as every A3 caller of this model passes it."""
    base_n = BEST_BASEN
    base_k = sixteen_align((aic.l0b_bytes // 2) // base_n)
    max_base_m = aic.l0c_bytes // (base_n * 4)
    base_m = min((aic.l0a_bytes // 2) // base_k, max_base_m)
    base_m = sixteen_align(rows) if base_m > rows else base_m // 16 * 16
    base_m = min(base_m, MAX_BASEM)
    avail = aic.l1_bytes - base_n * SCALE_BYTES_A8W8
    l1a = avail - L1_PARTA_SIZE if base_m <= base_n else L1_PARTA_SIZE
    l1b = avail - l1a
    ska = (l1a // 2) // (base_m * base_k)
    skb = (l1b // 2) // (base_n * base_k)
    if ska > skb:
        ska = ska // skb * skb
    elif skb > ska:
        skb = skb // ska * ska
    n_dim = ceil_div(n, base_n)
    m_dim = groups + (rows - groups) // base_m if rows > groups else rows
    cores = int(aic.cores)
    if 0 < m_dim * n_dim < cores:
        cores = m_dim * n_dim
    ub_cal = (ub_bytes - 2 * (base_n * 2 + base_m * 4)) // UB_DYNAMIC_QUANT_BLOCK_NUM
    ub_cal = ub_cal // UB_QUANT_BLOCK_ALIGN * UB_QUANT_BLOCK_ALIGN
    vec_rows = max(1, ub_cal // align_up(base_n, 16))
    single_n = (per_token_single_n(rows, groups, n, base_n, int(aic.cores))
                if per_token_quant else 0)
    return GmmTiling(rows, k, n, groups, base_m, base_n, base_k, max(ska, 1), max(skb, 1),
                     cores, vec_rows, single_n)


def dsq_max_in_dim(ub_bytes: int) -> int:
    """CountMaxDim's bound on 2I (x's columns) for dynamic quant without bias."""
    num = ub_bytes - DSQ_UB_RESERVE - DSQ_BLOCK - 2 * DSQ_BLOCK - 4
    den = 5 * 4 + 2 * 2 * 4 + 1
    return (num // den) // DSQ_BLOCK * DSQ_BLOCK * 2


@dataclass(frozen=True)
class DsqTiling:
    rows: int  # inDimx
    in_dim: int  # 2I
    groups: int
    ub_rows: int  # UbFactorDimx
    cores: int  # maxCoreNum = usedCoreNum
    cut_group: bool = False  # CountTilingKey's TILING_KEY_CUT_GROUP

    @property
    def out_dim(self) -> int:
        return self.in_dim // 2


def dsq_tiling(ub_bytes: int, aiv_cores: int, rows: int, in_dim: int, groups: int
               ) -> DsqTiling:
    out = in_dim // 2
    num = ub_bytes - DSQ_UB_RESERVE - out * 4 - DSQ_BLOCK - 2 * out * 4
    den = 2 * (in_dim + 8) * 4 + out + 4 + in_dim * 4
    ub_rows = min(num // den, rows)
    if in_dim in DSQ_PERFORMANCE_H:
        ub_rows = DSQ_PERFORMANCE_UB_FACTOR // in_dim
    ub_rows = max(ub_rows, 1)
    cores = min(ceil_div(rows, ub_rows), DSQ_PERFORMANCE_CORE_NUM, aiv_cores)
    if dsq_cut_group(rows, groups):
        return DsqTiling(rows, in_dim, groups, ub_rows, max(min(aiv_cores, rows), 1), True)
    return DsqTiling(rows, in_dim, groups, ub_rows, max(cores, 1))


def dsq_cut_group(rows: int, groups: int) -> bool:
    """CountTilingKey's cond2 for the chain's call (a 1-D int64 group_index, int32 x, no
    bias, no quant_scale): whole groups per core when they are many and small."""
    return groups >= DSQ_CUT_GROUP_GROUPS and rows // groups <= DSQ_CUT_GROUP_TOKENS


@dataclass(frozen=True)
class LayerTiling:
    """The whole chain: the low-latency kernels' tiling (`ll`, mc2's), the two expert
    kernels' and OnesLike's; `chain` keeps dispatch's outputs for the kernels after it
    (op_inputs)."""

    ll: Any
    gmm1: GmmTiling
    dsq: DsqTiling
    gmm2: GmmTiling
    intermediate: int  # 2I: GMM1's columns
    timing_only: bool
    ones_like: Any = None  # the timed OnesLike's tiling (ones_like.py)
    chain: dict[str, Any] = field(default_factory=dict, compare=False)

    # the low-latency tiling's sizes under their names (t.H for t.ll.H)
    world, L, H = (property(attrgetter(f"ll.{n}")) for n in ("world", "L", "H"))

    def rows(self, rank: int) -> int:
        return self.ll.shape.rows_capacity(rank)
