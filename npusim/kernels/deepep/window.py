"""DeepEP-Ascend's normal-mode window layout and its HCCL_BUFFSIZE checks.

Offsets follow sgl-project/sgl-kernel-npu csrc/deepep/ops/op_kernel (comm_args.h,
cam_moe_dispatch_normal.h, cam_moe_combine_normal.h, notify_dispatch.h). The data window
(HCCL's windowsIn, totalWinSize = HCCL_BUFFSIZE MiB) is two halves; each op picks one from a
counter it flips per call (notify: magic % 2, dispatch: dataState, combine: magic_). Inside a
half:

    [0, 2 MiB)                  notify flags: 32 B per source rank (a u64 magic * 2 + 1)
    [2 MiB, 102 MiB)            notify data: each rank's assembled counts
    [102 MiB, 106 MiB)          combine status: 32 B per (token, k); multi-round: per roundMagic
                                the half of it at + roundMagic * 2 MiB
    [106 MiB, +maxBs K comb)    combine data: Align512(2H) per (token, k); multi-round (comb
                                doubled): per roundMagic maxBs K Align512(2H)
    [.., +maxBs K disp)         dispatch data: one record slot per sent (token, k)

The status window (HCCL's windowsExp) holds the dispatch status halves (500 KiB apart), the
round flags (dispatch 450 KiB, the multi-round combine 458 KiB, each + roundMagic * 4 KiB)
and the per-core call counters (notify 900 KiB, dispatch 950 KiB, combine 975 KiB). npusim
has one window per rank: windowsExp follows windowsIn. (`context: shmem` runs the
`shmem_ver` branch's SHMEM kernels instead, on the heap of shmem_layout.py.)

The A2 builds (csrc/deepep/ops2, the same four kernels inside one server) lay the window out
differently: there is no windowsExp, the status lives in the last 4 STATE_SIZE (2 MiB each)
of windowsIn (notify's counters at total - 3 STATE_SIZE, dispatch's status, round flags and
counters at total - 2 STATE_SIZE, combine's counters at total - STATE_SIZE), the two data
halves split what is left, (total - 8 MiB) / 2 each (the multi-round combine's round flags
at total - STATE_SIZE + 458 KiB), and the areas inside a half are larger:
notify data [2, 202 MiB), combine status [202, 210 MiB), then combine and dispatch data.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.units import KiB, MiB, align_up

UB_ALIGN = 32
WIN_ADDR_ALIGN = 512
STATE_OFFSET = 32  # one 32 B status entry
# windowsIn, per half (comm_args.h, cam_moe_*_normal.h)
IPC_DATA_OFFSET = 2 * MiB
NOTIFY_DISPATCH_BUFF_OFFSET = 102 * MiB
COMBINE_STATE_WIN_OFFSET = 4 * MiB
# windowsExp
WIN_STATE_OFFSET = 500 * KiB  # dispatch status half
BASE_ROUND_STATE_OFFSET = 450 * KiB
ROUND_STATE_MAX_SIZE = 4 * KiB
# the multi-round combine's round flags: BASE_ROUND_STATE_OFFSET + ROUND_STATE_MAX_SIZE * 2
COMBINE_ROUND_STATE_OFFSET = BASE_ROUND_STATE_OFFSET + 2 * ROUND_STATE_MAX_SIZE
NOTIFY_STATE_WIN_OFFSET = 900 * KiB  # comm_args.h STATE_WIN_OFFSET (notify's magic)
DISPATCH_STATE_WIN_OFFSET = 950 * KiB  # cam_moe_dispatch_normal.h STATE_WIN_OFFSET
MAGIC_WIN_OFFSET = 975 * KiB  # cam_moe_combine_normal.h
STATUS_WINDOW_BYTES = 1 * MiB  # assumed size of windowsExp: the highest offset is 999 KiB
SCALE_EXPAND_IDX_BUFFER = 44  # 32 B scale + 12 B (rank, token, k)
DEFAULT_HCCL_BUFFSIZE_MB = 200  # Mc2TilingUtils::GetMaxWindowSize
# ops2 (A2): comm_args.h, cam_moe_*_normal.h; the tiling check's own constants, tiling_args.h
STATE_SIZE = 2 * MiB
A2_NOTIFY_DISPATCH_BUFF_OFFSET = 202 * MiB
A2_COMBINE_STATE_WIN_OFFSET = 8 * MiB
A2_CHECK_NOTIFY_DISPATCH_WIN_OFFSET = 404 * MiB  # tiling_args.h NOTIFY_DISPATCH_WIN_OFFSET


@dataclass(frozen=True)
class Layout:
    """What a platform's build fixes about the window (ops: A3, ops2: A2)."""

    notify_buff: int  # NOTIFY_DISPATCH_BUFF_OFFSET: start of the combine area in a half
    combine_state: int  # COMBINE_STATE_WIN_OFFSET: the combine status area's size
    status_in_window: bool  # status in the last 4 STATE_SIZE of windowsIn (no windowsExp)
    check_notify: int  # the tiling check's notify area
    check_combine_state: int  # the tiling check's combine status area
    check_status: int  # the tiling check's status addend


