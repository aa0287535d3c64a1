"""Which GEMM blocks an AIC (or its AIVs) of FusedDeepMoe runs, and in what order.

Both builds' grouped GEMMs hand blocks out the same way: on the A3 GMM1K:580-627 for GMM1,
GMM2K:241-268 for GMM2's AIVs (the AIC the same); on the 950
dispatch_mx_gmm1_swiglu.h:400-476 (AIC) and 1418-1470 (AIV), mx_gmm2_cast_combine.h:177-263
and 376-420. Per local expert (group) in order, the group's ceil(m / tileM) x
ceil(n / tileN) blocks are numbered by catlass GemmIdentityBlockSwizzle<3, 0>
(act/gemm/block/block_swizzle.hpp:69-86, direction 0, "Zn"); core c takes numbers
(c - startCoreIdx) mod cores, then every `cores`-th; startCoreIdx moves on by the group's
block count, so the next group begins where this one ended. Only the tile sizes differ
between the builds (fused_deep_moe_tiling.h:40-58; fused_deep_moe_a5_tiling.h:63-77), so
one walk, `BlockWalk`, serves both.

Why not moe_layer/gmm.py's `blocks_of`: that is GroupedMatmul's GMMProcess walk (row-major
blocks); and not mega_moe's `swizzle`: that is direction 1 ("Nz"), bands of N tiles.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from npusim.units import ceil_div

SWIZZLE_OFFSET = 3  # GMM1_SWIZZLE_OFFSET = GMM2_SWIZZLE_OFFSET (both builds' tiling.h)


def block_coord(index: int, m_loops: int, n_loops: int, offset: int = SWIZZLE_OFFSET
                ) -> tuple[int, int]:
    """GetBlockCoord of direction 0: bands of `offset` M tiles (the last band what is
    left), each walked down its rows for one N column after the other, every other band
    from the last N column back."""
    inner = index % (m_loops * n_loops)
    bands = ceil_div(m_loops, offset)
    band, at = divmod(inner, offset * n_loops)
    rows = offset if band < bands - 1 else m_loops - offset * band
    m = band * offset + at % rows
    n = at // rows
    if band % 2:
        n = n_loops - n - 1
    return m, n


class Block(NamedTuple):
    """One block a core runs: its group, first row over the groups' concatenated rows,
    rows, first column, columns, and its place in the core's sequence (`nth`, which picks
    the A3's swap-ring stage)."""

    group: int
    row: int
    rows: int
    col: int
    cols: int
    nth: int


class BlockWalk:
    """The blocks one core runs, group after group (the kernels learn a group's rows only
    when its tokens are in, so the walk is fed one group at a time)."""

    def __init__(self, n: int, tile_m: int, tile_n: int, cores: int, core: int) -> None:
        self.n, self.tile_m, self.tile_n = n, tile_m, tile_n
        self.cores, self.core = cores, core
        self.start = self.before = self.group = self.nth = 0

    def next(self, m: int) -> list[Block]:
        """The core's blocks of the next group, of m rows."""
        tm, tn = self.tile_m, self.tile_n
        m_loops, n_loops = ceil_div(m, tm), ceil_div(self.n, tn)
        loops = m_loops * n_loops
        c, start = self.core, self.start
        first = c + self.cores - start if c < start else c - start
        out = []
        for task in range(first, loops, self.cores):
            mi, ni = block_coord(task, m_loops, n_loops)
            out.append(Block(self.group, self.before + mi * tm, min(tm, m - mi * tm),
                             ni * tn, min(tn, self.n - ni * tn), self.nth + len(out)))
        self.start = (start + loops) % self.cores
        self.before += m
        self.group += 1
        self.nth += len(out)
        return out


def core_blocks(counts: Sequence[int], tile_m: int, tile_n: int, n: int, cores: int,
                core: int) -> Iterator[Block]:
    """The blocks core `core` runs over the groups' row counts, in order."""
    walk = BlockWalk(n, tile_m, tile_n, cores, core)
    for m in counts:
        yield from walk.next(m)
