"""Which GEMM blocks an AIC of FusedDeepMoe runs, and in what order.

Both grouped GEMMs hand blocks out the same way (sgl-kernel-npu GMM1K:580-627 for GMM1,
GMM2K:241-268 for GMM2's AIVs, the AIC the same): per local expert (group) in order, the
group's ceil(m / tileM) x ceil(n / tileN) blocks are numbered by catlass
GemmIdentityBlockSwizzle<3, 0> (catlass act/gemm/block/block_swizzle.hpp:69-86, direction
0, "Zn"); core c takes numbers (c - start) mod cores, then every `cores`-th; `start`
moves on by the group's block count, so the next group begins where this one ended.

Why not moe_layer/gmm.py's `blocks_of`: that is GroupedMatmul's GMMProcess walk (row-major
blocks); and not mega_moe's `swizzle`: that is direction 1 ("Nz"), bands of N tiles.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from npusim.units import ceil_div

SWIZZLE_OFFSET = 3  # GMM1_SWIZZLE_OFFSET = GMM2_SWIZZLE_OFFSET (fused_deep_moe_tiling.h)


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


Block = tuple[int, int, int, int, int, int]  # (group, first row, rows, first col, cols, nth)


def group_blocks(g: int, m: int, before: int, start: int, nth: int, tile_m: int,
                 tile_n: int, n: int, cores: int, core: int) -> Iterator[Block]:
    """One group's blocks for core `core` (the kernels learn a group's rows only when its
    tokens are in): `before` rows of earlier groups, `start` the core that takes the
    group's first block, `nth` the core's blocks so far."""
    n_loops = ceil_div(n, tile_n)
    m_loops = ceil_div(m, tile_m)
    first = core + cores - start if core < start else core - start
    for task in range(first, m_loops * n_loops, cores):
        mi, ni = block_coord(task, m_loops, n_loops)
        yield (g, before + mi * tile_m, min(tile_m, m - mi * tile_m), ni * tile_n,
               min(tile_n, n - ni * tile_n), nth)
        nth += 1


def next_start(start: int, m: int, tile_m: int, tile_n: int, n: int, cores: int) -> int:
    """startCoreIdx after a group of m rows: moved on by its block count."""
    return (start + ceil_div(m, tile_m) * ceil_div(n, tile_n)) % cores


def core_blocks(counts: Sequence[int], tile_m: int, tile_n: int, n: int, cores: int,
                core: int) -> Iterator[Block]:
    """The blocks core `core` runs over the groups' row counts, in order: (group, the
    block's first row in the group-concatenated rows, its rows, first column, columns,
    and its position in the core's sequence, which picks the swap-ring stage)."""
    start = before = nth = 0
    for g, m in enumerate(counts):
        for blk in group_blocks(g, m, before, start, nth, tile_m, tile_n, n, cores, core):
            nth += 1
            yield blk
        start = next_start(start, m, tile_m, tile_n, n, cores)
        before += m
