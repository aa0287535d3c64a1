"""The Mc2MoeContext window of MoeDistributeDispatchV3 / CombineV3 (family ``mc2``).

Each rank's CCL buffer (``epHcclBuffer_[rank]`` of ``common/op_kernel/mc2_moe_context.h``) is
the window. Offsets are from its base (``dispatch_v2/op_kernel/mc2_moe_context_holder.h``):
status in [0, 1 MiB) (STATE_SIZE), data from 1 MiB. The data area, totalWin = CCL buffer -
1 MiB - W * 1 KiB (``op_host/op_tiling/moe_distribute_check_win_size.h:165``), is two halves of
totalWin / 2, one per data state (the 0/1 word each core flips per call, ``InitWinState``):
first the combine receive slots, maxBs * (K + S) of them, then the dispatch blocks, one per
(source rank, local expert), each maxBs slots long (``moe_distribute_dispatch_v2.h:464-475``).

Status offsets (``moe_distribute_v2_constant.h``): dispatch entries at state * 384 KiB +
(local_expert * W + src) * 32 (src alone on a shared rank); combine flags at 64 KiB + state *
384 KiB + (token * (K + S) + k) * 32; the per-core dispatch state word at 768 KiB + core * 512,
combine's at 818 KiB + core * 512.

The CCL buffer size: ``workload.ccl_buffer_size`` is what the torch helper
``MoeDistributeBuffer.get_low_latency_ccl_buffer_size`` returns (MB, the HCCL_BUFFSIZE a user
sets); HCCL opens twice that ("hccl按照2*bufferSize大小开设", ``ops/deep_ep.py``), and that is
the operator's ``ccl_buffer_size`` attribute the window is cut from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from npusim.kernels.common.status import (
    CUMSUM_MAX_CORE_NUM,
    SPLIT_BLOCK_DATA_SIZE,
    SPLIT_BLOCK_SIZE,
    STATE_OFFSET,
    STATE_SIZE,
    WIN_ADDR_ALIGN,
    StatusLayout,
)
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2.quant_modes import COMBINE_MX, combine_mx_bytes, record_layout
from npusim.units import align32, align512, align_up, ceil_div

KiB = 1024
MiB = 1024 * KiB

EP_RANK_OFFSET_STEP = 1 * KiB  # per-rank reservation subtracted from totalWin
TRIPLET_BYTES = 12  # (src rank, token, k) int32
MAX_OUT_DTYPE_SIZE = 2  # the host check sizes every token as 2 bytes per element
SCALE_EXPAND_IDX_BUFFER = 44  # 32 B scale + 12 B triplet in the host check
MAX_UB_SIZE = 170 * KiB  # dispatch send queues single-buffered above this UB use

ARCHES = ("arch22", "arch35")  # A3 (dav-2201) and the 950 (dav-3510)


@dataclass(frozen=True)
class DispatchSlot:
    """One dispatch window slot as the kernel fills it (``QuantInit``, ``FillTriple``).

    [data: out_bytes][pad to 32][fp32 scale (int8 mode 2)][pad to 32][triplet 12 B]
    [fp32 expert scale, with expert_scales]; the put moves ``moved`` bytes; slots are
    ``slot`` = Align512(moved) apart; a UB row is ``ub_row`` = Align32(moved)."""

    out_bytes: int  # H * sizeof(expand_x element)
    scale_offset: int | None  # the scales (int8: one fp32; the 950's FP8 modes), else None
    triplet_offset: int
    expert_scale_offset: int | None
    moved: int  # hScaleIdxSize_
    slot: int  # hAlignWinSize_
    ub_row: int  # hOutAlignUbSize_
    blocks: int = 0  # fullmesh_v2: 512 B blocks per slot (blockCntPerToken_); 0: unpacked
    scale_bytes: int = 0  # scaleOutBytes_: 4 (int8), 4 ceil(H/128) (pergroup), Align2(H/32)


def dispatch_slot(h: int, quant: str, expert_scales: bool = False) -> DispatchSlot:
    """The slot of ``moe_distribute_dispatch_v2.h:413-423`` for bf16/fp16 tokens (the
    950's FP8 and MXFP4 modes: QuantInit's layouts, npusim.kernels.mc2.quant_modes)."""
    out_bytes = qm.out_bytes(h, quant)
    h_out_align = align32(out_bytes)
    scale_offset = None
    scale_bytes = 0
    if quant in qm.PER_TOKEN_MODES:
        scale_offset = h_out_align
        scale_bytes = 4
        h_out_align += 4
    elif qm.vf_mode(quant):
        _, scale_offset, scale_bytes = record_layout(h, quant)
        h_out_align = scale_offset + scale_bytes
    triplet = align32(h_out_align)
    moved = triplet + TRIPLET_BYTES
    es = None
    if expert_scales:
        es = moved
        moved += 4
    return DispatchSlot(out_bytes, scale_offset, triplet, es, moved, align512(moved),
                        align32(moved), scale_bytes=scale_bytes)


def full_mesh_slot(h: int, quant: str, expert_scales: bool = False) -> DispatchSlot:
    """fullmesh_v2's slot (``SetTilingDataAndCal``, full_mesh.h): the record of
    :func:`dispatch_slot` (data, scale, triplet at tokenQuantAlign_, expert scale after it)
    with 32 B for the triplet (hOutSizeAlign_), cut into 480 B pieces, each in a 512 B
    block whose last 32 B hold float 1.0: the slot is blockCntPerToken_ * 512 B and the
    put moves all of it; in UB, once the flags are stripped, rows are blocks * 480 apart."""
    rec = dispatch_slot(h, quant, expert_scales)
    blocks = ceil_div(rec.triplet_offset + STATE_OFFSET, SPLIT_BLOCK_DATA_SIZE)
    return replace(rec, moved=blocks * SPLIT_BLOCK_SIZE, slot=blocks * SPLIT_BLOCK_SIZE,
                   ub_row=blocks * SPLIT_BLOCK_DATA_SIZE, blocks=blocks)


def combine_slot_bytes(h: int, arch: str) -> int:
    """Combine receive slot: Align512(2H) on A3; ceil(2H / 480) * 512 on the 950, whose
    combine carries its flag in every 512 B block (``moe_distribute_dispatch_v2.h:467-471``)."""
    if arch == "arch35":
        return ceil_div(2 * h, SPLIT_BLOCK_DATA_SIZE) * WIN_ADDR_ALIGN
    return align512(2 * h)


# --------------------------------------------------------------------------- host sizing


@dataclass(frozen=True)
class BufferNeed:
    """The host check's terms (``CheckActualWinSize``) for one shape."""

    max_bs: int
    token_need_dispatch: int  # Align512(Align32(2H) + 44)
    token_need_combine: int  # Align512(2H)
    W: int
    L: int
    K: int
    S: int
    per_rank: int  # W * 1 KiB on the 950, 0 on A3

    @property
    def actual_bytes(self) -> int:
        d = self.max_bs * self.token_need_dispatch * self.W * self.L
        c = self.max_bs * self.token_need_combine * (self.K + self.S)
        return (d + c) * 2 + self.per_rank

    @property
    def needed_mb(self) -> int:
        """The CCL buffer the check needs, with the V3 status MiB, in whole MB."""
        return ceil_div(self.actual_bytes + STATE_SIZE, MiB)

    @property
    def least_ccl_mb(self) -> int:
        """The smallest ccl_buffer_size (HCCL opens twice it) the check accepts."""
        return ceil_div(self.actual_bytes + STATE_SIZE, 2 * MiB)

    def formula(self) -> str:
        extra = f" + W {self.W} * 1 KiB" if self.per_rank else ""
        return (f"((maxBs {self.max_bs} * tokenNeedSizeDispatch {self.token_need_dispatch} * "
                f"W {self.W} * L {self.L}) + (maxBs {self.max_bs} * tokenNeedSizeCombine "
                f"{self.token_need_combine} * (K {self.K} + S {self.S}))) * 2{extra}")


