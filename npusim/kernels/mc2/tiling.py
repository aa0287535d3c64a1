"""Host-side tiling of one MoeDistributeDispatchV3 / CombineV3 call (family ``mc2``).

What ``moe_distribute_dispatch_v2_tiling.cpp`` hands the kernel: the shape, the core count
(``GetCoreNumAiv``, from the preset), the UB size, the window, and the derived core roles
and buffer counts of ``MoeDistributeDispatchV2::Init``.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2.quant_modes import input_bytes, vf_mode
from npusim.kernels.mc2.window import MAX_UB_SIZE, Mc2Window
from npusim.kernels.shape import OnShape
from npusim.units import align32, align_up, ceil_div
from npusim.workload.shape import MoeShape

# the operators' kernel code path of a chip (the preset's chip.arch, a CANN SoC name)
ARCH_OF_CHIP = {"ascend910_93": "arch22", "ascend950": "arch35"}

__all__ = ["ARCH_OF_CHIP", "Mc2Tiling", "workspace_ints"]


@dataclass(frozen=True, kw_only=True)
class Mc2Tiling(OnShape):
    """What the host hands one V3 call (built with named fields only)."""

    shape: MoeShape
    # none | static_int8 | int8 | pergroup | mxfp8 | mxfp8_clip | mxfp4_e2m1 (the 950);
    # DeepEP's 950 fork only: pertoken_fp8 (quant_modes.py)
    dispatch_quant: str
    combine_quant: str  # none | int8 | mxfp8_e5m2 | mxfp8_e4m3 (the 950)
    expert_token_nums_type: int  # 0 cumsum, 1 counts
    arch: str  # arch22 (A3) | arch35 (950)
    cores: int  # aivNum
    ub_bytes: int  # totalUbSize
    window: Mc2Window
    smooth_scales: bool = False  # int8 with smooth scales / static_int8 scale tensor given
    timing_only: bool = False
    x_active_mask: str = "none"  # none | 1d (an active prefix) | 2d (per token and k)
    expert_scales: bool = True  # expert_scales given (dispatch carries them, combine weighs)
    shared_expert_x: bool = False  # combine adds a shared_expert_x input
    static_scales: str = "per_channel"  # static_int8 scale shape: scalar | per_channel | ...
    active_fraction: float = 1.0  # share of tokens / pairs a generated mask keeps
    performance_info: bool = False  # dispatch records each source's wait (us)
    comm_alg: str = "fullmesh_v1"  # fullmesh_v1 | fullmesh_v2 (MoeDistributeDispatchV2FullMesh)
    quant_dtype: str = "e5m2"  # the FP8 modes' element format: e5m2 | e4m3
    # What DeepEP-Ascend's forks of the V2 kernels (MoeLowLatencyDispatchV2 / CombineV2, an
    # earlier state of the operators) do otherwise; the defaults are ops-transformer's.
    # combine's LocalWindowCopy loads all BS x K expert scales, not its core's span
    whole_expert_scales: bool = False
    # dispatch's LocalWindowCopy moves one row per copy, not batches of rows
    local_copy_batches: bool = True
    # dispatch ends with UpdateTokenNumsOut (a SyncAll, then the last core re-reads
    # ep_recv_count through the data cache), not core 0's SetExpertTokenNums
    update_token_nums_out: bool = False
    # combine's send: rows per step before its PipeBarrier<PIPE_MTE3> and their flags
    combine_send_rows: int = 2
    # combine's receive waits for its tokens in order, not round robin over the pending
    combine_tokens_in_order: bool = False
    # dispatch's FillTriple starts with SyncFunc<MTE3_S>: every put of the core has landed
    # before the next triplet is written (one put in flight), not only the buffer's own
    fill_triple_waits_mte3: bool = False
    # per-token INT8 takes d = 1 for a zero row (DeepEP's A5 fork: max > 0 ? 127 / max : 1;
    # its per-token FP8 always does)
    int8_zero_guard: bool = False

    # ---- shape shorthands (the rest: OnShape)
    def bs(self, rank: int) -> int:
        return self.shape.bs[rank]

    # ---- core roles (Init, v2.h:424-432)
    @property
    def shared_send_cores(self) -> int:
        """sharedUsedAivNum_: the last max(1, C * S / (K + S)) cores, with shared ranks."""
        if not self.shape.S_r:
            return 0
        return max(1, self.cores * self.S // (self.K + self.S))

    @property
    def moe_send_cores(self) -> int:
        return self.cores - self.shared_send_cores

    # ---- UB (Init's totalUsedUB_ and the queues' buffer count)
    def send_ub_used(self, rank: int) -> int:
        """totalUsedUB_ of Init before the send queues (v2.h:451-550)."""
        s, bs, K = self.shape, self.bs(rank), self.K
        n = bs * K
        status = ceil_div(ceil_div(s.S_r + s.E, self.cores), 8) * 8 * 32
        ids = align32(4 * n)
        mask_bytes = bs * align32(K) * 2
        h_fp32 = 4 * self.H
        if self.dispatch_quant == "pergroup" and self.smooth_scales:
            h_fp32 = 4 * align_up(self.H, 128)  # hFp32Size of Init
        max_size = max(h_fp32, ids, mask_bytes, align_up(2 * n, 256))
        used = status + ids + max_size
        if s.special_experts:
            used += align32(4 * bs) + ids
        return used + 2 * max_size  # receiveDataCastFloatBuf + smoothScalesBuf / dst + sub

    @property
    def x_in_bytes(self) -> int:
        """hAlignSize_: Align32(2H), Align128(H) * 2 for the 950's FP8 and MXFP4 modes."""
        return input_bytes(self.H) if vf_mode(self.dispatch_quant) else align32(2 * self.H)

    def send_buffers(self, rank: int) -> int:
        """bufferNum_: 2, or 1 when the send queues would take the UB past MAX_UB_SIZE."""
        ub_row = self.window.dispatch.ub_row
        queues = 2 * ub_row
        if self.dispatch_quant != "none":
            queues += 2 * self.x_in_bytes
        return 1 if self.send_ub_used(rank) + queues > MAX_UB_SIZE else 2

    def wait_ub_used(self, rank: int) -> int:
        """totalUsedUB_ after BufferInit (v2.h:1091-1157): what LocalWindowCopy leaves."""
        wl = self.status_count(rank)
        n = split_to_core(wl, self.cores, 0)[1]  # the largest share
        C, W, L = self.cores, self.W, self.L
        used = max(32 * n, 256)
        gather = max(align32(4 * n), 4 * W * L)
        if self.arch == "arch35":
            gather = max(gather, align32(4 * self.local_experts(rank) * W))
        used += gather + 2 * C * 32 + 96 + 2 * self.window.dispatch.ub_row
        used += align32(8 * L) + L * W * 32
        if self.arch == "arch35":
            used += align_up(L * W, 8) * 4
        else:
            used += C * 4 + align32(ceil_div(W, 8) * 32)
        return used

    def local_copy_rows(self, rank: int) -> tuple[int, int]:
        """(bytes of each of the two tripleQueue buffers, rows per batch)."""
        if not self.local_copy_batches:  # xQueue_: one row per buffer
            return self.window.dispatch.ub_row, 1
        left = (self.ub_bytes - self.wait_ub_used(rank)) // 32 * 32
        size = left // 2 // 32 * 32
        return size, size // self.window.dispatch.ub_row


