"""LayeredTiling: what the host hands one layered call, with the token struct's layout
and ep_recv_count's reduce-info offsets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep.layered_layout import (
    SERVER_RANK_SIZE,
    TBUF_SIZE,
    TBUF_TEMP_OFFSET,
    UB_32B_ALIGN,
    LayeredWindow,
    MiB,
    win_size_min,
)
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.shape import OnShape
from npusim.units import align_up, ceil_div
from npusim.workload.shape import MoeShape


@dataclass(frozen=True)
class LayeredTiling(OnShape):
    """What the host hands one layered call; `v2` is the same call as the V2 kernels see
    it (its tensors' capacities and the reference's terms)."""

    shape: Any  # v2's shape (mc2's, with global_bs and the rows' capacity)
    v2: Mc2Tiling
    window: LayeredWindow
    quant: str  # bf16 | int8
    cores: int  # aivNum
    timing_only: bool

    @property
    def server_num(self) -> int:
        return self.W // SERVER_RANK_SIZE

    @property
    def global_bs(self) -> int:
        return self.shape.global_bs

    @property
    def out_dtype(self) -> np.dtype:
        return np.dtype(np.int8) if self.quant == "int8" else self.shape.np_dtype

    # ---- the token struct: | flag 32 B | token | expert ids | scale 32 B |
    @property
    def align_k(self) -> int:
        return align_up(self.shape.K, 8)

    @property
    def token_len(self) -> int:
        return self.shape.H * self.out_dtype.itemsize

    @property
    def exp_len(self) -> int:
        return self.align_k * 4

    @property
    def token_offset(self) -> int:
        return UB_32B_ALIGN

    @property
    def exp_offset(self) -> int:
        return self.token_offset + self.token_len

    @property
    def scale_offset(self) -> int:
        return self.exp_offset + self.exp_len

    @property
    def struct_len(self) -> int:
        return self.scale_offset + UB_32B_ALIGN

    # ---- ep_recv_count: E counts, then the combine's reduce info (byte offsets)
    @cached_property
    def combine_offsets(self) -> dict[str, int]:
        S, g, K, BS = self.server_num, self.global_bs, self.shape.K, self.shape.BS
        inner_cnt = self.shape.L * S * SERVER_RANK_SIZE * 4
        inner_idx = inner_cnt + g * S * 2
        outer_cnt = inner_idx + g * K * S * 4
        outer_idx = outer_cnt + BS * 4
        per_server = outer_idx + BS * S * 4
        return {"inner_cnt": inner_cnt, "inner_idx": inner_idx, "outer_cnt": outer_cnt,
                "outer_idx": outer_idx, "per_server": per_server,
                "end": per_server + BS * S * 4}

    @property
    def recv_count_ints(self) -> int:
        """deep_ep.cpp's recv_count_tensor_size: num_experts + 2 global_bs K server_num."""
        return self.shape.E + 2 * self.global_bs * self.shape.K * self.server_num

    @property
    def token_ub_size(self) -> int:
        """tokenUbSize_: TBUF_SIZE - TBUF_TEMP_OFFSET - the int16 expert ids."""
        ids = align_up(self.shape.BS * self.shape.K * 2, UB_32B_ALIGN)
        return TBUF_SIZE - TBUF_TEMP_OFFSET - ids


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> LayeredTiling:
    v2 = ll.tiling(shape, {**options, "hccl_buffsize": 0}, hardware, timing_only)
    mb = options["hccl_buffsize"] or ceil_div(win_size_min(shape), MiB)
    win = LayeredWindow(shape.W, shape.L, hardware.chip.aiv_cores, mb * MiB)
    return LayeredTiling(v2.shape, v2, win, options["quant"], hardware.chip.aiv_cores, timing_only)
