"""Byte layouts the dispatch/combine kernels agree on: token records and the symmetric window.

Every number here is read from the CANN sample (moe_dispatch_and_combine_story, include/
moe_distribute_dispatch*.h, moe_distribute_combine.h, moe_distribute_comm.h) or, for the
per-token INT8 record, from ops-transformer moe_distribute_dispatch_v2_quant.h. Kernels
compute addresses from these helpers so a layout change is made in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from npusim.kernels.common.status import (
    CUMSUM_MAX_CORE_NUM,
    SPLIT_BLOCK_DATA_SIZE,
    SPLIT_BLOCK_SIZE,
    StatusLayout,
)
from npusim.kernels.quant import MXFP8_BLOCK, int8_block_scale_count, mxfp8_scale_count
from npusim.units import (
    align32,
    align256,
    align512,
    ceil_div,
)
from npusim.workload.shape import MoeShape

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

UB_ALIGN = 32
"""UB block / status-entry size in bytes."""
TRIPLET_INTS = 3
"""(src_rank, token, k) carried by every dispatch record and output as assist info."""

SPLIT_BLOCK_BYTES = SPLIT_BLOCK_SIZE
"""A dispatch slot is cut into 512-byte blocks ..."""
SPLIT_BLOCK_DATA = SPLIT_BLOCK_DATA_SIZE
"""... of which 480 carry record bytes and the last 32 hold eight fp32 1.0 'arrived' flags."""

WINDOW_BYTES = 1 * GiB
STATUS_REGION = 1022 * MiB
"""The sample keeps the status MiB (npusim.kernels.common.status) at 1022 MiB."""
DATA_HALF = 512 * MiB  # symMemSize / BUFFER_NUM: dispatch data area of state 1 starts here
UB_USABLE_FOR_LOCAL_COPY = 240 * KiB  # MAX_UB_SIZE of the local-copy batches

QUANT_KINDS = ("none", "int8", "mxfp8")


def _itemsize(dtype: str | np.dtype) -> int:
    if isinstance(dtype, str) and dtype in ("float16", "bfloat16"):
        return 2
    return np.dtype(dtype).itemsize


@dataclass(frozen=True)
class DispatchRecordLayout:
    """One dispatch put: [payload][scales] pad32, [triplet] pad32, spread over 480/512 blocks."""

    h: int
    quant: str
    payload_bytes: int  # bytes reserved for token data (already aligned)
    scale_offset: int  # where the scale(s) start inside the record
    scale_bytes: int  # 0 (none), 4 (int8: one fp32), Align2(ceil(H/32)) (mxfp8)
    triplet_offset: int  # 32-byte aligned; three int32 (src_rank, token, k)
    record_bytes: int  # triplet_offset + 32
    blocks: int  # ceil(record_bytes / 480)
    slot_bytes: int  # blocks * 512: the stride of slots in the window

    @property
    def data_bytes(self) -> int:
        """Meaningful token bytes (H elements in the wire format), copied to expand_x."""
        return self.h * (2 if self.quant == "none" else 1)


def dispatch_record_layout(h: int, quant: str, dtype: str | np.dtype = "float16"):
    """Record geometry for hidden size ``h``; ``dtype`` is the token dtype (unquantised case).

    H=7168: mxfp8 7392 + 32 = 7424 B, 16 blocks, 8192 B slot; fp16 14368 B, 30 blocks, 15360 B;
    int8 7232 B, 16 blocks, 8192 B.
    """
    if quant == "mxfp8":
        payload = align256(h)  # Align256(H) fp8 bytes (the vector unit writes whole 256 B)
        scale_off, scale_bytes = payload, mxfp8_scale_count(h)
    elif quant == "int8":
        payload = align32(h)
        scale_off, scale_bytes = payload, 4
    elif quant == "none":
        payload = align32(h * _itemsize(dtype))
        scale_off, scale_bytes = payload, 0
    else:
        raise ValueError(f"quant {quant!r} not one of {QUANT_KINDS}")
    triplet = align32(scale_off + scale_bytes)
    record = triplet + UB_ALIGN
    blocks = ceil_div(record, SPLIT_BLOCK_DATA)
    return DispatchRecordLayout(
        h=h,
        quant=quant,
        payload_bytes=payload,
        scale_offset=scale_off,
        scale_bytes=scale_bytes,
        triplet_offset=triplet,
        record_bytes=record,
        blocks=blocks,
        slot_bytes=blocks * SPLIT_BLOCK_BYTES,
    )


def pack_record_to_slot(record: np.ndarray, layout: DispatchRecordLayout) -> np.ndarray:
    """Spread a record (uint8, <= record_bytes) over the slot's blocks and set every flag.

    Block i carries record bytes [480 i, 480 i + 480) followed by 8 x fp32 1.0, which is what
    the kernel's two strided vector copies produce in a buffer pre-filled with 1.0.
    """
    rec = np.zeros(layout.blocks * SPLIT_BLOCK_DATA, dtype=np.uint8)
    record = np.asarray(record, dtype=np.uint8).reshape(-1)
    if record.size > layout.record_bytes:
        raise ValueError(f"record of {record.size} B exceeds {layout.record_bytes} B")
    rec[: record.size] = record
    slot = np.empty((layout.blocks, SPLIT_BLOCK_BYTES), dtype=np.uint8)
    slot[:, :SPLIT_BLOCK_DATA] = rec.reshape(layout.blocks, SPLIT_BLOCK_DATA)
    slot[:, SPLIT_BLOCK_DATA:] = np.ones(8, dtype="<f4").view(np.uint8)
    return slot.reshape(-1)


def unpack_slot(slot: np.ndarray, layout: DispatchRecordLayout) -> tuple[np.ndarray, bool]:
    """(record bytes, arrived) of a slot; arrived = every block's first flag float is 1.0."""
    s = np.asarray(slot, dtype=np.uint8).reshape(layout.blocks, SPLIT_BLOCK_BYTES)
    flags = np.ascontiguousarray(s[:, SPLIT_BLOCK_DATA : SPLIT_BLOCK_DATA + 4]).view("<f4")
    rec = s[:, :SPLIT_BLOCK_DATA].reshape(-1)[: layout.record_bytes].copy()
    return rec, bool(np.all(flags == 1.0))


