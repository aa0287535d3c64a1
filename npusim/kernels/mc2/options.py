"""The mc2 family's workload options, declared once (the operators' attribute each stands
for is in its help), and the typed view family.py and limits.py read them by."""

from __future__ import annotations

from npusim.kernels.common.limits import DISPATCH_V3_LIMITS as _V3
from npusim.kernels.family import Option
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.options import options_view

OPTIONS = (
    Option("comm_alg", "choice", "fullmesh_v1", "the operators' algorithm: fullmesh_v1 "
           "(the default, MoeDistributeDispatchV2) or fullmesh_v2 "
           "(MoeDistributeDispatchV2FullMesh: A3 expert split / BS mode, the 950's token "
           "split; the combine is the same)", choices=("fullmesh_v1", "fullmesh_v2")),
    Option("dispatch_quant", "choice", "none", "quant_mode: none (0), static_int8 (1), "
           "int8 (2, per token); the 950 only: pergroup (3, FP8 per 128), mxfp8 (4), "
           "mxfp8_clip (5), mxfp4_e2m1 (4 with an FP4 expand_x, bfloat16 tokens); "
           "mxfp4_e1m2 is refused as not modelled",
           choices=("none", "static_int8", "int8", *qm.FP8_MODES, *qm.FP4_MODES)),
    Option("quant_dtype", "choice", "e5m2", "FP8 element format of pergroup, mxfp8 and "
           "mxfp8_clip (the expand_x dtype): e5m2 or e4m3 (e4m3fn)",
           choices=("e5m2", "e4m3")),
    Option("static_scales", "choice", "per_channel", "static_int8 scale shape: scalar "
           "(1,), per_channel (H,) or per_expert (E', H)",
           choices=("scalar", "per_channel", "per_expert")),
    Option("smooth_scales", "bool", False, "int8, pergroup: pass smooth scales (E', H)"),
    Option("combine_quant", "choice", "none", "comm_quant_mode: none or int8 (2); the "
           "950 only: mxfp8_e5m2 (3), mxfp8_e4m3 (4)",
           choices=("none", "int8", *qm.COMBINE_MX)),
    Option("expert_token_nums_type", "int", 1, "0: cumulative sum, 1: counts", lo=0, hi=1),
    Option("ccl_buffer_size", "int", 0, "HCCL_BUFFSIZE in MB (HCCL opens twice this); "
           "0: what get_low_latency_ccl_buffer_size returns, or the least the operator's "
           "check accepts when that is more (the helper leaves out the 950's W * 1 KiB)",
           lo=0, hi=65536),
    Option("global_bs", "int", 0, "globalBs, a multiple of W and >= W * max BS; sizes the "
           "window (0: BS * W, or W * max(bs_per_rank) when those differ)", lo=0,
           hi=_V3.bs[1] * _V3.ep_world_size[1]),
    Option("bs_per_rank", "ints", (), "BS of each rank, W entries, the largest equal to "
           "bs (empty: every rank bs)", lo=1, hi=_V3.bs[1]),
    Option("x_active_mask", "choice", "none", "none, 1d (an active prefix of the tokens) "
           "or 2d (per token and k)", choices=("none", "1d", "2d")),
    Option("active_fraction", "float", 0.75, "share of tokens (1d) or pairs (2d) active",
           lo=0.0, hi=1.0),
    Option("zero_experts", "int", 0, "zero experts (ids E..)", lo=0, hi=_V3.experts),
    Option("copy_experts", "int", 0, "copy experts (after the zero experts)", lo=0,
           hi=_V3.experts),
    Option("const_experts", "int", 0, "const experts (after the copy experts)", lo=0,
           hi=_V3.experts),
    Option("expand_scales", "bool", False, "dispatch outputs each row's expert_scales"),
    Option("shared_expert_x", "bool", False, "combine adds a shared_expert_x input"),
    Option("performance_info", "bool", False, "dispatch and combine record each source "
           "rank's longest wait (us) in performance_info; the report's "
           "family_fields.performance_info_us"),
    Option("arch", "choice", "auto", "kernel code path: auto (from the preset's "
           "chip.arch: ascend910_93: arch22, ascend950: arch35), arch22 or arch35",
           choices=("auto", "arch22", "arch35")),
)

Mc2Options = options_view("Mc2Options", OPTIONS)
"""The options as one frozen value, a field per option (validated by the scenario loader)."""
