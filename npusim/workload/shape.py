"""MoeShape and ShapeLimits: the sizes every MoE kernel family shares, as one frozen value,
and the ranges a family declares it takes.

W ranks in the EP group, BS tokens per rank, hidden size H, top-K, L experts on each MoE
rank, S shared experts on the first S_r ranks (ops-transformer V2; 0 and 0 without) and
the token dtype. ops-transformer's V3 operators (family mc2) add what they take beyond
that: a BS per rank (BS their largest), globalBs, and the zero / copy / const experts.
A family's tiling is this shape plus its own options and core counts; inputs, references
and case directories take the shape instead of loose integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.formats import token_dtype
from npusim.units import ceil_div


@dataclass(frozen=True)
class MoeShape:
    W: int  # ranks in the EP group
    BS: int  # tokens per rank
    H: int  # hidden size
    K: int  # top-k
    L: int  # MoE experts on each MoE rank
    S: int = 0  # shared experts
    S_r: int = 0  # ranks 0..S_r-1 hold the shared experts
    dtype: str = "float16"  # token dtype: float16 | bfloat16
    bs_per_rank: tuple[int, ...] = ()  # BS of each rank, the largest BS; (): BS everywhere
    global_bs: int = 0  # globalBs, a multiple of W >= W * BS; 0: BS * W
    zero_experts: int = 0  # ids E.. (the V3 operators' special experts, never sent)
    copy_experts: int = 0  # then the copy experts
    const_experts: int = 0  # then the const experts

    def __post_init__(self) -> None:
        S, S_r = self.S, self.S_r
        if (S == 0) != (S_r == 0) or (S and (S_r % S or S_r >= self.W)):
            raise ValueError(f"shared experts S={S} on S_r={S_r} of {self.W} ranks: need "
                             "both zero, or S_r a multiple of S below the world size")
        bs = self.bs_per_rank
        if bs and (len(bs) != self.W or max(bs) != self.BS):
            raise ValueError(f"bs has {len(bs)} entries with largest {max(bs)} for W={self.W} "
                             f"ranks and BS={self.BS}")
        if self.global_bs == 0 and len(set(bs)) > 1:
            raise ValueError("uneven BS per rank needs global_bs (the window is sized by it)")
        if self.global_bs and (self.global_bs % self.W or self.global_bs // self.W < self.BS):
            raise ValueError(f"global_bs={self.global_bs} must be a multiple of W={self.W} and "
                             f">= W * max(BS) = {self.W * self.BS}")

    @property
    def moe_ranks(self) -> int:
        """W - S_r ranks hold the MoE experts, L each."""
        return self.W - self.S_r

    @property
    def E(self) -> int:
        """E = L * (W - S_r) MoE experts (expert ids name only these)."""
        return self.moe_ranks * self.L

    @property
    def R(self) -> int:
        """R = S_r / S: shared expert j is replicated on ranks [jR, (j+1)R); 0 without."""
        return self.S_r // self.S if self.S else 0

    @property
    def A(self) -> int:
        """A = BS * W * min(K, L): the most rows one MoE rank can receive."""
        return self.BS * self.W * min(self.K, self.L)

    @property
    def np_dtype(self) -> np.dtype:
        return token_dtype(self.dtype)

    @property
    def token_bytes(self) -> int:
        """Bytes of one token row, H elements of the token dtype."""
        return self.H * self.np_dtype.itemsize

    def is_shared_rank(self, rank: int) -> bool:
        return rank < self.S_r

    # ---- the V3 operators' attributes (family mc2)
    @property
    def bs(self) -> tuple[int, ...]:
        """BS of each rank."""
        return self.bs_per_rank or (self.BS,) * self.W

    @property
    def global_bs_eff(self) -> int:
        """globalBs as the tiling sets it: the attribute, or BS * W when it is 0."""
        return self.global_bs or self.BS * self.W

    @property
    def max_bs(self) -> int:
        """maxBs = globalBs / W: the per-source slot count of every window block."""
        return self.global_bs_eff // self.W

    @property
    def special_experts(self) -> int:
        return self.zero_experts + self.copy_experts + self.const_experts

    def rows_capacity(self, rank: int) -> int:
        """A, the rows of expand_x: globalBs * min(L, K) on a MoE rank, maxBs * ceil(W / R)
        on a shared rank (tiling CheckInputInfoTensorShape)."""
        if self.is_shared_rank(rank):
            return self.max_bs * ceil_div(self.W, self.R)
        return self.global_bs_eff * min(self.L, self.K)

    def scale_rows(self) -> int:
        """E': rows of a 2-D static / smooth scale tensor (S + E with shared ranks, else E)."""
        return self.E + (self.S if self.S_r else 0)

    def rows_of(self, rank: int) -> int:
        """A of this rank: BS * ceil(W / R) on a shared rank, else A."""
        if self.is_shared_rank(rank):
            return self.BS * ceil_div(self.W, self.R)
        return self.A

    def expert_rank(self, expert: int) -> int:
        """The rank holding MoE expert e: S_r + e // L (local index e % L)."""
        return self.S_r + expert // self.L

    def shared_dst(self, rank: int, j: int) -> int:
        """The replica of shared expert j that source ``rank`` sends to: (r mod R) + j R."""
        return rank % self.R + j * self.R

    def status_count(self, rank: int) -> int:
        """Dispatch status entries of a rank: W (one per source) on a shared rank, else W*L."""
        return self.W if self.is_shared_rank(rank) else self.W * self.L

    def local_experts(self, rank: int) -> int:
        """Experts a rank holds: 1 on a shared rank, L on a MoE rank."""
        return 1 if self.is_shared_rank(rank) else self.L