# ---- fullmesh_v2 (MoeDistributeDispatchV2FullMesh::SetTilingDataAndCal and AllToAllDispatch)
MIN_ACTIVE_BS_FOR_BS_MODE = 16
VALID_EVENT_FLAG_NUM = 8  # at most 8 send slots in flight
FULL_MESH_MAX_UB_SIZE = 190 * 1024  # the local copy's UB budget
FULL_MESH_BS_MAX = {"arch22": 256, "arch35": 512}  # FULLMESH_BS_UPPER_BOUND_A3 / _A5
FULL_MESH_K_MAX = 12  # FULLMESH_K_MAX


def count_cores(t: Mc2Tiling, rank: int) -> int:
    """aivUsedCumSum_: (S_r + E) / 32 on A3, / 16 on the 950; at least 1, at most C / 2,
    CUMSUM_MAX_CORE_NUM (16 on A3, 8 on the 950) and rscvStatusNum_."""
    total = t.shape.S_r + t.shape.E
    n = total // (32 if t.arch == "arch22" else 16)
    n = max(n, 1)
    n = min(n, t.cores // 2, 16 if t.arch == "arch22" else 8)
    return min(n, t.status_count(rank))


def all_to_all_cores(t: Mc2Tiling, rank: int) -> int:
    """aivUsedAllToAll_: the cores before the count cores."""
    return t.cores - count_cores(t, rank)


def full_mesh_shared_cores(t: Mc2Tiling, rank: int) -> int:
    """sharedUsedAivNum_: the last max(1, a2a * S / (K + S)) all-to-all cores."""
    if not t.shape.S_r:
        return 0
    return max(1, all_to_all_cores(t, rank) * t.S // (t.K + t.S))


def full_mesh_moe_cores(t: Mc2Tiling, rank: int) -> int:
    """moeUsedAivNum_."""
    return all_to_all_cores(t, rank) - full_mesh_shared_cores(t, rank)


def scales_count(t: Mc2Tiling) -> int:
    """scalesCount_: elements of the scales input (0 without one)."""
    if not t.smooth_scales:
        return 0
    if t.dispatch_quant == "static_int8" and t.static_scales != "per_expert":
        return 1 if t.static_scales == "scalar" else t.H
    return t.shape.scale_rows() * t.H


def bs_mode(t: Mc2Tiling, rank: int, active_bs: int) -> bool:
    """canUseBSMode of AllToAllDispatchA3: active BS > 16, the active tokens split evenly
    over the MoE send cores (or those over the tokens), no per-expert scales (scalesCount_
    <= H) and no 2-D mask. The 950 always splits by token."""
    moe = full_mesh_moe_cores(t, rank)
    return (t.arch == "arch22" and active_bs > MIN_ACTIVE_BS_FOR_BS_MODE and moe > 0
            and (active_bs % moe == 0 or moe % active_bs == 0)
            and scales_count(t) <= t.H and t.x_active_mask != "2d")


def bs_token_range(t: Mc2Tiling, rank: int, core: int, active_bs: int
                   ) -> tuple[int, int, int, int, bool]:
    """CalcBSTokenRange: (first token, end token, first k, end k, several cores per token).
    With fewer active tokens than MoE cores, coresPerToken = moe // activeBS cores share a
    token and split its K (the first K % coresPerToken one more); else each core takes
    activeBS / moe consecutive tokens with all K."""
    moe = full_mesh_moe_cores(t, rank)
    K = t.K
    if active_bs < moe:
        per = moe // active_bs
        if core >= per * active_bs:
            return 0, 0, 0, K, True
        tok, sub = divmod(core, per)
        e, rem = divmod(K, per)
        k0 = sub * (e + 1) if sub < rem else rem * (e + 1) + (sub - rem) * e
        return tok, tok + 1, k0, k0 + (e + 1 if sub < rem else e), True
    per = active_bs // moe
    start = per * core
    return (start, start + per, 0, K, False) if start < active_bs else (0, 0, 0, K, False)


def bs_k_order(token: int, k0: int, k1: int, K: int, shared_token: bool) -> list[int]:
    """SendBSExpertLoop's k order: ki in [k0, k1) in order when cores share the token, else
    staggered k = (ki + token) % K so that the cores' first puts go to different experts."""
    return list(range(k0, k1)) if shared_token else [(ki + token) % K for ki in range(k0, k1)]


def split_expert_num_to_core(E: int, moe: int, core: int) -> list[tuple[int, int, int]]:
    """SplitExpertNumToCore (A3 expert split): (expert, cores sharing it, my place among
    them) for each expert core `core` sends: E // moe consecutive experts, and with a
    remainder r one of the last r experts, shared by the cores with the same core % r,
    which deal its pairs round robin."""
    base, rem = divmod(E, moe)
    out = [(core * base + i, 1, 0) for i in range(base)]
    if rem:
        group = moe // rem + (1 if core % rem < moe % rem else 0)
        out.append((core % rem + moe * base, group, core // rem))
    return out


def rotated_block(src: int, dst: int, e: int, W: int, L: int) -> int:
    """The 950's destination block: ((src + dst) % W) * L + e % L (the receiver reads
    source s at ((s + me) % W) * L + local): ranks write different blocks at once."""
    return ((src + dst) % W) * L + e % L


def max_size_for_ub_buffer(t: Mc2Tiling, rank: int) -> int:
    """maxSizeForUbBuffer of the host tiling (CheckUBSize)."""
    n = t.bs(rank) * t.K
    return max(align32(4 * t.H), align32(4 * n), t.bs(rank) * align32(t.K) * 2,
               align_up(2 * n, 256))


def _in_align(t: Mc2Tiling) -> int:
    """hAlignSize_: Align32(H * 2) (npusim adds the 32 B the kernel's FillTriple writes past
    it in TokenToExpert, into the buffer that follows)."""
    return align32(2 * t.H)


def send_ub_used_v2(t: Mc2Tiling, rank: int, bs_path: bool) -> int:
    """UB from calBeginBuf_ to calEndBuf_ (inclusive) in AllToAllDispatch before
    CalcSendTokenBufNum: what the send slots may not use."""
    n = t.bs(rank) * t.K
    ids = align_up(4 * n, 256)  # expertIdsBufSize_
    quant = t.dispatch_quant != "none"
    mask = t.x_active_mask != "none" or t.shape.special_experts > 0
    mx = max_size_for_ub_buffer(t, rank)
    cal = align32(4 * n)
    used = 32 + 32  # calBeginBuf_, dataStateBuf
    used += (4 if t.arch == "arch35" else 2) * _in_align(t)  # inQueue (+ the 950's clean pool)
    used += ids + (ids if t.expert_scales else 0) + (ids if mask else 0)
    if quant:
        used += align32(t.window.dispatch.triplet_offset + 32) + 2 * mx
    elif mask:
        used += 2 * mx
    elif t.arch == "arch35" or bs_path:
        used += 2 * cal  # dstExpBuf_, subExpBuf_ for CalTokenSendExpertCnt
    if t.arch == "arch35" or bs_path:
        used += cal  # calTempBuf
    if t.x_active_mask == "2d" or t.shape.special_experts:
        used += align32(4 * t.bs(rank)) + max(align32(4 * n), t.bs(rank) * align32(t.K) * 2)
    return used + 32  # calEndBuf_


def send_token_buf_num(t: Mc2Tiling, rank: int, bs_path: bool) -> int:
    """sendTokenBufNum_ (CalcSendTokenBufNum): the slots left UB holds, at most 8."""
    left = t.ub_bytes - send_ub_used_v2(t, rank, bs_path)
    return max(0, min(VALID_EVENT_FLAG_NUM, left // t.window.dispatch.slot))


def host_ub_check_v2(t: Mc2Tiling, rank: int) -> int:
    """CheckUBSize (fullmesh_v2 only): the UB the host counts for the send path."""
    n = t.bs(rank) * t.K
    ids = align_up(4 * n, 256)
    used = 32 + 2 * align32(2 * t.H) + 2 * t.window.dispatch.slot + ids
    mask = t.x_active_mask != "none" or t.shape.special_experts > 0
    used += ids if mask else 0
    mx = max_size_for_ub_buffer(t, rank)
    if t.dispatch_quant != "none":
        used += align32(t.window.dispatch.triplet_offset + 32) + 2 * mx
    elif mask:
        used += 2 * mx
    if t.x_active_mask == "2d" or t.shape.special_experts:
        used += align32(4 * t.bs(rank)) + max(align32(4 * n), t.bs(rank) * align32(t.K) * 2)
    # SendToMoeExpertUsedBuffer: the expert masks and tokenNumToExpertBuf (C / 32 count cores)
    total = t.shape.S_r + t.shape.E
    cs = min(max(1, total // 32), t.cores // 2)
    a2a = t.cores - cs
    sh = max(1, a2a * t.S // (t.K + t.S)) if t.shape.S_r else 0
    moe = a2a - sh
    per_expert = align32(ids // 4 // 8)
    used += per_expert * align_up(t.shape.E, moe) // moe + align32(4 * t.shape.E)
    return used


def workspace_ints(t: Mc2Tiling) -> int:
    """The dispatch workspace in int32: A3 fullmesh_v1's SyncCntOnCore rows (C x C x 512 B),
    fullmesh_v2's prefix table copies (C rows of rscvStatusNum_ <= W * L), else 0."""
    if t.comm_alg == "fullmesh_v2":
        return t.cores * t.W * t.L
    return 128 * t.cores * t.cores if t.arch == "arch22" else 0