LAYOUTS = {
    "a3": Layout(NOTIFY_DISPATCH_BUFF_OFFSET, COMBINE_STATE_WIN_OFFSET, False,
                 NOTIFY_DISPATCH_BUFF_OFFSET, COMBINE_STATE_WIN_OFFSET, 0),
    "a2": Layout(A2_NOTIFY_DISPATCH_BUFF_OFFSET, A2_COMBINE_STATE_WIN_OFFSET, True,
                 A2_CHECK_NOTIFY_DISPATCH_WIN_OFFSET, A2_COMBINE_STATE_WIN_OFFSET,
                 4 * STATE_SIZE),
}


def dispatch_record_bytes(h: int, item: int) -> int:
    """hScaleIdxSize: Align32(H * item) + 32 B scale + 12 B triple (what InputToShare copies)."""
    return align_up(h * item, UB_ALIGN) + UB_ALIGN + 12


def dispatch_slot_bytes(h: int, item: int) -> int:
    """hOutGMAlignSize: a record's slot in the window, Align512."""
    return align_up(dispatch_record_bytes(h, item), WIN_ADDR_ALIGN)


def combine_slot_bytes(h: int, rounds: int) -> int:
    """hSizeAlignCombine: Align512(2H), doubled when round > 1 (the combine double buffer)."""
    c = align_up(2 * h, WIN_ADDR_ALIGN)
    return 2 * c if rounds > 1 else c


class WindowTooSmall(ValueError):
    """HCCL_BUFFSIZE below what DeepEP's tiling check needs; the message is DeepEP's."""


def needed_buffsize(max_bs: int, h: int, k: int, rounds: int, platform: str = "a3") -> int:
    """The tiling check of cam_moe_dispatch_normal_tiling.cc (the combine's has the same
    form, smaller): (maxBs K (comb + disp) + combine status + notify area) * 2 bytes, plus
    on the A2 the 4 STATE_SIZE of status, every record sized for a 2-byte dtype
    (MAX_OUT_DTYPE_SIZE)."""
    lay = LAYOUTS[platform]
    disp = align_up(align_up(2 * h, UB_ALIGN) + SCALE_EXPAND_IDX_BUFFER, WIN_ADDR_ALIGN)
    comb = combine_slot_bytes(h, rounds)
    return ((max_bs * k * (comb + disp) + lay.check_combine_state + lay.check_notify) * 2
            + lay.check_status)


