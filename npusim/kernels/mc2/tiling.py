"""Host-side tiling of one MoeDistributeDispatchV3 / CombineV3 call (family ``mc2``).

What ``moe_distribute_dispatch_v2_tiling.cpp`` hands the kernel: the shape, the core count
(``GetCoreNumAiv``, from the preset), the UB size, the window, and the derived core roles
and buffer counts of ``MoeDistributeDispatchV2::Init``.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.cann_sample.tiling import split_to_core  # SplitToCore, shared
from npusim.kernels.mc2.reference import Mc2Shape
from npusim.kernels.mc2.window import MAX_UB_SIZE, Mc2Window, align32
from npusim.kernels.quant import align_up, ceil_div

ARCH_OF_PRESET = {"atlas_a3": "arch22", "ascend950": "arch35"}

__all__ = ["ARCH_OF_PRESET", "Mc2Tiling", "split_to_core"]


@dataclass(frozen=True)
class Mc2Tiling:
    shape: Mc2Shape
    dispatch_quant: str  # none | static_int8 | int8
    combine_quant: str  # none | int8
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

    # ---- shape shorthands
    @property
    def W(self) -> int:
        return self.shape.W

    @property
    def world(self) -> int:
        return self.shape.W

    @property
    def K(self) -> int:
        return self.shape.K

    @property
    def H(self) -> int:
        return self.shape.H

    @property
    def L(self) -> int:
        return self.shape.L

    @property
    def S(self) -> int:
        return self.shape.S

    def bs(self, rank: int) -> int:
        return self.shape.bs[rank]

    def is_shared_rank(self, rank: int) -> bool:
        return self.shape.is_shared_rank(rank)

    def status_count(self, rank: int) -> int:
        """rscvStatusNum_: W entries on a shared rank, W * L on a MoE rank."""
        return self.W if self.is_shared_rank(rank) else self.W * self.L

    def local_experts(self, rank: int) -> int:
        return 1 if self.is_shared_rank(rank) else self.L

    def expert_rank(self, e: int) -> int:
        return self.shape.S_r + e // self.L

    def shared_dst(self, rank: int, j: int) -> int:
        return rank % self.shape.R + j * self.shape.R

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
        max_size = max(4 * self.H, ids, mask_bytes, align_up(2 * n, 256))
        used = status + ids + max_size
        if s.special_experts:
            used += align32(4 * bs) + ids
        return used + 2 * max_size  # receiveDataCastFloatBuf + smoothScalesBuf / dst + sub

    def send_buffers(self, rank: int) -> int:
        """bufferNum_: 2, or 1 when the send queues would take the UB past MAX_UB_SIZE."""
        ub_row = self.window.dispatch.ub_row
        queues = 2 * ub_row
        if self.dispatch_quant != "none":
            queues += 2 * align32(2 * self.H)
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
        left = (self.ub_bytes - self.wait_ub_used(rank)) // 32 * 32
        size = left // 2 // 32 * 32
        return size, size // self.window.dispatch.ub_row
