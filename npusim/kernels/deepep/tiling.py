"""Host-side arguments of one DeepEP normal-mode call (family ``deepep``).

What deep_ep.cpp and the ops' tiling hand the kernels: the shape, the long-sequence rounds
(DEEPEP_NORMAL_LONG_SEQ_ROUND x ..._PER_ROUND_TOKENS, default 1 x 8192; the combine gets
them only with DEEPEP_NORMAL_COMBINE_ENABLE_LONG_SEQ=1), the quantisation and the record it
makes, the AIV count, the window and the context, and the platform whose build runs (A3:
ops, A2: ops2, which differs in its window layout and a few UB steps; A5: ops built for the
Ascend 950, with its own window and quantisers).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from npusim.formats import fp8_format, tables
from npusim.kernels.deepep.window import DeepepWindow, combine_slot_bytes
from npusim.kernels.deepep.window_a5 import A5Window
from npusim.kernels.shape import OnShape
from npusim.units import align32, align512, align_up, ceil_div
from npusim.workload.shape import MoeShape

# the tiling key's platform addend (TILING_KEY_A3_TYPE 3000, the 950's 5000)
TILING_KEY_TYPE = {"a3": 3000, "a2": 0, "a5": 5000}
MX_BLOCK_SIZE = 32
MX_MODES = ("mx_fp8_e4m3", "mx_fp8_e5m2", "mx_fp4_e2m1")
FP8_OUT = {"mx_fp8_e4m3": "e4m3", "mx_fp8_e5m2": "e5m2", "pertoken_fp8_e4m3": "e4m3"}


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
    platform: str = "a3"  # a3: csrc/deepep/ops; a2: csrc/deepep/ops2 (one server); a5
    combine_long_seq: int = 0  # DEEPEP_NORMAL_COMBINE_ENABLE_LONG_SEQ
    recv_rows: int = 0  # rows the host allocates recv_x for, from the routing (0: the most)
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
    def combine_round(self) -> int:
        """The maxRound deep_ep.cpp's intranode_combine passes: DEEPEP_NORMAL_LONG_SEQ_ROUND
        with DEEPEP_NORMAL_COMBINE_ENABLE_LONG_SEQ=1, else 1."""
        return self.round if self.combine_long_seq else 1

    @property
    def combine_tiling_key(self) -> int:
        """cam_moe_combine_normal_tiling.cc: INIT_TILINGKEY 10000, + 1 when maxRound > 1
        (the multi-round kernel, however many rounds run), + 3000 on the A3, + 5000 on the
        950 (Short_SoC_version Ascend950); ops2's (A2) stays at 10000 / 10001."""
        return 10000 + (self.combine_round > 1) + TILING_KEY_TYPE[self.platform]

    @property
    def combine_multi_round(self) -> bool:
        return self.combine_tiling_key % 10 == 1

    @property
    def max_bs(self) -> int:
        """min(realMaxBs, perRoundTokens): what the dispatch and combine windows hold."""
        return min(self.BS, self.per_round_tokens)

    # ---- the dispatch's record (Init of cam_moe_dispatch_normal[_a5].h)
    @property
    def mx(self) -> bool:
        """An MX mode (the 950's MXFP8 / MXFP4): an E8M0 scale per 32 elements."""
        return self.quant in MX_MODES

    @property
    def fp4(self) -> bool:
        return self.quant == "mx_fp4_e2m1"

    @property
    def out_dtype(self) -> np.dtype:
        """expandX: int8 or FP8 with quantisation, two FP4 codes per byte (uint8) for MXFP4,
        else the token dtype."""
        if self.quant == "bf16":
            return self.shape.np_dtype
        if self.quant in FP8_OUT:
            return fp8_format(FP8_OUT[self.quant])[0]
        return np.dtype(np.uint8 if self.fp4 else np.int8)

    @property
    def recv_cols(self) -> int:
        """recv_x's columns: H, or H / 2 bytes of FP4 pairs."""
        return ceil_div(self.H, 2) if self.fp4 else self.H

    @property
    def payload_bytes(self) -> int:
        return self.recv_cols * self.out_dtype.itemsize

    @property
    def scales_per_row(self) -> int:
        """quantScalePerToken: Ceil(H, MX_BLOCK_SIZE) E8M0 bytes for MX, else one fp32."""
        return ceil_div(self.H, MX_BLOCK_SIZE) if self.mx else 1

    @property
    def scale_dtype(self) -> np.dtype:
        return tables().e8m0 if self.mx else np.dtype(np.float32)

    @property
    def scale_bytes(self) -> int:
        """A row's bytes of dynamic_scales."""
        return self.scales_per_row * self.scale_dtype.itemsize

    @property
    def scale_offset(self) -> int:
        """Where the quantiser leaves the scales in the record: hUBAlignSize (Align32 of the
        payload), or for MX Align256 of the payload's elements (QuantDynamicMx)."""
        if self.mx:
            return align_up(self.recv_cols, 256)
        return align32(self.payload_bytes)

    @property
    def triple_offset(self) -> int:
        """hScaleSizeAlign: hUBAlignSize + Align32(the scales' bytes)."""
        return align32(self.payload_bytes) + align32(self.scale_bytes)

    @property
    def record_bytes(self) -> int:
        """hScaleIdxSize: the triple's 12 B after hScaleSizeAlign, Ceil(H, 32) more for MX;
        what InputToShare copies into a slot."""
        return self.triple_offset + 12 + (self.scale_bytes if self.mx else 0)

    @property
    def rows_capacity(self) -> int:
        """recv_x rows allocated: the routing's (`recv_rows`, where the family sizes by it),
        else the most (token, expert) pairs one rank can receive."""
        return self.recv_rows or self.shape.A

    @property
    def notify_ints(self) -> int:
        """perRankDataNum: one rank's counts for one peer, round * L * 3 ints."""
        return self.round * self.L * 3

    @property
    def window(self) -> DeepepWindow:
        kind = A5Window if self.platform == "a5" else DeepepWindow
        return kind(self.context, self.buffsize_mb << 20, self.max_bs, self.K,
                    combine_slot_bytes(self.H, self.round), align512(self.record_bytes),
                    align512(2 * self.H), self.platform)
