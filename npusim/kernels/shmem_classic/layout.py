"""The tiling and window layout of hicann/shmem's classic MoE examples.

dispatch_kernel.cpp:93-106 and main.cpp (DispatchWindowBytes): with seg = W * L segments
of BS * K slots, stride = Align32(H * elem), the dispatch window is

    payload  slots * stride      slot (src * L + le) * BS * K + i: a row
    assist   slots * 32 B        [src, token, k] as three int32 signals
    ready    slots * 32 B        eight int32 ready flags per slot
    count    seg * 32 B          entry le * W + src: [1, count, 0 ...]
    unused   seg * 32 B          allocated by main.cpp, never touched

combine_kernel.cpp / main.cpp (CombineWindowBytes): data BS * K * stride (slot
token * K + k on the token's owner) | status BS * K * 32 B. The two examples are separate
programs, each with its own aclshmem_malloc; in a dispatch_combine run combine's window is
the next allocation, right after dispatch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.kernels.common.heap import Heap
from npusim.kernels.quant import token_dtype
from npusim.kernels.shape import OnShape
from npusim.units import KiB, align32
from npusim.workload.shape import MoeShape

ALIGN = 32  # DISPATCH_ALIGN_BYTES / COMBINE_ALIGN_BYTES
SLOT_INT32 = ALIGN // 4  # DISPATCH_SLOT_INT32: one 32 B signal slot
UB_DMA_MAX_SIZE = 190 * KiB  # the chunk of every mte_put_nbi (UBsize/KB 190 in the CSV)
UB_TMP_OFFSET = 64  # tmp_buff = (__ubuf__ T *)64; status_ub at 32
ASSIST_FIELDS = 3
MAX_LOCAL_EXPERTS = 1024  # DISPATCH_MAX_LOCAL_EXPERT_NUM (stack arrays)

# the examples' --dtype names (data_gen.py dtype_from_name; the CSV's Dtype column)
DTYPE_NAMES = {"int32_t": np.dtype(np.int32), "float16_t": token_dtype("float16"),
               "bfloat16_t": token_dtype("bfloat16")}
WORKLOAD_DTYPE = {"float16": "float16_t", "bfloat16": "bfloat16_t"}


@dataclass(frozen=True)
class ClassicTiling(OnShape):
    """The host side of a call: shape, the examples' dtype, block_dim = W cores."""

    shape: MoeShape
    dtype_name: str  # int32_t | float16_t | bfloat16_t
    counter_mhz: float  # chip.system_counter_mhz, for the profiling frames
    timing_only: bool = False
    ub_size: int = UB_DMA_MAX_SIZE

    @property
    def cores(self) -> int:
        """block_dim = pe (main.cpp): core c serves rank c."""
        return self.shape.W

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPE_NAMES[self.dtype_name]

    @property
    def elem(self) -> int:
        return self.np_dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return self.shape.H * self.elem

    @property
    def stride(self) -> int:
        """payload_stride / data_stride in bytes: Align32(H * sizeof(T))."""
        return align32(self.row_bytes)

    @property
    def max_recv(self) -> int:
        """max_recv_tokens = pe * bs * k: the rows of expand_x."""
        return self.shape.W * self.shape.BS * self.shape.K

    @property
    def window(self) -> ClassicWindow:
        return ClassicWindow(self)


class ClassicWindow(Heap):
    """Every window offset the two kernels use: dispatch's five tensors, then combine's
    two."""

    def __init__(self, t: ClassicTiling) -> None:
        s = t.shape
        self.t = t
        self.per_segment = s.BS * s.K  # max_tokens_per_segment
        segments = s.W * s.L
        slots = segments * self.per_segment
        super().__init__((("payload", slots * t.stride), ("assist", slots * ALIGN),
                          ("ready", slots * ALIGN), ("count", segments * ALIGN),
                          ("unused", segments * ALIGN),
                          ("combine_data", s.BS * s.K * t.stride),
                          ("combine_status", s.BS * s.K * ALIGN)))
        (self.payload, self.assist, self.ready, self.count, self.unused, self.combine_data,
         self.combine_status) = self.start.values()

    # dispatch
    def global_slot(self, src: int, le: int, i: int) -> int:
        return (src * self.t.shape.L + le) * self.per_segment + i

    def payload_at(self, slot: int) -> int:
        return self.payload + slot * self.t.stride

    def assist_at(self, slot: int) -> int:
        return self.assist + slot * ALIGN

    def ready_at(self, slot: int) -> int:
        return self.ready + slot * ALIGN

    def count_at(self, le: int, src: int) -> int:
        return self.count + (le * self.t.shape.W + src) * ALIGN

    # combine
    def data_at(self, slot: int) -> int:
        return self.combine_data + slot * self.t.stride

    def status_at(self, slot: int) -> int:
        return self.combine_status + slot * ALIGN
