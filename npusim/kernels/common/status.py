"""The MC2 status MiB: where dispatch and combine keep their flags, counts and state words.

The offsets inside it are the constants of ops-transformer's MoE kernels
(``moe_distribute_v2_constant.h``, ``moe_distribute_dispatch_v2_full_mesh.h``) and of the
CANN sample (``moe_distribute_comm.h``), which agree. Where the MiB starts differs: the
MC2 V3 context puts it at the CCL buffer's base, the sample at 1022 MiB of its 1 GiB window;
:class:`StatusLayout` takes that base, and every window layout asks it for offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB

STATE_SIZE = 1 * MiB
"""The status region."""
STATE_OFFSET = 32
"""One status entry or flag (UB_ALIGN bytes)."""
WIN_STATE_OFFSET = 384 * KiB
"""Dispatch status (and combine flags) of data state 1 follow those of state 0 at this step."""
COMBINE_STATE_OFFSET = 64 * KiB
"""Combine's per-(token, k) flags."""
FLAG_FIELD_OFFSET = 768 * KiB
"""The per-core 0/1 data-state word dispatch flips each call (DISPATCH_STATE_WIN_OFFSET)."""
COMBINE_STATE_WIN_OFFSET = 818 * KiB
"""Combine's per-core state word."""
CUMSUM_CAL_OFFSET = 868 * KiB
"""The count cores' partial sums, one row per writer."""
CUMSUM_FLAG_OFFSET = 876 * KiB
"""The count cores' "prefix table ready" flags, one row per core."""
WIN_ADDR_ALIGN = 512
"""Window slots and two cores' state words are this far apart."""
SPLIT_BLOCK_SIZE = 512
"""A flagged data block: SPLIT_BLOCK_DATA_SIZE bytes of data, then a 32 B float 1.0 flag."""
SPLIT_BLOCK_DATA_SIZE = 480
CUMSUM_MAX_CORE_NUM = 16
"""Count cores at most (A3; the 950's fullmesh_v2 uses 8)."""


@dataclass(frozen=True)
class StatusLayout:
    """Offsets (from the window base) of the status entries of one window.

    ``base`` is where the status MiB starts; ``W`` ranks; ``slots_per_token`` = K + S
    combine flags per token. The count-core tables take ``n_cs``, the count cores of the
    rank (the MC2 kernels size it per rank)."""

    base: int
    W: int
    slots_per_token: int

    def dispatch_status(self, state: int, entry: int) -> int:
        """32 B (fp32 1.0 flag, int32 count) of status entry ``entry`` = local expert * W +
        source rank (the source rank alone on a shared rank)."""
        return self.base + state * WIN_STATE_OFFSET + entry * STATE_OFFSET

    def combine_flag(self, state: int, token: int, k: int) -> int:
        """32 B flag of the received (token, k) row; k in [0, K + S)."""
        return (self.base + COMBINE_STATE_OFFSET + state * WIN_STATE_OFFSET
                + (token * self.slots_per_token + k) * STATE_OFFSET)

    def dispatch_state_word(self, core: int) -> int:
        return self.base + FLAG_FIELD_OFFSET + core * WIN_ADDR_ALIGN

    def combine_state_word(self, core: int) -> int:
        return self.base + COMBINE_STATE_WIN_OFFSET + core * WIN_ADDR_ALIGN

    def cumsum_cal(self, n_cs: int, writer: int, reader: int = 0) -> int:
        """32 B (partial sum, fp32 1.0) count core ``writer`` leaves for count core
        ``reader``: row ``writer`` of an n_cs x n_cs table."""
        return self.base + CUMSUM_CAL_OFFSET + (writer * n_cs + reader) * STATE_OFFSET

    def cumsum_flag(self, n_cs: int, core: int, cumsum_core: int = 0) -> int:
        """32 B ready flag count core ``cumsum_core`` raises for ``core``: row ``core``."""
        return self.base + CUMSUM_FLAG_OFFSET + (core * n_cs + cumsum_core) * STATE_OFFSET

    # ---- [start, end) zones for the window sanitiser
    def dispatch_status_zone(self, state: int, entries: int) -> tuple[int, int]:
        a = self.dispatch_status(state, 0)
        return a, a + entries * STATE_OFFSET

    def combine_flags_zone(self, state: int, tokens: int) -> tuple[int, int]:
        a = self.combine_flag(state, 0, 0)
        return a, a + tokens * self.slots_per_token * STATE_OFFSET

    def dispatch_state_words_zone(self, cores: int) -> tuple[int, int]:
        a = self.dispatch_state_word(0)
        return a, a + cores * WIN_ADDR_ALIGN

    def combine_state_words_zone(self, cores: int) -> tuple[int, int]:
        a = self.combine_state_word(0)
        return a, a + cores * WIN_ADDR_ALIGN

    def cumsum_cal_zone(self, n_cs: int) -> tuple[int, int]:
        a = self.cumsum_cal(n_cs, 0)
        return a, a + n_cs * n_cs * STATE_OFFSET

    def cumsum_flag_zone(self, n_cs: int, cores: int) -> tuple[int, int]:
        a = self.cumsum_flag(n_cs, 0)
        return a, a + cores * n_cs * STATE_OFFSET
