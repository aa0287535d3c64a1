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
    dispatch_record_layout,
    shared_send_core_count,
)


@dataclass(frozen=True)
class MoeTiling:
    world: int  # W, ranks in the EP group
    bs: int  # tokens per rank
    h: int  # hidden size
    k: int  # top-k
    experts_per_rank: int  # L: MoE experts on each MoE rank
    cores: int  # AIV cores the kernel is launched on
    dtype: str = "float16"  # token dtype: float16 | bfloat16
    dispatch_quant: str = "mxfp8"  # none | int8 (per token) | mxfp8
    combine_quant: str = "none"  # none | int8 (block)
    expert_token_nums_type: str = "count"  # count | cumsum
    mxfp8_saturate: bool = False  # sample: no saturation; ops-transformer: saturate
    combine_recip: bool = True  # kernel: m * (1/127); golden: m / 127
    shared_experts: int = 0  # S: shared experts (ops-transformer V2 sharedExpertNum)
    timing_only: bool = False  # move no payload bytes (flags and counts still move)
    shared_expert_ranks: int = 0  # S_r: ranks 0..S_r-1 hold the shared experts

    def __post_init__(self) -> None:
        S, S_r = self.shared_experts, self.shared_expert_ranks
        if (S == 0) != (S_r == 0) or (S and (S_r % S or S_r >= self.world)):
            raise ValueError(f"shared experts S={S} on S_r={S_r} of {self.world} ranks: need "
                             "both zero, or S_r a multiple of S below the world size")
        if S and self.n_all_to_all < 1:
            raise ValueError(f"{self.cores} cores leave no MoE-send core next to "
                             f"{self.n_shared_send_cores} shared-send and {self.n_cumsum} "
                             "cum-sum cores")

    # ---- shared experts (ops-transformer MoeDistributeDispatchV2 / CombineV2)
    @property
    def moe_ranks(self) -> int:
        """W - S_r ranks hold the MoE experts, L each."""
        return self.world - self.shared_expert_ranks

    @property
    def n_experts(self) -> int:
        """E = L * (W - S_r) MoE experts (expert_ids name only these)."""
        return self.moe_ranks * self.experts_per_rank

    @property
    def ranks_per_shared_expert(self) -> int:
        """R = S_r / S: shared expert j is replicated on ranks [jR, (j+1)R)."""
        return self.shared_expert_ranks // self.shared_experts if self.shared_experts else 0

    def is_shared_rank(self, rank: int) -> bool:
        return rank < self.shared_expert_ranks

    def expert_rank(self, expert: int) -> int:
        """The rank holding MoE expert e: S_r + e // L (local index e % L)."""
        return self.shared_expert_ranks + expert // self.experts_per_rank

    def shared_dst(self, rank: int, j: int) -> int:
        """The replica of shared expert j that source ``rank`` sends to: (r mod R) + j R."""
        R = self.ranks_per_shared_expert
        return rank % R + j * R

    def status_count(self, rank: int) -> int:
        """Dispatch status entries of a rank: W (one per source) on a shared rank, else W*L."""
        return self.world if self.is_shared_rank(rank) else self.world * self.experts_per_rank

    def local_experts(self, rank: int) -> int:
        """expert_token_nums entries: 1 on a shared rank, L on a MoE rank."""
        return 1 if self.is_shared_rank(rank) else self.experts_per_rank

    def max_rows_of(self, rank: int) -> int:
        """A of this rank: BS * ceil(W / R) on a shared rank, else max_rows."""
        if self.is_shared_rank(rank):
            return self.bs * -(-self.world // self.ranks_per_shared_expert)
        return self.max_rows

    @property
    def n_shared_send_cores(self) -> int:
        """The last max(1, C*S // (K+S)) cores send to the shared experts (V2), 0 if S = 0."""
        return shared_send_core_count(self.cores, self.k, self.shared_experts)

    @property
    def max_rows(self) -> int:
        """A = BS * W * min(K, L): the most rows one MoE rank can receive."""
        return self.bs * self.world * min(self.k, self.experts_per_rank)

    @cached_property
    def record(self) -> DispatchRecordLayout:
        return dispatch_record_layout(self.h, self.dispatch_quant, self.dtype)

    @cached_property
    def window(self) -> WindowLayout:
        return WindowLayout(self.world, self.bs, self.h, self.k, self.experts_per_rank,
                            self.dispatch_quant, self.dtype, self.cores,
                            shared_experts=self.shared_experts,
                            shared_ranks=self.shared_expert_ranks)

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
