"""The host tilings of the 950 chain's expert kernels, computed as the operators' tiling
code computes them from the preset's buffer sizes.

GroupedMatmul, MX fp8 x fp8 -> bf16 (ops-transformer gmm/grouped_matmul/op_host/op_tiling/
arch35/grouped_quant_matmul_tiling.cpp, GroupedQbmmTiling; MX_PERGROUP_MODE):
- SetKernelType (650-658): MX keeps kernelType 0, the AIC-only GmmASWKernel
  (op_kernel/arch35/quant_adaptive_sliding_window_templates/gqmm_cube_on_the_fly.h);
- CalBasicBlock (729-763): baseM = min(M, 256) aligned to 16, baseN = min(N, 256) aligned
  to L1_ALIGN_SIZE 32 B (ND weights, transB false), baseK = min(128 B, K) aligned to 32
  then to MXFP_BASEK_FACTOR 64;
- CalL1Tiling / CalL1Depth / GetDepthA1B1 / CalStepKs (771-906): the L1 depths and
  stepKa / stepKb from the L1 size, the MX scale bytes per base block counted in;
- DoLibApiTiling / PostTiling (610-648, 704): usedCoreNum = blockDim = every AIC.

SwiGlu (ops-nn activation/swi_glu/op_host/swi_glu_tiling.cpp, GluSingleTilingCalculator):
rowLen = A, colLen = I; maxTileLen = UB / (2 x 3 x 2 B + 2 x 4 B) elements (bf16, double
buffered), base shapes searched from the widest column slice down in 512 B steps, the best
by cores used, then fewest tiles, then largest tile (SaveOptBaseShape).

DynamicMxQuant, last axis, block 32 (ops-nn quant/dynamic_mx_quant/op_host/arch35/
dynamic_mx_quant_tail_axis_tiling_arch35.cpp): slices of 512 columns (256 when the rows
would leave a quarter of the AIVs idle), a grid of rowTileNum x colTileNum cores chosen by
the least imbalance (AutoTiling), maxUbBlockNum 32-element blocks per UB pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil, sqrt
from operator import attrgetter
from typing import Any

from npusim.units import KiB, align_up, ceil_div

BASIC_BLOCK = 256  # GmmConstant::BASIC_BLOCK_SIZE_256
BASIC_K_BYTES = 128  # GmmConstant::BASIC_BLOCK_SIZE_128
CUBE_BLOCK = 16
L1_ALIGN_SIZE = 32
CUBE_REDUCE_BLOCK = 32
MXFP_BASEK_FACTOR = 64
MX_GROUP_SIZE = 32
MTE2_MIN_LOAD_SIZE = 64 * KiB  # MTE2_MIN_LOAD_SIZE_V120
DB_SIZE = 2
WINDOW_LEN = 4  # QuantASWBlockSch: rows of base blocks walked together
INNER_AXIS_MIN_SPLIT_VAL = 128  # quant_utils.h: the least N split of the tail blocks

SWIGLU_TQUE_NUM = 3  # XXGLU_TQUE_NUM
SWIGLU_TBUF_NUM_BF16 = 2
SWIGLU_CACHE_LINE = 512
SWIGLU_MAX_BLOCK_LEN = 65535
SWIGLU_MAX_BLOCK_COUNT = 4095

MXQ_SLICE_256 = 256
MXQ_SLICE_512 = 512
MXQ_LOAD_BALANCE = 0.75
MXQ_RESERVED_UB = 2 * KiB


def align_down(x: int, a: int) -> int:
    """AlignDown as the SwiGlu tiling has it: 0 below one unit."""
    return x // a * a


@dataclass(frozen=True)
class MxGmmTiling:
    """One GroupedMatmul call: x [rows, k] fp8 with E8M0 scales per 32 of k, weight
    [groups, k, n] fp8 with E8M0 scales per 32 of k, y [rows, n] bf16."""

    groups: int
    rows: int  # M: x's rows (the dispatch's capacity A)
    k: int
    n: int
    cores: int  # usedCoreNum: every AIC
    base_m: int
    base_n: int
    base_k: int
    depth_a1: int
    depth_b1: int
    step_ka: int
    step_kb: int


def _depth(left: int, per_depth: int, init: int, base_k_bytes: int) -> int:
    """GetDepthA1B1."""
    if init > 1 and per_depth > DB_SIZE * MTE2_MIN_LOAD_SIZE:
        return init
    if init > 1:
        scale = left // per_depth
        while (scale * base_k_bytes) % 512 and scale * base_k_bytes > 512:
            scale -= 1
        if (scale * base_k_bytes) % 512 and scale * base_k_bytes >= BASIC_BLOCK:
            scale = BASIC_BLOCK // base_k_bytes
        return init * max(scale, 1)
    scale = 1
    while scale * per_depth < left:
        scale *= 2
    return init * (scale if scale == 1 else scale // 2)


def mx_gmm_tiling(aic: Any, rows: int, k: int, n: int, groups: int) -> MxGmmTiling:
    base_m = align_up(min(rows, BASIC_BLOCK), CUBE_BLOCK)
    base_n = align_up(min(n, BASIC_BLOCK), L1_ALIGN_SIZE)
    base_k = align_up(align_up(min(BASIC_K_BYTES, k), CUBE_REDUCE_BLOCK), MXFP_BASEK_FACTOR)
    size_a, size_b = base_m * base_k, base_n * base_k
    scale_k = align_up(ceil_div(base_k, MX_GROUP_SIZE), 2)
    scale_a, scale_b = scale_k * base_m, scale_k * base_n
    left = int(aic.l1_bytes)
    base_l1 = size_a + size_b + scale_a + scale_b
    init = _depth(left, base_l1, 1, base_k)
    rest = left - init * base_l1
    dep_a = _depth(rest, (size_a + scale_a) * init, init, base_k)
    dep_b = _depth(rest, (size_b + scale_b) * init, init, base_k)
    da = db = max(dep_a, dep_b)
    if da * base_l1 > rest:
        da = dep_a if dep_a >= dep_b else init
        db = dep_b if dep_a < dep_b else init
    ska = 1 if da == 1 else da // DB_SIZE
    skb = 1 if db == 1 else db // DB_SIZE
    if ska * base_k > k:
        ska = ceil_div(k, base_k)
    if skb * base_k >= k:
        skb = ceil_div(k, base_k)
    if ska >= skb and ska * base_k < k:
        ska = ska // skb * skb
    if skb > ska and skb * base_k < k:
        skb = skb // ska * ska
    return MxGmmTiling(groups, rows, k, n, int(aic.cores), base_m, base_n, base_k,
                       ska * DB_SIZE, skb * DB_SIZE, ska, skb)


Block = tuple[int, int, int, int, int]  # (group, first row, rows, first column, columns)


def mx_blocks(t: MxGmmTiling, counts: list[int], core: int) -> list[Block]:
    """The blocks GmmASWKernel::Process gives AIC `core`, in its order (QuantASWBlockSch):
    a group's blocks are numbered on from the core after the one that ended the previous
    group; index -> (mIndex, nIndex) walks WINDOW_LEN block rows at a time, column-major
    within the window, every other window's columns reversed; the last group's last round
    splits its blocks over the idle cores when at least half are idle (CalcTailTile)."""
    out: list[Block] = []
    cores, end = t.cores, t.cores - 1
    before = 0
    last = len(counts) - 1
    for g, m in enumerate(counts):
        if m <= 0:
            before += max(m, 0)
            continue
        m_cnt, n_cnt = ceil_div(m, t.base_m), ceil_div(t.n, t.base_n)
        total = m_cnt * n_cnt
        m_tail, n_tail = m - (m_cnt - 1) * t.base_m, t.n - (n_cnt - 1) * t.base_n
        m_core = min(WINDOW_LEN, m_cnt)
        main_row = m_cnt // m_core - 1
        m_tail_core = m_cnt - m_core * main_row
        rounds = ceil_div(total, cores)
        start = 0 if end == cores - 1 else end + 1
        end = (total + start - 1) % cores
        idle = (end < core < start) if start > end else (core > end or core < start)
        if idle:
            rounds -= 1
        mt = nt = 1
        if g == last and end + 1 <= cores // 2:
            spare = cores // (end + 1)
            if spare > 1:
                mt = min(ceil_div(m_tail, CUBE_BLOCK), spare)
                nt = min(ceil_div(n_tail, INNER_AXIS_MIN_SPLIT_VAL), spare)
                while mt * nt > spare:
                    if mt >= nt:
                        mt -= 1
                    else:
                        nt -= 1
                new_end = mt * nt * (end + 1) - 1
                if end < core <= new_end:
                    rounds += 1
                end = new_end
        for r in range(rounds):
            last_round = g == last and r == rounds - 1 and core <= end
            idx = (core // (mt * nt) if last_round else core) + r * cores
            idx = idx + cores - start if core < start else idx - start
            idx %= 1 << 64  # uint64 index: past a split tail it wraps, as the kernel's does
            row = idx // n_cnt // m_core
            if row < main_row:
                mi = row * m_core + idx % m_core
                ni = (idx // m_core) % n_cnt
            else:
                row = main_row
                tail = idx - main_row * m_core * n_cnt
                mi = main_row * m_core + tail % m_tail_core
                ni = (tail // m_tail_core) % n_cnt
            if row & 1:
                ni = n_cnt - 1 - ni
            rows = t.base_m if mi != m_cnt - 1 else m_tail
            cols = t.base_n if ni != n_cnt - 1 else n_tail
            r0, c0 = mi * t.base_m, ni * t.base_n
            if last_round and (mt > 1 or nt > 1):
                split_m, split_n = ceil_div(rows, mt), align_up(ceil_div(cols, nt),
                                                                INNER_AXIS_MIN_SPLIT_VAL)
                j = core % (mt * nt)
                dm, dn = (j % mt) * split_m, (j // mt) * split_n
                if dm >= rows or dn >= cols:
                    continue
                rows = rows - split_m * (j % mt) if dm + split_m > rows else split_m
                cols = cols - split_n * (j // mt) if dn + split_n > cols else split_n
                r0, c0 = r0 + dm, c0 + dn
            if rows > 0 and cols > 0:
                out.append((g, before + r0, rows, c0, cols))
        before += m
    return out


@dataclass(frozen=True)
class SwigluTiling:
    rows: int  # rowLen (A)
    cols: int  # colLen (I): the output's columns
    base_rows: int
    base_cols: int
    cores: int
    double_buffer: bool

    @property
    def tiles(self) -> int:
        return ceil_div(self.rows, self.base_rows) * ceil_div(self.cols, self.base_cols)


def _swiglu_search(rows: int, cols: int, ub: int, aiv: int, buffers: int
                   ) -> tuple[int, int, int, int] | None:
    """CalcOptTiling for bf16 with `buffers` queues deep: (baseRow, baseCol, cores, tiles)."""
    block, line = 16, SWIGLU_CACHE_LINE // 2
    max_tile = align_down(ub // (buffers * SWIGLU_TQUE_NUM * 2 + SWIGLU_TBUF_NUM_BF16 * 4),
                          block)
    aligned = cols % block == 0
    col = min(cols, max_tile, SWIGLU_MAX_BLOCK_LEN if aligned else SWIGLU_MAX_BLOCK_LEN // 2)
    if cols > col > line:
        col = align_down(col, line)
    row_top = min(rows, SWIGLU_MAX_BLOCK_COUNT)

    def single(c: int) -> bool:
        gap = cols * 2 - c
        return gap > 65535 * block if aligned else gap * 2 > 65535

    best: tuple[int, int, int, int, int, int] | None = None  # (cores, -tiles, size, base, r, c)

    def save(r: int, c: int) -> None:
        nonlocal best
        tiles = ceil_div(rows, r) * ceil_div(cols, c)
        key = (min(tiles, aiv), -tiles, r * c, (rows // r) * (cols // c), r, c)
        if best is None or key[:4] > best[:4]:
            best = key
    if single(col):
        save(1, col)
    else:
        while True:
            r = min(max_tile // align_up(col, block), row_top)
            if r < 1 or (r > 1 and single(col)):
                break
            if not (r > 1 and single(cols % col)):
                save(r, col)
            if col <= line or r >= row_top:
                break
            col = col - line if col % line == 0 else align_down(col, line)
    if best is None:
        return None
    return best[4], best[5], best[0], -best[1]


def swiglu_tiling(ub_bytes: int, aiv: int, rows: int, cols: int) -> SwigluTiling | None:
    db = _swiglu_search(rows, cols, ub_bytes, aiv, 2)
    if db is None:
        return None
    r, c, cores, tiles = db
    double = True
    if ceil_div(tiles, cores) == 2:
        nodb = _swiglu_search(rows, cols, ub_bytes, aiv, 1)
        if nodb is not None and ceil_div(nodb[3], nodb[2]) == 1 and nodb[2] >= cores:
            r, c, cores, tiles = nodb
            double = False
    return SwigluTiling(rows, cols, r, c, cores, double)


@dataclass(frozen=True)
class MxQuantTiling:
    rows: int
    cols: int
    row_tiles: int  # rowTileNum
    col_tiles: int  # colTileNum
    row_block: int  # rowNormalBlockNum: rows of a core (the last: rowTailLen)
    col_block: int  # columns of a core (colNormalBlockNum x 256; the last: colTailLen)
    ub_blocks: int  # maxUbBlockNum: 32-element blocks per UB pass

    @property
    def cores(self) -> int:
        return self.row_tiles * self.col_tiles


def mx_quant_tiling(ub_bytes: int, aiv: int, rows: int, cols: int) -> MxQuantTiling:
    slice_ = MXQ_SLICE_512
    if rows * ceil_div(cols, slice_) <= aiv * MXQ_LOAD_BALANCE:
        slice_ = MXQ_SLICE_256
    row_loops, col_loops = rows, ceil_div(cols, slice_)
    used = max(min(aiv, row_loops * col_loops), 1)
    combos = set()
    for m in range(1, ceil(sqrt(used) + 1)):
        combos |= {m, used // m}
    best = None
    for m in sorted(combos):
        if m > row_loops:
            continue
        n = max(used // m, 1)
        if n > col_loops:
            continue
        rn, cn = ceil_div(row_loops, m), ceil_div(col_loops, n)
        delta = rn * cn
        if m * n == used:
            if row_loops % m == 0 and col_loops % n == 0:
                delta = 0
            elif row_loops % m == 0:
                delta -= rn * (col_loops % cn)
            elif col_loops % n == 0:
                delta -= (row_loops % rn) * cn
            else:
                delta -= (row_loops % rn) * (col_loops % cn)
        key = (delta, n)
        if best is None or key < best[0]:
            best = (key, m, n)
    _, m, n = best if best is not None else ((0, 1), 1, 1)
    rn, cn = ceil_div(row_loops, m), ceil_div(col_loops, n)
    m, n = ceil_div(row_loops, rn), ceil_div(col_loops, cn)
    per = MXQ_SLICE_256 * (2 * 2 + 2) + 8 * 2 * (2 + 1 + 2)
    ub_blocks = (ub_bytes - MXQ_RESERVED_UB) // per * 8
    return MxQuantTiling(rows, cols, m, n, rn, cn * slice_, ub_blocks)


@dataclass(frozen=True)
class A5LayerTiling:
    """The 950 chain: mc2's V2 tiling (`mc2`, which the dispatch and the combine run on),
    the FP8 format, GMM1's columns (2I) and the expert kernels' tilings; `chain` keeps
    dispatch's outputs for the kernels after it (op_inputs)."""

    mc2: Any
    mode: str  # e4m3 or e5m2
    intermediate: int
    gmm1: MxGmmTiling
    gmm2: MxGmmTiling
    swiglu: SwigluTiling
    quant: MxQuantTiling
    timing_only: bool
    chain: dict[str, Any] = field(default_factory=dict, compare=False)

    world, L, H = (property(attrgetter(f"mc2.{n}")) for n in ("W", "L", "H"))
    rows = property(lambda self: self.mc2.shape.rows_capacity)  # rows(rank): A
