"""The host side of the TileLang kernels: their JIT parameters, core split and windows.

moe_dispatch_kernel(Bs, H, K, ep_world_size, local_expert_num, rank, ub_size,
ai_core_num) and moe_combine_kernel(Bs, M, H, K, ep_world_size, local_expert_num, rank,
ai_core_num) are compiled per call; aiv_num = 2 * ai_core_num. The four windows are the
shapes the article's worker gives aclshmem_create_tensor:

    win_data        [total_expert_num * Bs, ub_size] bf16   row (src * L + le) * Bs + repeat
    win_status      [total_expert_num, 8] float             entry le * W + src: [flag, count]
    combine_data    [Bs * K, H] bf16                        row token * K + k
    combine_status  [Bs * K, 8] float                       eight 1.0 flags per row

Each is its own heap allocation; npusim places them one after the other in the
symmetric window, each start aligned to HEAP_ALIGN bytes (assumed: aclshmem's heap
alignment is not in the article).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.kernels.common.article import ArticleTiling
from npusim.kernels.common.heap import Heap
from npusim.kernels.quant import token_dtype
from npusim.units import align32, align512, ceil_div
from npusim.workload.shape import MoeShape

BF16 = token_dtype("bfloat16")
FLOAT_ALIGN = 8  # ub_float_int32_align / float_align_ub: eight 4 B words per status entry
STATUS_BYTES = 4 * FLOAT_ALIGN
ASSIST = 3  # assist_size: the (rank, token, k) triple
QUANT_BYTES = 32  # the row's reserved quantisation bytes (x_ub's "32")
TRIPLE_BYTES = 4 * ASSIST  # x_ub's "12"
UB_ALIGN = 32  # UB allocations start on 32 B
HEAP_ALIGN = 512


def default_ub_size(H: int) -> int:
    """The worker's ub_size: Align512(Align32(2H) + 32 + 12) / 2 bf16 elements."""
    return align512(align32(2 * H) + QUANT_BYTES + TRIPLE_BYTES) // 2


def ub_bytes(sizes: list[int]) -> int:
    """UB taken by a kernel's alloc_ub list (each 32 B aligned, no reuse assumed)."""
    return sum(align32(max(n, 0)) for n in sizes)


@dataclass(frozen=True)
class TileLangTiling(ArticleTiling):
    shape: MoeShape
    block_dim: int  # ai_core_num: the blocks of T.Kernel(ai_core_num, is_npu=True)
    ub_size: int  # bf16 elements of a win_data row
    timing_only: bool = False

    @property
    def total_expert_num(self) -> int:
        return self.W * self.L

    @property
    def status_per_core(self) -> int:
        return ceil_div(self.total_expert_num, self.aiv_num)

    @property
    def row_bytes(self) -> int:
        return self.ub_size * 2

    @property
    def x_ub_elems(self) -> int:
        """x_ub = alloc_ub([H + (32 + 12) // 2]): the row, its quant bytes and triple."""
        return self.shape.H + (QUANT_BYTES + TRIPLE_BYTES) // 2

    @property
    def triple_at(self) -> int:
        """Byte offset of the triple in a row: int32 element (H + 16) / 2."""
        return 4 * ((self.shape.H + 16) // 2)

    def dispatch_ub(self) -> int:
        s, spc, a = self.shape, self.status_per_core, self.aiv_num
        n = s.BS * s.K
        return ub_bytes([2 * self.x_ub_elems, 2 * s.H, 4 * n, 4 * n, 4 * n, 4 * n,
                         spc * STATUS_BYTES, spc * STATUS_BYTES, spc * STATUS_BYTES, 4 * spc,
                         4 * spc, a * UB_ALIGN, 4 * a, STATUS_BYTES, STATUS_BYTES,
                         STATUS_BYTES, STATUS_BYTES, TRIPLE_BYTES, 4, 4, 4, 4, 4,
                         spc * STATUS_BYTES, 4, 4, (spc - 1) * STATUS_BYTES, 4 * (spc - 1)])

    def combine_ub(self) -> int:
        s = self.shape
        token_per_core = ceil_div(self.max_recv, self.aiv_num)
        return ub_bytes([2 * s.H, 4 * ASSIST * token_per_core, STATUS_BYTES,
                         *[s.K * STATUS_BYTES] * 4, 2 * s.H, 4 * s.H, 4 * s.H, 2 * s.H,
                         4 * s.BS * s.K, 4, 4])

    @property
    def window(self) -> TileLangWindow:
        return TileLangWindow(self)


class TileLangWindow(Heap):
    """Offsets of the four aclshmem tensors in the symmetric window."""

    def __init__(self, t: TileLangTiling) -> None:
        s = t.shape
        self.t = t
        super().__init__((("win_data", t.total_expert_num * s.BS * t.row_bytes),
                          ("win_status", t.total_expert_num * STATUS_BYTES),
                          ("combine_data", s.BS * s.K * s.token_bytes),
                          ("combine_status", s.BS * s.K * STATUS_BYTES)), HEAP_ALIGN)
        self.win_data, self.win_status, self.combine_data, self.combine_status = \
            self.start.values()

    def data_row(self, row: int) -> int:
        return self.win_data + row * self.t.row_bytes

    def status_entry(self, entry: int) -> int:
        return self.win_status + entry * STATUS_BYTES

    def combine_row(self, row: int) -> int:
        return self.combine_data + row * self.t.shape.token_bytes

    def combine_flag(self, row: int) -> int:
        return self.combine_status + row * STATUS_BYTES


def f32_bits(n: int) -> float:
    """T.reinterpret("float", n): the float whose bits are the int32 n."""
    return float(np.array([n], np.int32).view(np.float32)[0])
