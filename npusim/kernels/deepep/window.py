"""DeepEP-Ascend's normal-mode window layout, its HCCL_BUFFSIZE checks and the SHMEM context.

Offsets follow sgl-project/sgl-kernel-npu csrc/deepep/ops/op_kernel (comm_args.h,
cam_moe_dispatch_normal.h, cam_moe_combine_normal.h, notify_dispatch.h). The data window
(HCCL's windowsIn, totalWinSize = HCCL_BUFFSIZE MiB) is two halves; each op picks one from a
counter it flips per call (notify: magic % 2, dispatch: dataState, combine: magic_). Inside a
half:

    [0, 2 MiB)                  notify flags: 32 B per source rank (a u64 magic * 2 + 1)
    [2 MiB, 102 MiB)            notify data: each rank's assembled counts
    [102 MiB, 106 MiB)          combine status: 32 B per (token, k)
    [106 MiB, +maxBs K comb)    combine data: Align512(2H) per (token, k)
    [.., +maxBs K disp)         dispatch data: one record slot per sent (token, k)

The status window (HCCL's windowsExp) holds the dispatch status halves (500 KiB apart), the
round flags (450 KiB + roundMagic * 4 KiB) and the per-core call counters (notify 900 KiB,
dispatch 950 KiB, combine 975 KiB). npusim has one window per rank: with `context: hccl`
windowsExp follows windowsIn; with `context: shmem` both are one aclshmem allocation with the
status at GetShmemSignalAddr = data + 1022 MiB inside a 1 GiB region per die (cann-samples
moe_dispatch_and_combine_story, STATUS_REGION_OFFSET; hicann/shmem's 1 GiB heap stride).
"""

from __future__ import annotations

from dataclasses import dataclass

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
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
NOTIFY_STATE_WIN_OFFSET = 900 * KiB  # comm_args.h STATE_WIN_OFFSET (notify's magic)
DISPATCH_STATE_WIN_OFFSET = 950 * KiB  # cam_moe_dispatch_normal.h STATE_WIN_OFFSET
MAGIC_WIN_OFFSET = 975 * KiB  # cam_moe_combine_normal.h
STATUS_WINDOW_BYTES = 1 * MiB  # assumed size of windowsExp: the highest offset is 999 KiB
SHMEM_SIGNAL_OFFSET = 1022 * MiB  # GetShmemSignalAddr: data + 1022 MiB
SHMEM_DIE_STRIDE = 1 * GiB  # p2p_device_heap_base[i] = gva + aligned * i
SCALE_EXPAND_IDX_BUFFER = 44  # 32 B scale + 12 B (rank, token, k)
DEFAULT_HCCL_BUFFSIZE_MB = 200  # Mc2TilingUtils::GetMaxWindowSize