def buffer_need(max_bs: int, h: int, W: int, L: int, K: int, S: int, arch: str,
                comm_alg: str = "fullmesh_v1") -> BufferNeed:
    """tokenNeedSizeDispatch is Align512(tokenActualLen), or for fullmesh_v2
    ceil(tokenActualLen / 480) * 512 (``CheckWinSize``, moe_distribute_check_win_size.h)."""
    tok_actual = align32(h * MAX_OUT_DTYPE_SIZE) + SCALE_EXPAND_IDX_BUFFER
    if comm_alg == "fullmesh_v2":
        tok_dispatch = ceil_div(tok_actual, SPLIT_BLOCK_DATA_SIZE) * WIN_ADDR_ALIGN
    else:
        tok_dispatch = align512(tok_actual)
    return BufferNeed(max_bs, tok_dispatch, align512(h * MAX_OUT_DTYPE_SIZE), W, L, K,
                      S, W * EP_RANK_OFFSET_STEP if arch == "arch35" else 0)


def low_latency_ccl_buffer_mb(max_bs: int, h: int, W: int, L: int, K: int, S: int,
                              comm_alg: str = "fullmesh_v1") -> int:
    """``get_low_latency_ccl_buffer_size`` (its ``comm_alg`` picks the dispatch token size):
    Align2(ceil((2 * (dispatch + combine) + 1 MB) / 1 MB)) / 2 MB, the HCCL_BUFFSIZE to set
    (HCCL opens twice this)."""
    need = buffer_need(max_bs, h, W, L, K, S, "arch22", comm_alg)
    total = need.actual_bytes + MiB
    return align_up(ceil_div(total, MiB), 2) // 2


