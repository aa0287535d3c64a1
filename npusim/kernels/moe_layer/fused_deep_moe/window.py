"""FusedDeepMoe's symmetric window on the A3: HCCL's `windowsIn` (the data area) followed
by its `windowsExp` (the status area), as one npusim window per rank.

Data area (sgl-kernel-npu GMM1K:35, 45-49, 950-953, 1405-1414, 1459; cam_moe_distribute_
combine.h (CAMC):87-94, 281-283): two halves picked by the launch's data state, each W * L
slots of expertPerSizeOnWin = maxBs * H * 2 B, slot (source rank) * L + local expert,
the whole area shifted by the owner's rank id * OPT_RANK_OFFSET (512 B). A dispatched
token is a record of H + 512 B at its index in the slot: the int8 row, the fp32 scale at
byte H, the flag word (TOKEN_FLAG_1 / _2) at byte H + 4. The combine writes bf16 rows of H
into the same slot geometry of the source rank's window (EPI2:553-558).

Status area (GMM1K:15-20, CAMC:12-24): the per-state count and status blocks (STATE_OFFSET
= 512 B per entry, the second state WIN_STATE_OFFSET = 512 KiB on), the cores' data-state
words at STATE_WIN_OFFSET (900 KiB, 32 B each), the per-group V -> C lines at
GROUP_TOKEN_NUM_OFFSET (932 KiB, 32 int32 each), the soft-sync counters at
SOFT_SYNC_OFFSET (964 KiB, 512 B each); CAMC's STATE_SIZE (1 MiB) bounds it.

Why here and not npusim.kernels.mc2.window: that is MoeLowLatencyDispatchV2 / CombineV2's
layout (Align32 scale and triplet, Align512 slots), which this kernel does not use.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.moe_layer.fused_deep_moe.tiling import FusedTiling
from npusim.kernels.moe_layer.fused_deep_moe_base.window import (
    GROUP_INFO_SIZE,
    GROUP_TOKEN_NUM_OFFSET,
    OPT_RANK_OFFSET,
    SELF_STATE_OFFSET,
    SOFT_SYNC_OFFSET,
    SOFT_SYNC_SPACE_SIZE,
    STATE_OFFSET,
    STATE_SIZE,
    STATE_WIN_OFFSET,
    UB_ALIGN,
    WIN_STATE_OFFSET,
    data_slot,
)
from npusim.units import align512

FLAG_AT = 4  # bytes after the scale: the flag word (GMM1K:1177, 1184)


@dataclass(frozen=True)
class FusedWindow:
    t: FusedTiling

    # ---- data area
    @property
    def data_bytes(self) -> int:
        """Both halves, and the largest owner shift (rank W - 1)."""
        return 2 * self.t.data_half_bytes + (self.t.W - 1) * OPT_RANK_OFFSET

    def slot(self, owner: int, state: int, src: int, local_expert: int) -> int:
        """Offset in rank `owner`'s window of the (src, local expert) slot."""
        return data_slot(self.t, state, owner, src * self.t.L + local_expert)

    def record(self, owner: int, state: int, src: int, local_expert: int, index: int) -> int:
        """A dispatched token's record: its int8 row, then the scale and the flag."""
        return self.slot(owner, state, src, local_expert) + index * self.t.record_bytes

    def scale(self, record: int) -> int:
        return record + self.t.H

    def flag(self, record: int) -> int:
        return record + self.t.H + FLAG_AT

    def combine_row(self, owner: int, state: int, holder: int, local_expert: int,
                    index: int) -> int:
        """A combined bf16 row in its source rank's (`owner`) window: the slot of the
        expert's rank (`holder`), row `index` (DoCombineSend, EPI2:553-557)."""
        return self.slot(owner, state, holder, local_expert) + index * self.t.H * 2

    # ---- status area
    @property
    def status(self) -> int:
        return align512(self.data_bytes)

    def status_entry(self, state: int, entry: int) -> int:
        """A count (dispatch) or status (combine) entry of STATE_OFFSET bytes."""
        return self.status + state * WIN_STATE_OFFSET + entry * STATE_OFFSET

    def data_state_word(self, index: int) -> int:
        return self.status + STATE_WIN_OFFSET + index * UB_ALIGN

    def group_line(self, group: int) -> int:
        return self.status + GROUP_TOKEN_NUM_OFFSET + group * GROUP_INFO_SIZE * 4

    def soft_sync(self, index: int) -> int:
        return self.status + SOFT_SYNC_OFFSET + index * SOFT_SYNC_SPACE_SIZE

    @property
    def window_bytes(self) -> int:
        return self.status + STATE_SIZE

    def regions(self, owner: int | None = None) -> dict[str, tuple[int, int]]:
        """Rank `owner`'s named regions (its data halves are shifted by its rank id); with
        no owner the zones every rank's window shares (the data area as one zone)."""
        s = self.status
        if owner is None:
            data = {"data": (0, self.data_bytes)}
        else:
            shift, half = owner * OPT_RANK_OFFSET, self.t.data_half_bytes
            data = {"data_state0": (shift, shift + half),
                    "data_state1": (shift + half, shift + 2 * half)}
        return {**data,
                "status_state0": (s, s + WIN_STATE_OFFSET),
                "status_state1": (s + WIN_STATE_OFFSET, s + STATE_WIN_OFFSET),
                "data_state_words": (s + STATE_WIN_OFFSET, s + GROUP_TOKEN_NUM_OFFSET),
                "group_lines": (s + GROUP_TOKEN_NUM_OFFSET, s + SOFT_SYNC_OFFSET),
                "soft_sync": (s + SOFT_SYNC_OFFSET, s + STATE_SIZE)}


def fits_status(t: FusedTiling, aiv: int) -> bool:
    """The status area holds what the kernel indexes: W * L count entries per state below
    the self-status at SELF_STATE_OFFSET (CAMC:18, 330), the data-state words (aivNum +
    aicNum + aivIdx at most, GMM1K:1370), the L group lines and 2 * aicNum soft-sync
    counters (GMM1K:556-557, 593)."""
    entries = t.W * t.L * STATE_OFFSET <= SELF_STATE_OFFSET
    words = (aiv + t.aic + aiv) * UB_ALIGN <= GROUP_TOKEN_NUM_OFFSET - STATE_WIN_OFFSET
    groups = t.L * GROUP_INFO_SIZE * 4 <= SOFT_SYNC_OFFSET - GROUP_TOKEN_NUM_OFFSET
    syncs = 2 * t.aic * SOFT_SYNC_SPACE_SIZE <= STATE_SIZE - SOFT_SYNC_OFFSET
    return entries and words and groups and syncs