@dataclass(frozen=True)
class CombineRecordLayout:
    """What combine puts per (token, k): the row (or INT8 row + scales) in a fixed slot."""

    h: int
    quant: str
    send_bytes: int  # bytes of one put
    scale_offset: int  # int8: scales follow the Align32(H) int8 bytes
    scale_count: int  # int8: Align16(H)/8 scales in the token dtype
    slot_bytes: int  # Align512(H * 2), independent of quantisation


def combine_record_layout(h: int, quant: str, dtype: str | np.dtype = "float16"):
    """H=7168 fp16: 14336 B unquantised, 8960 B INT8 (7168 + 2 * 896); slot 14336 B."""
    item = _itemsize(dtype)
    slot = align512(h * item)
    if quant == "none":
        return CombineRecordLayout(h, quant, h * item, 0, 0, slot)
    if quant == "int8":
        n = int8_block_scale_count(h)
        return CombineRecordLayout(h, quant, align32(h) + item * n, align32(h), n, slot)
    raise ValueError(f"combine quant {quant!r} not one of ('none', 'int8')")


def cumsum_core_count(n_experts: int, cores: int, W: int, L: int) -> int:
    """Cores that send counts and form prefix sums: E/32 clamped to [1, cores/2, 16, W*L]."""
    return min(max(n_experts // 32, 1), cores // 2, CUMSUM_MAX_CORE_NUM, W * L)


def shared_send_core_count(cores: int, K: int, S: int) -> int:
    """Cores that send to the shared experts (ops-transformer V2 sharedUsedAivNum):
    max(1, C*S // (K+S)) when S > 0, else 0. The cum-sum cores are counted from the rest."""
    return max(1, cores * S // (K + S)) if S else 0


@dataclass(frozen=True)
class WindowLayout:
    """Offsets (from the window base) of everything dispatch/combine keep in the 1 GiB window.

    ``state`` is the per-call 0/1 data state that double-buffers dispatch's data and status
    areas. Combine (sample HEAD) always uses state 0: receive slots at the window base and
    flags at 1022 MiB + 64 KiB.

    Shared experts (ops-transformer V2): the first ``shared_ranks`` ranks hold the
    ``shared_experts`` shared experts; each token has K + S combine slots and flags (slot
    K + j for shared expert j), and a shared rank's dispatch grid is one BS-slot block per
    source rank (status entry = source rank). With S = 0 everything is the sample's.
    """

    W: int
    BS: int
    H: int
    K: int
    L: int
    quant: str = "mxfp8"
    dtype: str = "float16"
    cores: int = 64
    window_bytes: int = WINDOW_BYTES
    shared_experts: int = 0  # S
    shared_ranks: int = 0  # S_r: ranks 0..S_r-1 hold the shared experts

    @classmethod
    def of(cls, shape: MoeShape, quant: str, cores: int, window_bytes: int = WINDOW_BYTES
           ) -> WindowLayout:
        return cls(shape.W, shape.BS, shape.H, shape.K, shape.L, quant, shape.dtype, cores,
                   window_bytes, shape.S, shape.S_r)

    @property
    def n_experts(self) -> int:
        """E: MoE experts, L on each of the W - S_r MoE ranks."""
        return (self.W - self.shared_ranks) * self.L

    @property
    def slots_per_token(self) -> int:
        """K + S combine receive slots (and flags) per token."""
        return self.K + self.shared_experts

    @property
    def record(self) -> DispatchRecordLayout:
        return dispatch_record_layout(self.H, self.quant, self.dtype)

    @property
    def slot_bytes(self) -> int:
        return self.record.slot_bytes

    @property
    def combine_slot_bytes(self) -> int:
        return align512(self.H * _itemsize(self.dtype))

    @property
    def n_cumsum(self) -> int:
        rest = self.cores - shared_send_core_count(self.cores, self.K, self.shared_experts)
        return cumsum_core_count(self.n_experts, rest, self.W, self.L)

    @cached_property
    def status(self) -> StatusLayout:
        """The status MiB at 1022 MiB (combine uses data state 0 only)."""
        return StatusLayout(STATUS_REGION, self.W, self.slots_per_token)

    # ---- dispatch status region
    def dispatch_status_entry(self, state: int, local_expert: int, src_rank: int) -> int:
        """32 B entry: fp32 1.0 flag, int32 count; index local_expert * W + src_rank."""
        return self.status.dispatch_status(state, local_expert * self.W + src_rank)

    def data_state_word(self, core: int) -> int:
        """uint32 0/1 flipped by each core every dispatch call (combine does not flip it)."""
        return self.status.dispatch_state_word(core)

    def cumsum_handoff_entry(self, writer: int, reader: int) -> int:
        """32 B entry (fp32 partial sum, fp32 1.0 flag) written by cum-sum core ``writer``
        for cum-sum core ``reader`` (both indices among the cum-sum cores)."""
        return self.status.cumsum_cal(self.n_cumsum, writer, reader)

    def cumsum_ready_flag(self, core: int, cumsum_core: int) -> int:
        """32 B of int32 1 from cum-sum core ``cumsum_core`` telling ``core`` the table is ready."""
        return self.status.cumsum_flag(self.n_cumsum, core, cumsum_core)

    # ---- combine
    def combine_flag(self, token: int, k: int) -> int:
        """32 B of eight fp32 1.0 per received (token, k) row; k in [0, K + S)."""
        return self.status.combine_flag(0, token, k)

    def combine_slot(self, token: int, k: int) -> int:
        return (token * self.slots_per_token + k) * self.combine_slot_bytes

    @property
    def combine_area_bytes(self) -> int:
        return self.BS * self.slots_per_token * self.combine_slot_bytes

    # ---- dispatch data region
    def dispatch_data_base(self, state: int) -> int:
        return state * DATA_HALF + self.combine_area_bytes

    def dispatch_block(self, state: int, src_rank: int, local_expert: int) -> int:
        """Start of the BS-slot block that ``src_rank`` fills for ``local_expert``."""
        idx = src_rank * self.L + local_expert
        return self.dispatch_data_base(state) + idx * self.BS * self.slot_bytes

    def dispatch_slot(self, state: int, src_rank: int, local_expert: int, index: int) -> int:
        return self.dispatch_block(state, src_rank, local_expert) + index * self.slot_bytes

    def shared_block(self, state: int, src_rank: int) -> int:
        """On a shared rank: the BS-slot block ``src_rank`` fills (row = token index)."""
        return self.dispatch_data_base(state) + src_rank * self.BS * self.slot_bytes

    @property
    def dispatch_area_bytes(self) -> int:
        return self.W * self.L * self.BS * self.slot_bytes

    def regions(self) -> dict[str, tuple[int, int]]:
        """[start, end) of every region, for checks and for the window sanitiser."""
        r = {"combine_recv": (0, self.combine_area_bytes)}
        st = self.status
        for s in (0, 1):
            b = self.dispatch_data_base(s)
            r[f"dispatch_data_{s}"] = (b, b + self.dispatch_area_bytes)
            r[f"dispatch_status_{s}"] = st.dispatch_status_zone(s, self.W * self.L)
        r["combine_flags"] = st.combine_flags_zone(0, self.BS)
        r["data_state_words"] = st.dispatch_state_words_zone(self.cores)
        r["cumsum_handoff"] = st.cumsum_cal_zone(self.n_cumsum)
        r["cumsum_ready"] = st.cumsum_flag_zone(self.n_cumsum, self.cores)
        return r

    def validate(self) -> None:
        """Raise ValueError if regions overlap or leave the window (the kernels do not check)."""
        regs = sorted(
            ((n, ab) for n, ab in self.regions().items() if ab[1] > ab[0]), key=lambda kv: kv[1][0]
        )
        for name, (a, b) in regs:
            if b > self.window_bytes:
                raise ValueError(
                    f"window region {name} [{a:#x}, {b:#x}) exceeds the "
                    f"{self.window_bytes} B window (W={self.W}, BS={self.BS}, H={self.H}, "
                    f"K={self.K}, L={self.L}, quant={self.quant})"
                )
        for (n1, (a1, b1)), (n2, (a2, b2)) in zip(regs, regs[1:], strict=False):
            if a2 < b1:
                raise ValueError(
                    f"window regions {n1} [{a1:#x}, {b1:#x}) and {n2} [{a2:#x}, {b2:#x}) overlap "
                    f"(W={self.W}, BS={self.BS}, H={self.H}, K={self.K}, L={self.L}, "
                    f"quant={self.quant})"
                )
        if self.dispatch_data_base(1) + self.dispatch_area_bytes > STATUS_REGION:
            raise ValueError("dispatch data area of state 1 runs into the status region")


__all__ = [
    "MXFP8_BLOCK",
    "CombineRecordLayout",
    "DispatchRecordLayout",
    "WindowLayout",
    "combine_record_layout",
    "cumsum_core_count",
    "dispatch_record_layout",
    "pack_record_to_slot",
    "shared_send_core_count",
    "unpack_slot",
]
