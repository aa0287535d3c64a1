"""MixLaunch: a tiling launched on MIX blocks (core_kind mix_aic_1_2).

A MIX launch of block_dim blocks puts one AIC and two AIVs in each block: the launcher
starts block_dim cores, and a vector kernel splits its work over aiv_num = 2 * block_dim
AIVs (GetBlockNum() * GetTaskRation()). The SHMEM article's TileLang and pyPTO kernels and
MegaMoE all launch so; each family says how many blocks it asks for.
"""

from __future__ import annotations


class MixLaunch:
    """The launch sizes of a tiling whose `block_dim` field holds its MIX blocks."""

    block_dim: int

    @property
    def cores(self) -> int:
        """The blocks the launcher starts (one AIC + two AIVs each)."""
        return self.block_dim

    @property
    def aiv_num(self) -> int:
        return 2 * self.block_dim
