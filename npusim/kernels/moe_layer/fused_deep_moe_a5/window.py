"""FusedDeepMoe A5's memory: a rank's HCCL window and the rank-local status space.

The window (Mc2Kernel GetBaseWindStateAddrByRankId / GetBaseWindAddrByRankId) is held
as one region: first the state area, STATE_SIZE = 1 MiB, two halves of WIN_STATE_OFFSET
= 512 KiB picked by the launch's data state; then the data area, two halves of
W * E_loc slots of maxBs * H * 2 B each (TILING 564's "* 2": the double buffer), every
owner's data shifted by owner * OPT_RANK_OFFSET (G1 298-302, GetWindAddrByRankId).

Within one launch the dispatch and the combine sit in different halves: the dispatch's
AIVs flip the data-state word at STATE_WIN_OFFSET + aivIdx (G1 FlushAndSpinValue, 260)
and read 0, the combine's Init flips it back and reads 1 (cam_moe_distribute_combine.h
226-231). This model runs the first launch of a process: dispatch half 0, combine half 1,
both with state 0 (flag word 1.0f, token flag 0x55555555, vToCFlag 0x03030303).

A half of the state area: status entries of 512 B (STATE_OFFSET) from 0, the
self-state words at SELF_STATE_OFFSET = 256 KiB. Dispatch entry of (expert slot le,
source s) at (s + le * W) * 512: its word 0 the flag (1.0f), word 1 the count
(G1 CalAndSendTokenCount). Combine entry of source s at s * 512 (moeSendNum <= 512).

The status space (Mc2Kernel GetStatusDataSpaceGm) is the rank's own: the group lines
at GROUP_TOKEN_NUM_OFFSET (32 int32 per local expert: receive-done flags, group id,
count, summed by AtomicAdd), the GMM1 and GMM2 soft-sync counters (one int32 per AIC at
512 B pitch, CVSoftSync) at SOFT_SYNC_OFFSET and GMM2::SOFT_SYNC_OFFSET.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import A5Tiling
from npusim.kernels.moe_layer.fused_deep_moe_base.window import (
    GROUP_INFO_SIZE,
    GROUP_TOKEN_NUM_OFFSET,
    OPT_RANK_OFFSET,
    SOFT_SYNC_OFFSET,
    SOFT_SYNC_SPACE_SIZE,
    STATE_OFFSET,
    STATE_SIZE,
    STATE_WIN_OFFSET,
    WIN_STATE_OFFSET,
    data_slot,
)
from npusim.units import KiB

# the status space's own (G2 21); the offsets both builds share in fused_deep_moe_base
GMM2_SOFT_SYNC_OFFSET = 982 * KiB
STATUS_SPACE = 1000 * KiB
DISPATCH_HALF, COMBINE_HALF = 0, 1


@dataclass(frozen=True)
class A5Window:
    """Byte offsets in a rank's window; `regions` for the window sanitiser."""

    t: A5Tiling

    @property
    def bytes(self) -> int:
        return STATE_SIZE + 2 * self.t.data_half_bytes + self.t.W * OPT_RANK_OFFSET

    def state(self, half: int) -> int:
        return half * WIN_STATE_OFFSET

    def dispatch_status(self, le: int, src: int) -> int:
        """The status entry on the receiver of (local expert slot le, source src)."""
        return self.state(DISPATCH_HALF) + (src + le * self.t.W) * STATE_OFFSET

    def combine_status(self, src: int) -> int:
        return self.state(COMBINE_HALF) + src * STATE_OFFSET

    def slot(self, half: int, owner: int, index: int) -> int:
        """Slot `index` (source rank * E_loc + local expert) of owner's data half."""
        return STATE_SIZE + data_slot(self.t, half, owner, index)

    def token(self, owner: int, src: int, le: int, i: int) -> int:
        """Dispatched token i of (src, le) in owner's window (G1 SendToMoeExpert 694-697)."""
        return self.slot(DISPATCH_HALF, owner, src * self.t.L + le) + i * self.t.record

    def combined_row(self, owner: int, expert: int, i: int) -> int:
        """Row i of global expert `expert`'s outputs back in owner's window (cast_combine
        GetWinAddrByRankId 122-126 + localEpRank * E_loc slots, ReducePermute's read)."""
        return self.slot(COMBINE_HALF, owner, expert) + i * self.t.H * 2

    def regions(self) -> dict[str, tuple[int, int]]:
        """The data halves as one zone: owner r's half starts r * 512 B in, so each
        half's last bytes run into the next half's zone."""
        return {"dispatch_state": (0, WIN_STATE_OFFSET),
                "combine_state": (WIN_STATE_OFFSET, STATE_WIN_OFFSET),
                "status_space": (STATE_WIN_OFFSET, STATE_SIZE),
                "data": (STATE_SIZE, self.bytes)}

    # ---- the status space (a GM tensor of the rank)
    @staticmethod
    def group_line(g: int) -> int:
        return GROUP_TOKEN_NUM_OFFSET + g * GROUP_INFO_SIZE * 4

    @staticmethod
    def soft_sync(gemm: int, core: int) -> int:
        base = SOFT_SYNC_OFFSET if gemm == 1 else GMM2_SOFT_SYNC_OFFSET
        return base + core * SOFT_SYNC_SPACE_SIZE
