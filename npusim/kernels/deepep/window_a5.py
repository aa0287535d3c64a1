"""DeepEP-Ascend's normal-mode window on the Ascend 950 (A5; csrc/deepep/ops/op_kernel
moe_distribute_base.h under __DAV_C310__, cam_moe_*_normal_a5.h, notify_dispatch_a5.h).

The A5 has no windowsExp: each rank has one HCCL window (windowsIn, HCCL_BUFFSIZE bytes)
whose first A5_MTE_STATE_WIN_SIZE (4 MiB) are the state zone, what windowsExp held on the
A3, at moved offsets. The rest is the data area, two halves of (total - 4 MiB) / 2:

    state zone   [0, 4 MiB)
      dispatch status     dataState * 550 KiB + 32 * (src + le * W)
      round flags         dispatch 450 KiB, multi-round combine 458 KiB (+ roundMagic * 4 KiB)
      counters            notify's magic 1000 KiB + core * 256, dispatch's dataState
                          1050 KiB + core * 512, combine's magic_ 1100 KiB + core * 512
    data half h  [4 MiB + h * half, ...): the A3's half, its first 102 MiB unused
      combine status      + 102 MiB, combine rows + 106 MiB, then the dispatch records

notify_dispatch does not use the data halves: its share area is windowsIn + (magic % 2) *
half with no 4 MiB skip (GetWindAddrByRankId returns the state-zone base), so an even call
puts its flags over the dispatch status of dataState 0 and its counts at + 2 MiB, an odd
call at (total - 4 MiB) / 2, inside data half 0. npusim takes the HCCL context's winSize
(what notify halves) to be HCCL_BUFFSIZE."""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.deepep.window import (
    IPC_DATA_OFFSET,
    STATE_OFFSET,
    DeepepWindow,
)
from npusim.units import KiB, MiB

A5_MTE_STATE_WIN_SIZE = 4 * MiB
A5_WIN_STATE_OFFSET = 550 * KiB  # dispatch status half (A3: 500 KiB)
A5_NOTIFY_STATE_WIN_OFFSET = 1000 * KiB  # notify_dispatch_a5.h STATE_WIN_OFFSET
A5_DISPATCH_STATE_WIN_OFFSET = 1050 * KiB  # cam_moe_dispatch_normal_a5.h STATE_WIN_OFFSET
A5_MAGIC_WIN_OFFSET = 1100 * KiB  # cam_moe_combine_normal_a5.h MAGIC_WIN_OFFSET
NOTIFY_MAGIC_STRIDE = 256  # the u64 counter at index blockIdx * 32
# the zones the sanitiser holds accesses to: the counters and flags, then everything else
# (notify's counts run from the state zone into data half 0's unused notify area)
STATE_FLAGS_END = IPC_DATA_OFFSET


@dataclass(frozen=True)
class A5Window(DeepepWindow):
    """The A5's window: the A3's areas (the base class) moved behind the state zone and
    its counters at the A5 offsets; the notify exchange by the base's formulas over the
    A5's half."""

    @property
    def half(self) -> int:
        """baseWindSize / 2: the data area after the state zone, halved."""
        return (self.total - A5_MTE_STATE_WIN_SIZE) // 2

    @property
    def exp_base(self) -> int:
        """The state zone (GetBaseWindStateAddrByRankId): the window's start."""
        return 0

    @property
    def end(self) -> int:
        return self.total

    def combine_status(self, half: int, slot: int) -> int:
        return A5_MTE_STATE_WIN_SIZE + super().combine_status(half, slot)

    def combine_data(self, half: int, slot: int) -> int:
        return A5_MTE_STATE_WIN_SIZE + super().combine_data(half, slot)

    def dispatch_data(self, half: int, slot: int) -> int:
        return A5_MTE_STATE_WIN_SIZE + super().dispatch_data(half, slot)

    def dispatch_status(self, state: int, entry: int) -> int:
        return state * A5_WIN_STATE_OFFSET + entry * STATE_OFFSET

    def notify_magic(self, core: int) -> int:
        return A5_NOTIFY_STATE_WIN_OFFSET + core * NOTIFY_MAGIC_STRIDE

    def dispatch_state(self, core: int) -> int:
        return A5_DISPATCH_STATE_WIN_OFFSET + core * 512

    def combine_magic(self, core: int) -> int:
        return A5_MAGIC_WIN_OFFSET + core * 512

    def regions(self) -> dict[str, tuple[int, int]]:
        """Two zones: the state zone's flags and counters, and the rest, where notify's
        exchange overlaps the data halves by the source's design (module doc)."""
        return {"state_flags": (0, STATE_FLAGS_END),
                "exchange_and_data": (STATE_FLAGS_END, self.total)}

