"""The fused_deep_moe form as the family runs it: the one MIX kernel (tensors, phases,
report fields), its tiling from the shape and the preset, its inputs and its fit to the
preset.

Tensors follow fused_deep_moe.h's arguments and workspace (FDM.h:349-375): x, expertIds,
expertScales, the permuted w13 and its scale, w2 and its fp32 scale in; output and
epRecvCount out; the workspace's x1 / x1 scale, expandIdx, epSendCount, the CV swap ring
(GMM1's and GMM2's, the same bytes), the SwiGLU rows (fp32), groupList, x2 and its scale as
scratch. The weights are ND here (FRACTAL_NZ on the device, as the unfused form).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.common.overlap import layer_fields
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.moe_layer.fused_deep_moe import reference as fref
from npusim.kernels.moe_layer.fused_deep_moe.program import (
    HIDES,
    WAITS,
    WORKERS,
    fused_deep_moe_program,
)
from npusim.kernels.moe_layer.fused_deep_moe.roles import LaunchTiling
from npusim.kernels.moe_layer.fused_deep_moe.tiling import (
    GMM1_L0K,
    GMM1_L1K,
    GMM1_L1M,
    GMM1_L1N,
    GMM2_L0K,
    GMM2_L1K,
    GMM2_L1M,
    GMM2_L1N,
    WORKSPACE_STAGES,
    fused_tiling,
)
from npusim.kernels.moe_layer.fused_deep_moe.window import fits_status
from npusim.kernels.moe_layer.tiling import GmmTiling
from npusim.kernels.quant import BF16
from npusim.workload.shape import MoeShape

I8, I32, I64, F32 = (const(np.int8), const(np.int32), const(np.int64), const(np.float32))
NAME = "fused_deep_moe"


def _spec(name: str, dtype: Any, shape: Any, what: str) -> TensorSpec:
    return TensorSpec(name, dtype, shape, what)


INPUTS = (
    _spec("x", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 tokens"),
    _spec("expert_ids", I32, lambda t, r: (t.BS, t.K), "[BS, K] global expert ids"),
    _spec("expert_scales", F32, lambda t, r: (t.BS, t.K), "[BS, K] fp32 routing weights"),
    _spec("gmm1_weight", I8, lambda t, r: (t.L, t.H, t.t.n1),
          "[L, H, 2I] int8 w13, 128-column tiles of 64 gate + 64 up columns"),
    _spec("gmm1_weight_scale", F32, lambda t, r: (t.L, t.t.n1), "[L, 2I] fp32, permuted "
          "as w13"),
    _spec("gmm2_weight", I8, lambda t, r: (t.L, t.t.n2, t.H), "[L, I, H] int8 w2"),
    _spec("gmm2_weight_scale", F32, lambda t, r: (t.L, t.H), "[L, H] fp32 w2 scale"),
)
OUTPUTS = (
    _spec("output", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 combined tokens"),
    _spec("ep_recv_count", I32, lambda t, r: (t.L * t.world,),
          "[L * W] rows per (local expert, source rank)"),
)
SCRATCH = (
    _spec("x1", I8, lambda t, r: (t.rows, t.H), "received int8 rows, expert-major"),
    _spec("x1_scale", F32, lambda t, r: (t.rows,), "their fp32 scales"),
    _spec("expand_idx", I32, lambda t, r: (t.BS * t.K,), "each pair's row in its slot"),
    _spec("ep_send_count", I32, lambda t, r: (t.L * t.world,), "inclusive prefixes"),
    _spec("cv_swap", I32, lambda t, r: (t.aic * WORKSPACE_STAGES * GMM1_L1M * GMM1_L1N,),
          "the AIC -> AIV ring, 4 stages of a block per AIC"),
    _spec("swiglu_out", F32, lambda t, r: (t.rows, t.t.n2), "GMM1's epilogue rows"),
    _spec("group_list", I64, lambda t, r: (t.L,), "cumulative rows per local expert"),
    _spec("x2", I8, lambda t, r: (t.rows, t.t.n2), "requantised SwiGLU rows"),
    _spec("per_token_scale2", F32, lambda t, r: (t.rows,), "their scales"),
)
PHASES = (
    Phase("dispatch_send", "AIV sub-block 1: counts, then quantise and put every (token, k) "
          "into its expert's slot"),
    Phase("dispatch_recv", "AIV sub-block 0: wait the counts, copy the records out of the "
          "window, raise the group lines"),
    Phase("gmm1", "AIC: per local expert once its rows are in, 256 x 128 blocks into the "
          "CV swap ring"),
    Phase("swiglu", "AIV sub-block 0: dequant + SwiGLU of each GMM1 block, fp32 out"),
    Phase("quant", "every AIV after SyncAll: group_list, BlockQuant of the SwiGLU rows"),
    Phase("stage_barrier", "every AIV: CrossCoreBarrier, then the AIC's flag"),
    Phase("gmm2", "AIC: 128 x 256 blocks into the ring; both AIVs: dequant to bf16 and the "
          "combine's puts into the source ranks' windows"),
    Phase("combine", "AIV sub-block 0: SetStatus to its ranks"),
    Phase("weight_sum", "AIV sub-block 1: wait the statuses, the weighted top-k sum"),
)


class FusedDeepMoeKernel(Kernel):
    name = NAME
    phases = PHASES
    inputs = INPUTS
    outputs = OUTPUTS
    scratch = SCRATCH
    core_kind = "mix_aic_1_2"

    def program(self, tiling: LaunchTiling) -> Any:
        return fused_deep_moe_program(tiling)

    def cores(self, tiling: LaunchTiling) -> int | None:
        return tiling.aic

    def fields(self, call: Call) -> dict[str, Any]:
        return {"ep_recv_count": [[int(v) for v in o["ep_recv_count"]] for o in call.outputs],
                **layer_fields(call.run, call.cores, WORKERS, HIDES, WAITS)}


FUSED_DEEP_MOE = FusedDeepMoeKernel()


def _gmm(aic: Any, rows: int, k: int, n: int, groups: int, m: int, bn: int, l1k: int,
         l0k: int) -> GmmTiling:
    """A catlass block as moe_layer.gmm's CubeBlock takes it: L1 K in base-K steps."""
    steps = l1k // l0k
    return GmmTiling(rows, k, n, groups, m, bn, l0k, steps, steps, int(aic.cores), m)