def default_ccl_buffer_mb(max_bs: int, h: int, W: int, L: int, K: int, S: int, arch: str,
                          comm_alg: str = "fullmesh_v1") -> int:
    """``workload.ccl_buffer_size: 0``: the helper's value, or the smallest size the
    operator's check on ``arch`` accepts when that is more. The helper leaves out the 950's
    W * 1 KiB, so its value falls short whenever 2 * (dispatch + combine) + 1 MB lands
    within W KiB of an even number of MB (BS 32, H 7168, W 8, L 4, K 8: exactly 38 MiB)."""
    need = buffer_need(max_bs, h, W, L, K, S, arch, comm_alg)
    return max(low_latency_ccl_buffer_mb(max_bs, h, W, L, K, S, comm_alg), need.least_ccl_mb)


class CclBufferTooSmall(ValueError):
    """The CCL buffer cannot hold the window; the message names the MB needed and why."""


# --------------------------------------------------------------------------- window


@dataclass(frozen=True)
class Mc2Window:
    """Offsets of everything one V3 call keeps in a rank's CCL buffer (bytes from its base)."""

    W: int
    max_bs: int
    H: int
    K: int
    L: int
    S: int
    dispatch: DispatchSlot
    combine_slot: int
    ccl_bytes: int
    cores: int
    # the combine kernel's slot stride when it differs from the area's slot (the 950's INT8:
    # hAlignWinSize_ of the quantised bytes; the area stays as dispatch places it); 0: same
    combine_stride: int = 0
    full_mesh: bool = False  # fullmesh_v2: its count cores' hand-off areas are in use

    @property
    def slots_per_token(self) -> int:
        return self.K + self.S

    @property
    def total_win(self) -> int:
        """totalWinSizeEp: CCL buffer - 1 MiB - W * 1 KiB."""
        return self.ccl_bytes - STATE_SIZE - self.W * EP_RANK_OFFSET_STEP

    @property
    def half(self) -> int:
        return self.total_win // 2

    @cached_property
    def status(self) -> StatusLayout:
        """The status MiB, at the CCL buffer's base."""
        return StatusLayout(0, self.W, self.slots_per_token)

    # ---- status region
    def dispatch_status(self, state: int, entry: int) -> int:
        """32 B (fp32 flag 1.0, int32 count) for status entry ``entry`` = local * W + src
        (= src on a shared rank)."""
        return self.status.dispatch_status(state, entry)

    def combine_flag(self, state: int, token: int, k: int) -> int:
        return self.status.combine_flag(state, token, k)

    def dispatch_state_word(self, core: int) -> int:
        return self.status.dispatch_state_word(core)

    def combine_state_word(self, core: int) -> int:
        return self.status.combine_state_word(core)

    # ---- data region
    def data_half(self, state: int) -> int:
        return STATE_SIZE + state * self.half

    def combine_slot_offset(self, state: int, token: int, k: int) -> int:
        return self.data_half(state) + (token * self.slots_per_token + k) * self.combine_step

    @property
    def combine_step(self) -> int:
        """The combine kernel's slot stride (hAlignWinSize_)."""
        return self.combine_stride or self.combine_slot

    @property
    def combine_area(self) -> int:
        return self.max_bs * self.slots_per_token * self.combine_slot

    @property
    def block_bytes(self) -> int:
        """expertPerSizeOnWin_: maxBs slots."""
        return self.max_bs * self.dispatch.slot

    def dispatch_block(self, state: int, block: int) -> int:
        """Block ``block`` = src * L + local on a MoE rank, src on a shared rank."""
        return self.data_half(state) + self.combine_area + block * self.block_bytes

    def dispatch_slot_offset(self, state: int, block: int, index: int) -> int:
        return self.dispatch_block(state, block) + index * self.dispatch.slot

    @property
    def dispatch_area(self) -> int:
        return self.W * self.L * self.block_bytes

    def put(self, ctx: Any, pe: int, offset: int, buf: Any, nbytes: int, src_offset: int = 0,
            name: str = "put") -> Any:
        """A remote write from UB into rank pe's window at `offset`: HCCL's DataCopyPad to
        the peer's windowsIn (one MTE3, not waited for). A context whose kernels write
        otherwise (SHMEM's put calls) overrides it."""
        return ctx.put(pe, offset, buf, nbytes, src_offset, name=name)

    def regions(self, state: int = 0) -> dict[str, tuple[int, int]]:
        """[start, end) of each region of one data state (for the window sanitiser)."""
        st = self.status
        d = self.data_half(state)
        return {
            "dispatch_status": st.dispatch_status_zone(state, self.W * self.L),
            "combine_flags": st.combine_flags_zone(state, self.max_bs),
            "dispatch_state_words": st.dispatch_state_words_zone(self.cores),
            "combine_state_words": st.combine_state_words_zone(self.cores),
            "combine_recv": (d, d + self.combine_area),
            "dispatch_data": (d + self.combine_area,
                              d + self.combine_area + self.dispatch_area),
            **(self.full_mesh_regions() if self.full_mesh else {}),
        }

    def full_mesh_regions(self) -> dict[str, tuple[int, int]]:
        """fullmesh_v2's count-core hand-offs in the own rank's status MiB (no data state):
        partial sums at 868 KiB (n_cs rows of n_cs entries) and the ready flags at 876 KiB
        (a row of n_cs entries per core); sized for the largest n_cs, 16."""
        n = CUMSUM_MAX_CORE_NUM
        return {"cumsum_partials": self.status.cumsum_cal_zone(n),
                "cumsum_flags": self.status.cumsum_flag_zone(n, self.cores)}


