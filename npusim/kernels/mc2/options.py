"""The mc2 family's workload options as one typed value (declared in family.py OPTIONS,
validated by the scenario loader; the operators' attribute each stands for is in its help)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Mc2Options:
    comm_alg: str  # fullmesh_v1 | fullmesh_v2
    dispatch_quant: str  # quant_mode: none | static_int8 | int8 | pergroup | mxfp8 | ...
    quant_dtype: str  # the FP8 modes' element format: e5m2 | e4m3
    static_scales: str  # static_int8 scale shape: scalar | per_channel | per_expert
    smooth_scales: bool
    combine_quant: str  # comm_quant_mode: none | int8 | mxfp8_e5m2 | mxfp8_e4m3
    expert_token_nums_type: int  # 0 cumulative sum, 1 counts
    ccl_buffer_size: int  # HCCL_BUFFSIZE in MB; 0: the torch helper's
    global_bs: int  # globalBs; 0: BS * W
    bs_per_rank: tuple[int, ...]  # (): every rank BS
    x_active_mask: str  # none | 1d | 2d
    active_fraction: float
    zero_experts: int
    copy_experts: int
    const_experts: int
    expand_scales: bool
    shared_expert_x: bool
    performance_info: bool
    arch: str  # auto | arch22 | arch35

    @classmethod
    def of(cls, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> Mc2Options:
        """From validated options; keys left out take the declared ``defaults``."""
        return cls(**{f.name: options.get(f.name, defaults[f.name]) for f in fields(cls)})
