"""GroupedMatmul's block walk (MNBlockIdxCompute), the per-token strategy the NZ weights
select (SetWorkspscesPerTokenQuant) and what an NZ weight tile's load costs, each against
figures worked out by hand from the ops-transformer sources."""

from __future__ import annotations

import pytest

from npusim.hw.config import load_hardware
from npusim.kernels.moe_layer import tiling as tl
from npusim.kernels.moe_layer.gmm_walk import blocks_of, mn_block_idx
from npusim.runtime.transfer import Strided


def _tiling(n: int, cores: int, single_n: int = 0) -> tl.GmmTiling:
    return tl.GmmTiling(rows=112, k=256, n=n, groups=2, base_m=16, base_n=256, base_k=128,
                        step_ka=1, step_kb=1, cores=cores, vec_rows=24, single_n=single_n)


def test_row_major_up_to_five_block_rows():
    assert [mn_block_idx(r, 5, 3) for r in range(15)] == [divmod(r, 3) for r in range(15)]


def test_diagonal_walk_of_six_block_rows_by_hand():
    # 6 x 3 blocks, one band of 8 x 3 = 24: AlignDown(18, 24) = 0, so curThresholdM = 6 % 8
    # = 6 and curThresholdN = 3 % 8 = 3; lcm(6, 3) = 6: m = r % 6, n = (r + r // 6) % 3
    want = [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2),
            (0, 1), (1, 2), (2, 0), (3, 1), (4, 2), (5, 0),
            (0, 2), (1, 0), (2, 1), (3, 2), (4, 0), (5, 1)]
    assert [mn_block_idx(r, 6, 3) for r in range(18)] == want


def test_walk_of_ten_block_rows_in_two_bands_by_hand():
    # 10 x 3: blocks 0..23 are the first band (8 rows, lcm(8, 3) = 24: m = r % 8, n = r % 3);
    # blocks 24..29 the last 2 rows (curThresholdM = 10 % 8 = 2, lcm(2, 3) = 6)
    first = [(r % 8, r % 3) for r in range(24)]
    last = [(8, 0), (9, 1), (8, 2), (9, 0), (8, 1), (9, 2)]
    got = [mn_block_idx(r, 10, 3) for r in range(30)]
    assert got == first + last
    assert sorted(got) == [(m, n) for m in range(10) for n in range(3)]


def test_cores_carry_the_count_into_the_diagonal_walk():
    # group 0: 16 rows, 3 blocks (cores 0..2); count = 3 % 4 = 3. Group 1: 96 rows = 6 x 3
    # blocks, curCount 21: core 3 starts at 3 (block 0), core 0 at 0 + 4 (block 1)
    t = _tiling(768, 4)
    core0 = list(blocks_of(t, [16, 96], 0))
    core3 = list(blocks_of(t, [16, 96], 3))
    # group 1's rows start after group 0's 16
    assert core0 == [(0, 0, 16, 0, 256)] + [
        (1, 16 + 16 * m, 16, 256 * n, 256)
        for m, n in [(1, 1), (5, 2), (3, 1), (1, 0), (5, 1)]]
    assert core3 == [(1, 16 + 16 * m, 16, 256 * n, 256)
                     for m, n in [(0, 0), (4, 1), (2, 0), (0, 2), (4, 0)]]
    every = [b for c in range(4) for b in blocks_of(t, [16, 96], c)]
    assert len(every) == len(set(every)) == 3 + 18


def test_a_single_n_block_runs_its_base_tiles_in_turn():
    # singleN 512 over n 768: blockDimN 2; block (0, 0) is the tiles at 0 and 256, block
    # (0, 1) the 256 columns at 512
    t = _tiling(768, 4, single_n=512)
    assert list(blocks_of(t, [16], 0)) == [(0, 0, 16, 0, 256), (0, 0, 16, 256, 256)]
    assert list(blocks_of(t, [16], 1)) == [(0, 0, 16, 512, 256)]
    assert list(blocks_of(t, [16], 2)) == []


@pytest.mark.parametrize(("ep", "bs", "k", "L"), [
    (16, 256, 8, 16), (16, 16, 8, 16), (8, 16, 8, 16), (8, 512, 8, 16), (4, 16, 4, 4)])
def test_scenario_shapes_take_the_basic_strategy(ep, bs, k, L):
    # maxM_ is x's rows, the dispatch's capacity bs * EP * min(K, L) (deep_ep.cpp 867-873):
    # 16 * 8 * 8 = 1024 at the sweep's smallest point, above 32 * 16 = 512
    rows = bs * ep * min(k, L)
    assert rows > 32 * L
    assert tl.per_token_single_n(rows, L, 7168, 256, 24) == 0


def test_small_rows_single_n_by_hand():
    # 16 rows over 2 groups (<= 64), NZ: n 1024 is 4 x 2 = 8 tiles, no more than 24 AICs
    assert tl.per_token_single_n(16, 2, 1024, 256, 24) == 256
    # n 7168: 28 x 2 = 56 tiles; n >= 2048 takes 1024
    assert tl.per_token_single_n(16, 2, 7168, 256, 24) == 1024
    # n 1536, 8 groups: 256 leaves 8 * 6 % 24 = 0 on the last round, 1024 leaves 16 (kept),
    # 768 leaves 16 and divides 1536 (kept), 512 leaves 8 * 3 % 24 = 0: taken
    assert tl.per_token_single_n(64, 8, 1536, 256, 24) == 512
    # n 1280, 5 groups: 256 leaves 1; 1024 leaves 10; 768 leaves 10 but does not divide
    # 1280; 512 leaves 15
    assert tl.per_token_single_n(32, 5, 1280, 256, 24) == 512
    assert tl.per_token_single_n(16, 2, 7168, 256, 24, weight_nz=False) == 0
    assert tl.per_token_single_n(16, 2, 1024, 256, 24, transpose_weight=True) == 0


def test_only_gmm2_takes_the_per_token_single_n():
    aic = load_hardware("atlas_a3").aic
    gmm1 = tl.gmm_tiling(aic, 196608, 16, 1024, 512, 2)
    gmm2 = tl.gmm_tiling(aic, 196608, 16, 256, 7168, 2, per_token_quant=True)
    assert (gmm1.single_n, gmm2.single_n) == (0, 1024)


@pytest.mark.parametrize(("k", "n"), [(7168, 4096), (2048, 7168), (2048, 2048), (1024, 2048)])
def test_an_nz_weight_tile_costs_what_the_nd_copy_costs(k, n):
    """The B tile of a step: kk = stepKb x baseK = 512 rows of K, cols = baseN = 256.
    ND: kk blocks of cols bytes, the row gap n - cols. NZ (FRACTAL_NZ of int8 [k, n]:
    n / 32 columns of fractals, each AlignUp(k, 16) rows of 32 B): cols / 32 blocks of
    kk x 32 B, the gap the rest of the fractal column. Either is one MTE2 instruction."""
    burst = load_hardware("atlas_a3").ub.alignment
    assert burst == 32
    kk, cols = 512, 256
    nd = Strided(kk, cols, n - cols)
    nz = Strided(cols // 32, kk * 32, (-(-k // 16) * 16 - kk) * 32)
    assert nd.charged(burst) == nz.charged(burst) == 512 * 256 == 131072
    assert nd.nbytes == nz.nbytes
