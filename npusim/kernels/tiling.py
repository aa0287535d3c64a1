"""Tiling shared by the dispatch and combine programs: the host-side arguments of a call.

Like the CANN sample's tiling struct, this is plain data the host fills in; the kernel
programs derive every size from it. It knows nothing of scenarios or YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from npusim.kernels.layout import (
    DispatchRecordLayout,
    WindowLayout,
    combine_record_layout,
    cumsum_core_count,
    dispatch_record_layout,
)


@dataclass(frozen=True)
class MoeTiling:
    world: int  # W, ranks in the EP group
    bs: int  # tokens per rank
    h: int  # hidden size
    k: int  # top-k
    experts_per_rank: int  # L
    cores: int  # AIV cores the kernel is launched on
    dtype: str = "float16"  # token dtype: float16 | bfloat16
    dispatch_quant: str = "mxfp8"  # none | int8 (per token) | mxfp8
    combine_quant: str = "none"  # none | int8 (block)
    expert_token_nums_type: str = "count"  # count | cumsum
    mxfp8_saturate: bool = False  # sample: no saturation; ops-transformer: saturate
    combine_recip: bool = True  # kernel: m * (1/127); golden: m / 127
    shared_experts: int = 0
    timing_only: bool = False  # move no payload bytes (flags and counts still move)

    @property
    def n_experts(self) -> int:
        return self.world * self.experts_per_rank

    @property
    def max_rows(self) -> int:
        """A = BS * W * min(K, L): the most rows one rank can receive."""
        return self.bs * self.world * min(self.k, self.experts_per_rank)

    @cached_property
    def record(self) -> DispatchRecordLayout:
        return dispatch_record_layout(self.h, self.dispatch_quant, self.dtype)

    @cached_property
    def window(self) -> WindowLayout:
        return WindowLayout(self.world, self.bs, self.h, self.k, self.experts_per_rank,
                            self.dispatch_quant, self.dtype, self.cores)

    @cached_property
    def n_cumsum(self) -> int:
        return cumsum_core_count(self.n_experts, self.cores, self.world, self.experts_per_rank)

    @property
    def n_all_to_all(self) -> int:
        return self.cores - self.n_cumsum

    @cached_property
    def combine_record(self):
        return combine_record_layout(self.h, self.combine_quant, self.dtype)

    @property
    def token_bytes(self) -> int:
        return 2 * self.h


def split_to_core(n: int, parts: int, index: int) -> tuple[int, int]:
    """SplitToCore: n items over `parts`; the first n % parts take one more. [start, end)."""
    q, r = divmod(n, parts)
    if index < r:
        start = index * (q + 1)
        return start, start + q + 1
    start = index * q + r
    return start, start + q
