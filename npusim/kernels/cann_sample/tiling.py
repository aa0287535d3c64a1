"""Tiling shared by the dispatch and combine programs: the host-side arguments of a call.

Like the CANN sample's tiling struct, this is plain data the host fills in; the kernel
programs derive every size from it. It knows nothing of scenarios or YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from npusim.kernels.cann_sample.layout import (
    DispatchRecordLayout,
    WindowLayout,
    combine_record_layout,
    dispatch_record_layout,
    shared_send_core_count,
)
from npusim.kernels.shape import OnShape
from npusim.workload.shape import MoeShape


@dataclass(frozen=True)
class MoeTiling(OnShape):
    """The shape, the family's options and the cores the kernels are launched on. The
    options have no defaults here: the family fills in its declared ones (family.py)."""

    shape: MoeShape
    cores: int  # AIV cores the kernel is launched on
    dispatch_quant: str  # none | int8 (per token) | mxfp8
    combine_quant: str  # none | int8 (block)
    expert_token_nums_type: str  # count | cumsum
    mxfp8_saturate: bool  # sample: no saturation; ops-transformer: saturate
    combine_recip: bool  # kernel: m * (1/127); golden: m / 127
    timing_only: bool = False  # move no payload bytes (flags and counts still move)

    def __post_init__(self) -> None:
        if self.S and self.n_all_to_all < 1:
            raise ValueError(f"{self.cores} cores leave no MoE-send core next to "
                             f"{self.n_shared_send_cores} shared-send and {self.n_cumsum} "
                             "cum-sum cores")

    @property
    def dtype(self) -> str:
        """The token dtype's name (float16, bfloat16)."""
        return self.shape.dtype

    @property
    def n_shared_send_cores(self) -> int:
        """The last max(1, C*S // (K+S)) cores send to the shared experts (V2), 0 if S = 0."""
        return shared_send_core_count(self.cores, self.K, self.S)

    @cached_property
    def record(self) -> DispatchRecordLayout:
        return dispatch_record_layout(self.H, self.dispatch_quant, self.dtype)

    @cached_property
    def window(self) -> WindowLayout:
        return WindowLayout.of(self.shape, self.dispatch_quant, self.cores)

    @cached_property
    def n_cumsum(self) -> int:
        return self.window.n_cumsum

    @property
    def n_all_to_all(self) -> int:
        """Cores [0, n_a2a) send to MoE experts; then n_cumsum count; the last
        n_shared_send_cores send to the shared experts."""
        return self.cores - self.n_cumsum - self.n_shared_send_cores

    @cached_property
    def combine_record(self):
        return combine_record_layout(self.H, self.combine_quant, self.dtype)