def a5_int8_combine_bytes(h: int) -> int:
    """The 950's INT8 combine bytes per row (commDataBytes_): Align32(H) int8 and
    Align128(H) / 8 scales in the token dtype (QuantInit on arch 3510 sizes the scales by
    the fused dequantisation's 512 B float tail, combine_v2_quant.h:93-96)."""
    return align32(h) + 2 * (ceil_div(h, 128) * 128 // 8)


def combine_stride_bytes(h: int, arch: str, combine_quant: str) -> int:
    """hAlignWinSize_ of the combine kernel when it is not the area's slot, else 0: on the
    950 with INT8 or MXFP8, ceil(commDataBytes_ / 480) * 512 (a5_mte.h:509-520)."""
    if arch == "arch35" and combine_quant == "int8":
        return ceil_div(a5_int8_combine_bytes(h), SPLIT_BLOCK_DATA_SIZE) * WIN_ADDR_ALIGN
    if arch == "arch35" and combine_quant in COMBINE_MX:  # commDataBytes_ of QuantMxFp8
        return ceil_div(combine_mx_bytes(h), SPLIT_BLOCK_DATA_SIZE) * WIN_ADDR_ALIGN
    return 0


def mc2_window(max_bs: int, h: int, W: int, L: int, K: int, S: int, quant: str, arch: str,
               ccl_mb: int, cores: int, expert_scales: bool = False,
               combine_quant: str = "none", comm_alg: str = "fullmesh_v1",
               default: bool = False) -> Mc2Window:
    """The window of one call, after the operator's fit check and npusim's layout check.

    Raises :class:`CclBufferTooSmall` with the operator's terms ("HCCL_BUFFSIZE ... is too
    SMALL ... NEEDED=...MB") when ``2 * ccl_mb`` MB minus the status MiB cannot hold the
    check's need, or when the kernel's own slots overrun a data half the check let through
    (the 950's 480/512 combine slots are larger than the check's Align512(2H)).
    ``default``: ccl_mb is npusim's default (``ccl_buffer_size: 0``), which then grows to
    what the slots need, so a default is never refused by the code that follows it."""
    if arch not in ARCHES:
        raise ValueError(f"arch {arch!r}; allowed: {', '.join(ARCHES)}")
    ccl_bytes = 2 * ccl_mb * MiB
    need = buffer_need(max_bs, h, W, L, K, S, arch, comm_alg)
    helper = low_latency_ccl_buffer_mb(max_bs, h, W, L, K, S, comm_alg)
    if need.actual_bytes > ccl_bytes - STATE_SIZE:
        raise CclBufferTooSmall(
            f"{ccl_mb} MB (HCCL opens a {2 * ccl_mb} MB CCL buffer) is too SMALL: NEEDED = "
            f"{need.formula()} + 1 MB status = {need.needed_mb} MB of CCL buffer, so "
            f"ccl_buffer_size >= {need.least_ccl_mb} MB "
            f"(get_low_latency_ccl_buffer_size gives {helper})")
    v2 = comm_alg == "fullmesh_v2"
    slot = (full_mesh_slot if v2 else dispatch_slot)(h, quant, expert_scales)
    win = Mc2Window(W, max_bs, h, K, L, S, slot, combine_slot_bytes(h, arch), ccl_bytes, cores,
                    combine_stride_bytes(h, arch, combine_quant), v2)
    used = win.combine_area + win.dispatch_area
    if used > win.half:
        mb = ceil_div(2 * used + STATE_SIZE + W * EP_RANK_OFFSET_STEP, 2 * MiB)
        if default and mb > ccl_mb:
            return mc2_window(max_bs, h, W, L, K, S, quant, arch, mb, cores, expert_scales,
                              combine_quant, comm_alg)
        raise CclBufferTooSmall(
            f"{ccl_mb} MB passes the operator's check, but the kernel's slots (combine "
            f"{win.combine_slot} B, dispatch {win.dispatch.slot} B) fill {used} B of a data "
            f"half of totalWin/2 = {win.half} B and would overrun it; ccl_buffer_size >= "
            f"{mb} MB")
    return win
