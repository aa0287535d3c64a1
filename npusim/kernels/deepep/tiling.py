"""Host-side arguments of one DeepEP normal-mode call (family ``deepep``).

What deep_ep.cpp and the ops' tiling hand the kernels: the shape, the long-sequence rounds
(DEEPEP_NORMAL_LONG_SEQ_ROUND x ..._PER_ROUND_TOKENS, default 1 x 8192), the quantisation,
the AIV count, the window and the context, and the platform whose build runs (A3: ops, A2:
ops2, which differs in its window layout and a few UB steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from npusim.kernels.deepep.window import (
    DeepepWindow,
    combine_slot_bytes,
    dispatch_record_bytes,
    dispatch_slot_bytes,
)
from npusim.kernels.shape import OnShape
from npusim.units import align32, align512, ceil_div
from npusim.workload.shape import MoeShape


def _of_shape(name: str) -> property:
    """A read-only view of the shape's size `name`."""
    return property(attrgetter(f"shape.{name}"), doc=f"shape.{name}")


@dataclass(frozen=True)
class DeepepTiling(OnShape):
    shape: MoeShape
    quant: str  # bf16 | int8 (per-token dynamic, quant_mode 2)
    round: int  # DEEPEP_NORMAL_LONG_SEQ_ROUND: the rounds the buffers are sized for
    per_round_tokens: int  # DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS
    cores: int  # aivNum
    context: str  # hccl | shmem
    buffsize_mb: int  # HCCL_BUFFSIZE (totalWinSize in MiB)
    timing_only: bool = False
    platform: str = "a3"  # a3: csrc/deepep/ops; a2: csrc/deepep/ops2 (one server)
    # the shape's sizes under the sources' names (t.H for t.shape.H)
    H, K, L, E, BS = (_of_shape(n) for n in ("H", "K", "L", "E", "BS"))

    @property
    def real_round(self) -> int:
        """Rounds a call runs: ceil(realMaxBs / perRoundTokens) (every rank has BS tokens)."""
        return ceil_div(self.BS, self.per_round_tokens)

    def round_tokens(self, r: int) -> int:
        """Tokens of round r on a rank with BS tokens."""
        return max(0, min(self.per_round_tokens, self.BS - r * self.per_round_tokens))

    @property
    def combine_tiling_key(self) -> int:
        """cam_moe_combine_normal_tiling.cc: INIT_TILINGKEY 10000, + 1 when maxRound > 1
        (the multi-round kernel, however many rounds run), + TILING_KEY_A3_TYPE 3000 on the
        A3; ops2's (A2) stays at 10000 / 10001."""
        return 10000 + (self.round > 1) + (3000 if self.platform == "a3" else 0)

    @property
    def combine_multi_round(self) -> bool:
        return self.combine_tiling_key % 10 == 1

    @property
    def max_bs(self) -> int:
        """min(realMaxBs, perRoundTokens): what the dispatch and combine windows hold."""
        return min(self.BS, self.per_round_tokens)

    @property
    def out_dtype(self) -> np.dtype:
        """expandX: int8 with quantisation, else the token dtype."""
        return np.dtype(np.int8) if self.quant == "int8" else self.shape.np_dtype

    @property
    def record_bytes(self) -> int:
        return dispatch_record_bytes(self.H, self.out_dtype.itemsize)

    @property
    def scale_offset(self) -> int:
        """hUBAlignSize: the fp32 scale after Align32(H * item)."""
        return align32(self.H * self.out_dtype.itemsize)

    @property
    def triple_offset(self) -> int:
        return self.scale_offset + 32

    @property
    def rows_capacity(self) -> int:
        """recv_x rows allocated: the most (token, expert) pairs one rank can receive."""
        return self.shape.A

    @property
    def notify_ints(self) -> int:
        """perRankDataNum: one rank's counts for one peer, round * L * 3 ints."""
        return self.round * self.L * 3

    @property
    def window(self) -> DeepepWindow:
        return DeepepWindow(self.context, self.buffsize_mb << 20, self.max_bs, self.K,
                            combine_slot_bytes(self.H, self.round),
                            dispatch_slot_bytes(self.H, self.out_dtype.itemsize),
                            align512(2 * self.H), self.platform)