def check_buffsize(max_bs: int, h: int, k: int, rounds: int, buffsize_mb: int,
                   platform: str = "a3") -> None:
    need = needed_buffsize(max_bs, h, k, rounds, platform)
    if need > buffsize_mb * MiB:
        tail = "4MB + 404MB) * 2 + 4 * 2MB)" if platform == "a2" else "4MB + 204MB) * 2)"
        raise WindowTooSmall(
            f"{buffsize_mb} MB: DeepEP's check says HCCL_BUFFSIZE is too SMALL, maxBs = {max_bs}, "
            f"h = {h}, k = {k}, NEEDED_HCCL_BUFFSIZE((maxBs * k * (tokenNeedSizeDispatch + "
            f"tokenNeedSizeCombine) + {tail} = {need // MiB + 1}MB; allowed: at "
            f"least {need // MiB + 1}")


@dataclass(frozen=True)
class DeepepWindow:
    """Where every area of one rank's window is (npusim's window = windowsIn + windowsExp)."""

    context: str  # hccl | shmem
    total: int  # totalWinSize = HCCL_BUFFSIZE MiB (windowsIn)
    max_bs: int  # min(realMaxBs, perRoundTokens)
    k: int
    comb: int  # combine slot bytes (hSizeAlignCombine)
    disp: int  # dispatch slot bytes (hOutGMAlignSize)
    combine_row: int  # h512AlignRecvXLen_: Align512(2H), one combine slot
    platform: str = "a3"  # a3 (ops) | a2 (ops2)

    @property
    def layout(self) -> Layout:
        return LAYOUTS[self.platform]

    @property
    def half(self) -> int:
        if self.layout.status_in_window:
            return (self.total - 4 * STATE_SIZE) // 2
        return self.total // 2

    @property
    def exp_base(self) -> int:
        """windowsExp: after windowsIn; on the A2 dispatch's status base, total - 2
        STATE_SIZE."""
        if self.layout.status_in_window:
            return self.total - 2 * STATE_SIZE
        return self.total

    @property
    def end(self) -> int:
        if self.layout.status_in_window:
            return self.total
        return self.exp_base + STATUS_WINDOW_BYTES

    def _status_base(self, kernel_slot: int) -> int:
        """A2: notify's status at total - 3, dispatch's at - 2, combine's at - 1 STATE_SIZE;
        A3: all three in windowsExp."""
        if self.layout.status_in_window:
            return self.total - kernel_slot * STATE_SIZE
        return self.exp_base

    # ---- windowsIn, per half
    def notify_flag(self, half: int, src: int) -> int:
        return half * self.half + src * 4 * 8  # FLAG_UNIT_INT_NUM u64 per rank

    def notify_data(self, half: int) -> int:
        return half * self.half + IPC_DATA_OFFSET

    def combine_status(self, half: int, slot: int) -> int:
        return half * self.half + self.layout.notify_buff + slot * UB_ALIGN

    def combine_data(self, half: int, slot: int) -> int:
        lay = self.layout
        return (half * self.half + lay.notify_buff + lay.combine_state
                + slot * self.combine_row)

    def dispatch_data(self, half: int, slot: int) -> int:
        lay = self.layout
        return (half * self.half + lay.notify_buff + lay.combine_state
                + self.max_bs * self.k * self.comb + slot * self.disp)

    # ---- the multi-round combine (cam_moe_combine_normal_multi_round.h): two buffers
    def combine_round_status(self, half: int, round_magic: int, slot: int) -> int:
        """GetStateAddrByRankId + roundMagic * STATE_WIN_SIZE_HALF + slot * 32: each
        roundMagic has half of the combine status area."""
        return self.combine_status(half, slot) + round_magic * (self.layout.combine_state // 2)

    def combine_round_data(self, half: int, round_magic: int, slot: int) -> int:
        """GetBufferAddrByRankId: + STATE_WIN_SIZE + roundMagic * combineDataBuffSize
        (perRoundTokens K Align512(2H)). roundMagic reaches 1 only with more than one round
        run, when maxBs is perRoundTokens."""
        return self.combine_data(half, slot) + round_magic * self.max_bs * self.k * self.combine_row

    def combine_round_flag(self, round_magic: int, src: int) -> int:
        """GetRoundStateAddrByRankId + src * 32: the combine's own round flags (458 KiB +
        roundMagic * 4 KiB), in windowsExp on the A3, in combine's STATE_SIZE on the A2."""
        return (self._status_base(1) + COMBINE_ROUND_STATE_OFFSET
                + round_magic * ROUND_STATE_MAX_SIZE + src * STATE_OFFSET)

    # ---- windowsExp
    def dispatch_status(self, state: int, entry: int) -> int:
        return self.exp_base + state * WIN_STATE_OFFSET + entry * STATE_OFFSET

    def round_status(self, magic: int, src: int) -> int:
        return (self.exp_base + BASE_ROUND_STATE_OFFSET + magic * ROUND_STATE_MAX_SIZE
                + src * STATE_OFFSET)

    @property
    def round_flags_by_state(self) -> bool:
        """The A2 dispatch puts its round flags at dataState * 4 KiB, the A3 at roundMagic,
        which it flips every round."""
        return self.layout.status_in_window

    def notify_magic(self, core: int) -> int:
        return self._status_base(3) + NOTIFY_STATE_WIN_OFFSET + core * UB_ALIGN * 8

    def dispatch_state(self, core: int) -> int:
        return self._status_base(2) + DISPATCH_STATE_WIN_OFFSET + core * WIN_ADDR_ALIGN

    def combine_magic(self, core: int) -> int:
        return self._status_base(1) + MAGIC_WIN_OFFSET + core * WIN_ADDR_ALIGN

    def regions(self) -> dict[str, tuple[int, int]]:
        z: dict[str, tuple[int, int]] = {}
        for h in (0, 1):
            base = h * self.half
            z[f"notify_flags{h}"] = (base, base + IPC_DATA_OFFSET)
            z[f"notify_data{h}"] = (base + IPC_DATA_OFFSET, base + self.layout.notify_buff)
            z[f"combine_status{h}"] = (self.combine_status(h, 0), self.combine_data(h, 0))
            z[f"combine_data{h}"] = (self.combine_data(h, 0), self.dispatch_data(h, 0))
            z[f"dispatch_data{h}"] = (self.dispatch_data(h, 0), base + self.half)
        e = self.exp_base
        if self.layout.status_in_window:
            n, c = self._status_base(3), self._status_base(1)
            z["notify_magic"] = (n + NOTIFY_STATE_WIN_OFFSET, n + STATE_SIZE)
            z["dispatch_status0"] = (e, e + BASE_ROUND_STATE_OFFSET)
            z["round_status"] = (e + BASE_ROUND_STATE_OFFSET, e + WIN_STATE_OFFSET)
            z["dispatch_status1"] = (e + WIN_STATE_OFFSET, e + DISPATCH_STATE_WIN_OFFSET)
            z["dispatch_state"] = (e + DISPATCH_STATE_WIN_OFFSET, c)
            z["combine_round_status"] = (c + COMBINE_ROUND_STATE_OFFSET,
                                         c + COMBINE_ROUND_STATE_OFFSET + 2 * ROUND_STATE_MAX_SIZE)
            z["combine_magic"] = (c + MAGIC_WIN_OFFSET, self.total)
            return z
        z["dispatch_status0"] = (e, e + BASE_ROUND_STATE_OFFSET)
        z["round_status"] = (e + BASE_ROUND_STATE_OFFSET, e + WIN_STATE_OFFSET)
        z["dispatch_status1"] = (e + WIN_STATE_OFFSET, e + NOTIFY_STATE_WIN_OFFSET)
        z["notify_magic"] = (e + NOTIFY_STATE_WIN_OFFSET, e + DISPATCH_STATE_WIN_OFFSET)
        z["dispatch_state"] = (e + DISPATCH_STATE_WIN_OFFSET, e + MAGIC_WIN_OFFSET)
        z["combine_magic"] = (e + MAGIC_WIN_OFFSET, e + STATUS_WINDOW_BYTES)
        return z