def align(x: int, a: int) -> int:
    return -(-x // a) * a


def dispatch_record_bytes(h: int, item: int) -> int:
    """hScaleIdxSize: Align32(H * item) + 32 B scale + 12 B triple (what InputToShare copies)."""
    return align(h * item, UB_ALIGN) + UB_ALIGN + 12


def dispatch_slot_bytes(h: int, item: int) -> int:
    """hOutGMAlignSize: a record's slot in the window, Align512."""
    return align(dispatch_record_bytes(h, item), WIN_ADDR_ALIGN)


def combine_slot_bytes(h: int, rounds: int) -> int:
    """hSizeAlignCombine: Align512(2H), doubled when round > 1 (the combine double buffer)."""
    c = align(2 * h, WIN_ADDR_ALIGN)
    return 2 * c if rounds > 1 else c


class WindowTooSmall(ValueError):
    """HCCL_BUFFSIZE below what DeepEP's tiling check needs; the message is DeepEP's."""


def needed_buffsize(max_bs: int, h: int, k: int, rounds: int) -> int:
    """The tiling check of cam_moe_dispatch_normal_tiling.cc (and the combine's, the same
    form): (maxBs K (comb + disp) + 4 MiB + 102 MiB) * 2 bytes, every record sized for a
    2-byte dtype (MAX_OUT_DTYPE_SIZE)."""
    disp = align(align(2 * h, UB_ALIGN) + SCALE_EXPAND_IDX_BUFFER, WIN_ADDR_ALIGN)
    comb = combine_slot_bytes(h, rounds)
    return (max_bs * k * (comb + disp) + COMBINE_STATE_WIN_OFFSET
            + NOTIFY_DISPATCH_BUFF_OFFSET) * 2


def check_buffsize(max_bs: int, h: int, k: int, rounds: int, buffsize_mb: int) -> None:
    need = needed_buffsize(max_bs, h, k, rounds)
    if need > buffsize_mb * MiB:
        raise WindowTooSmall(
            f"{buffsize_mb} MB: DeepEP's check says HCCL_BUFFSIZE is too SMALL, maxBs = {max_bs}, "
            f"h = {h}, k = {k}, NEEDED_HCCL_BUFFSIZE((maxBs * k * (tokenNeedSizeDispatch + "
            f"tokenNeedSizeCombine) + 4MB + 204MB) * 2) = {need // MiB + 1}MB; allowed: at "
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


    @property
    def half(self) -> int:
        return self.total // 2

    @property
    def exp_base(self) -> int:
        """windowsExp: after windowsIn (hccl), or at the signal offset of the shmem region."""
        return SHMEM_SIGNAL_OFFSET if self.context == "shmem" else self.total

    @property
    def end(self) -> int:
        return self.exp_base + STATUS_WINDOW_BYTES

    # ---- windowsIn, per half
    def notify_flag(self, half: int, src: int) -> int:
        return half * self.half + src * 4 * 8  # FLAG_UNIT_INT_NUM u64 per rank

    def notify_data(self, half: int) -> int:
        return half * self.half + IPC_DATA_OFFSET

    def combine_status(self, half: int, slot: int) -> int:
        return half * self.half + NOTIFY_DISPATCH_BUFF_OFFSET + slot * UB_ALIGN

    def combine_data(self, half: int, slot: int) -> int:
        return (half * self.half + NOTIFY_DISPATCH_BUFF_OFFSET + COMBINE_STATE_WIN_OFFSET
                + slot * self.combine_row)

    def dispatch_data(self, half: int, slot: int) -> int:
        return (half * self.half + NOTIFY_DISPATCH_BUFF_OFFSET + COMBINE_STATE_WIN_OFFSET
                + self.max_bs * self.k * self.comb + slot * self.disp)

    # ---- windowsExp
    def dispatch_status(self, state: int, entry: int) -> int:
        return self.exp_base + state * WIN_STATE_OFFSET + entry * STATE_OFFSET

    def round_status(self, magic: int, src: int) -> int:
        return (self.exp_base + BASE_ROUND_STATE_OFFSET + magic * ROUND_STATE_MAX_SIZE
                + src * STATE_OFFSET)

    def notify_magic(self, core: int) -> int:
        return self.exp_base + NOTIFY_STATE_WIN_OFFSET + core * UB_ALIGN * 8

    def dispatch_state(self, core: int) -> int:
        return self.exp_base + DISPATCH_STATE_WIN_OFFSET + core * WIN_ADDR_ALIGN

    def combine_magic(self, core: int) -> int:
        return self.exp_base + MAGIC_WIN_OFFSET + core * WIN_ADDR_ALIGN

    def regions(self) -> dict[str, tuple[int, int]]:
        z: dict[str, tuple[int, int]] = {}
        for h in (0, 1):
            base = h * self.half
            z[f"notify_flags{h}"] = (base, base + IPC_DATA_OFFSET)
            z[f"notify_data{h}"] = (base + IPC_DATA_OFFSET, base + NOTIFY_DISPATCH_BUFF_OFFSET)
            z[f"combine_status{h}"] = (self.combine_status(h, 0), self.combine_data(h, 0))
            z[f"combine_data{h}"] = (self.combine_data(h, 0), self.dispatch_data(h, 0))
            z[f"dispatch_data{h}"] = (self.dispatch_data(h, 0), base + self.half)
        e = self.exp_base
        z["dispatch_status0"] = (e, e + BASE_ROUND_STATE_OFFSET)
        z["round_status"] = (e + BASE_ROUND_STATE_OFFSET, e + WIN_STATE_OFFSET)
        z["dispatch_status1"] = (e + WIN_STATE_OFFSET, e + NOTIFY_STATE_WIN_OFFSET)
        z["notify_magic"] = (e + NOTIFY_STATE_WIN_OFFSET, e + DISPATCH_STATE_WIN_OFFSET)
        z["dispatch_state"] = (e + DISPATCH_STATE_WIN_OFFSET, e + MAGIC_WIN_OFFSET)
        z["combine_magic"] = (e + MAGIC_WIN_OFFSET, e + STATUS_WINDOW_BYTES)
        return z