DEFAULT_WHY = "npusim's default limit"
"""How a message ends on a key the family's kernel source does not bound."""


@dataclass(frozen=True)
class ShapeLimits:
    """The MoE shapes a family's kernels take, declared by the family (Family.shape_limits)
    and read by the scenario loader (so by `npusim lint`) and by docs/scenario.md: ranges
    are inclusive; `source` says whose limits they are, `why` ends an out-of-range message.
    `sourced` names the keys the kernels' source bounds (bs, h, k, ep_world_size, experts,
    experts_per_rank, shared_experts) when it bounds only some: a message on another key
    says the range is npusim's default; (): every key is `why`'s."""

    bs: tuple[int, int]  # workload.bs, tokens per rank
    h: tuple[int, int]  # workload.h
    h_multiple: int  # h a multiple of it
    k: tuple[int, int]  # workload.k (and k <= E always: a token's K experts are distinct)
    ep_world_size: tuple[int, int]
    experts: int  # E = (W - S_r) * L at most
    shared_experts: tuple[int, int]
    source: str
    why: str = "kernel limit"
    # workload.experts_per_rank (L) when the kernels bound it on its own (a per-rank
    # array); None: only E = (W - S_r) * L <= experts bounds it
    experts_per_rank: tuple[int, int] | None = None
    sourced: tuple[str, ...] = ()

    def why_for(self, key: str) -> str:
        """How an out-of-range message on workload.<key> ends."""
        return self.why if not self.sourced or key in self.sourced else DEFAULT_WHY

    def text(self) -> str:
        """The limits in one line, as docs/scenario.md lists them."""
        per_rank = (f"`experts_per_rank` {self.experts_per_rank[0]}.."
                    f"{self.experts_per_rank[1]}, " if self.experts_per_rank else "")
        return (f"`bs` {self.bs[0]}..{self.bs[1]}, `h` {self.h[0]}..{self.h[1]} (a multiple "
                f"of {self.h_multiple}), `k` {self.k[0]}..{self.k[1]}, `ep_world_size` "
                f"{self.ep_world_size[0]}..{self.ep_world_size[1]}, E <= {self.experts}, "
                f"{per_rank}`shared_experts` {self.shared_experts[0]}.."
                f"{self.shared_experts[1]} ({self.source})")
