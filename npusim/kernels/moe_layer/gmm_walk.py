"""Which blocks of a GroupedMatmul call each AIC takes, and in which order (ops-transformer
gmm/grouped_matmul/op_kernel/grouped_matmul.h, master):

- GMMProcess::Process (285-318): per group with rows, blockDimM = ceil(m / singleM) by
  blockDimN = ceil(n / singleN) blocks; AIC c takes the group's block numbers c, c + coreNum,
  ... counted on from `count`, where the previous group's blocks ended (count = curCount mod
  coreNum, so the cores that were idle at the end of one group start the next);
- MNBlockIdxCompute (90-108) turns a block number into (mIdx, nIdx): row-major while
  blockDimM <= thresholdDimM (5 on the A3: 23-31); beyond it a diagonal walk over bands of
  thresholdBlockNum (8) block rows, so that the cores running at the same time read
  different rows of x and different columns of the weight;
- a block is singleM x singleN (SetMNConfig 186-201): singleM = baseM; singleN = baseN
  unless the host set gmmBaseParams.singleN (GMM2's per-token strategy, tiling.py), when the
  Matmul API's Iterate runs the block's baseN tiles one after another
  (grouped_matmul_quant_mixcore.h MMCompute 176-215, VectorCompute 218-245): a tile is the
  unit of the FixPipe, the workspace ring and the AIVs' dequant.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import lcm

from npusim.kernels.moe_layer.tiling import GmmTiling
from npusim.units import ceil_div

THRESHOLD_BLOCK_NUM = 8  # grouped_matmul.h:23
THRESHOLD_DIM_M = 5  # grouped_matmul.h:29 (__CCE_AICORE__ 220, the A3)

Block = tuple[int, int, int, int, int]  # (group, first row, rows, first column, columns)


def _align_down(a: int, base: int) -> int:
    return a if base == 0 else a // base * base  # grouped_matmul_utils.h AlignDown


def mn_block_idx(rel: int, dim_m: int, dim_n: int) -> tuple[int, int]:
    """MNBlockIdxCompute: (mIdx, nIdx) of the group's block number `rel` (curBlock - count)."""
    if dim_m <= THRESHOLD_DIM_M:
        return divmod(rel, dim_n)
    band = THRESHOLD_BLOCK_NUM * dim_n  # thresholdM_dimN
    cur_m = (dim_m % THRESHOLD_BLOCK_NUM
             if rel >= _align_down(dim_m * dim_n, band) else THRESHOLD_BLOCK_NUM)
    cur_mn = cur_m * THRESHOLD_BLOCK_NUM
    cur_n = (dim_n % THRESHOLD_BLOCK_NUM
             if rel % band >= _align_down(cur_m * dim_n, cur_mn) else THRESHOLD_BLOCK_NUM)
    local = rel % band % cur_mn
    m_idx = local % cur_m + rel // band * THRESHOLD_BLOCK_NUM
    n_idx = ((local + local // lcm(cur_m, cur_n)) % cur_n
             + rel % band // cur_mn * THRESHOLD_BLOCK_NUM)
    return m_idx, n_idx


def blocks_of(t: GmmTiling, counts: list[int], core: int) -> Iterator[Block]:
    """The base tiles GMMProcess::Process hands core `core`, in its order."""
    single_n = t.single_n or t.base_n
    count = before = 0
    for g, m in enumerate(counts):
        if m > 0:
            dim_m, dim_n = ceil_div(m, t.base_m), ceil_div(t.n, single_n)
            cur = count + dim_m * dim_n
            blk = core if core >= count else core + t.cores
            while blk < cur:
                mi, ni = mn_block_idx(blk - count, dim_m, dim_n)
                rows = min(t.base_m, m - mi * t.base_m)
                end = min(t.n, (ni + 1) * single_n)
                for n0 in range(ni * single_n, end, t.base_n):
                    yield (g, before + mi * t.base_m, rows, n0, min(t.base_n, end - n0))
                blk += t.cores
            count = cur % t.cores
        before += m
