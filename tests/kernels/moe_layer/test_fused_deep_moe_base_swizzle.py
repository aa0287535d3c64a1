"""FusedDeepMoe's block walk, both builds' (moe_layer/fused_deep_moe_base/swizzle.py), by hand."""

from __future__ import annotations

import pytest

from npusim.kernels.moe_layer.fused_deep_moe_base.swizzle import block_coord, core_blocks


def test_direction_zero_walks_bands_of_three_m_tiles():
    got = [block_coord(i, 4, 2) for i in range(8)]
    # band 0: rows 0..2 down each column, columns 0 then 1; band 1 (odd): row 3, from
    # the last column back
    assert got == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 1), (3, 0)]


@pytest.mark.parametrize(("m_loops", "n_loops"), [(1, 1), (2, 5), (7, 3), (9, 16)])
def test_every_tile_once(m_loops, n_loops):
    got = {block_coord(i, m_loops, n_loops) for i in range(m_loops * n_loops)}
    assert got == {(m, n) for m in range(m_loops) for n in range(n_loops)}


def test_groups_carry_the_start_core_on():
    # 3 cores; group 0: 300 rows -> 2 x 1 blocks (tasks 0, 1 on cores 0, 1); group 1 starts
    # at core 2: its 1 x 1 block goes to core 2; group 2 (empty) hands out nothing;
    # group 3 starts at core 0 again
    counts = [300, 10, 0, 5]
    per_core = {c: list(core_blocks(counts, 256, 128, 128, 3, c)) for c in range(3)}
    assert per_core[0] == [(0, 0, 256, 0, 128, 0), (3, 310, 5, 0, 128, 1)]
    assert per_core[1] == [(0, 256, 44, 0, 128, 0)]
    assert per_core[2] == [(1, 300, 10, 0, 128, 0)]