def launch_tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
                  timing_only: bool) -> LaunchTiling:
    aic = hardware.aic
    t = fused_tiling(shape, options["intermediate"], int(aic.cores))
    return LaunchTiling(
        t, _gmm(aic, t.capacity, t.H, t.n1, t.L, GMM1_L1M, GMM1_L1N, GMM1_L1K, GMM1_L0K),
        _gmm(aic, t.capacity, t.n2, t.H, t.L, GMM2_L1M, GMM2_L1N, GMM2_L1K, GMM2_L0K),
        timing_only)


def launch_window(lt: LaunchTiling) -> Any:
    return lt.window


def fused_inputs(base: Arrays) -> Arrays:
    """The kernel's inputs from the family's per-rank arrays: w13 and its scale permuted
    (test_fused_deep_moe.py reshape_fusion_gmm_weight / permute_weight), w2's scale fp32
    (deep_ep.cpp:1216-1217 passes it as float), ids int32."""
    return {"x": base["x"], "expert_ids": np.asarray(base["topk_idx"]).astype(np.int32),
            "expert_scales": np.asarray(base["topk_weights"]).astype(np.float32),
            "gmm1_weight": fref.permute_gate_up(base["gmm1_weight"]),
            "gmm1_weight_scale": fref.permute_gate_up(base["gmm1_weight_scale"]),
            "gmm2_weight": base["gmm2_weight"],
            "gmm2_weight_scale": base["gmm2_weight_scale_fp32"]}


def launch_misfit(lt: LaunchTiling, hardware: Any) -> Misfit | None:
    """What the tiling needs of the preset: the window's data halves and status area
    (HCCL's windowsIn + windowsExp) within the symmetric window."""
    need, have = lt.window.window_bytes, int(hardware.window.bytes)
    if need > have:
        return Misfit("hardware.window.bytes", f"{have}: FusedDeepMoe's window needs "
                      f"{need} B (two data halves of W * L slots of maxBs * H * 2 B, "
                      "fused_deep_moe_tiling.cpp:343-359, and the 1 MiB status area, "
                      f"cam_moe_distribute_combine.h:13); allowed: at least {need}")
    if not fits_status(lt.t, hardware.chip.aiv_cores):
        return Misfit("workload.experts_per_rank", f"{lt.L}: the status area's W * L count "
                      "entries, group lines and soft-sync counters exceed its 1 MiB "
                      "(GMM1K:15-25); allowed: fewer experts")
    return None
