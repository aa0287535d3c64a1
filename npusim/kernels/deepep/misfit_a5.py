"""What the deepep family refuses on the Ascend 950: the modes it does not model there, the
950 normal dispatch tiling's bounds (cam_moe_dispatch_normal_tiling.cc) with the MX
record's alignment, and an HCCL_BUFFSIZE whose data halves overrun the window."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.kernels.deepep.window_a5 import A5_MTE_STATE_WIN_SIZE
from npusim.kernels.family import Misfit
from npusim.units import MiB, ceil_div
from npusim.workload.shape import MoeShape

H_MIN, H_MAX = 1024, 8192  # cam_moe_dispatch_normal_tiling.cc
# the H whose MX record keeps its scales: QuantDynamicMx leaves them at Align256(H) elements
# (MXFP4: half as many bytes), the slot copy ends at hScaleIdxSize and ShareToOutputLongSeq
# reads them at Align256 of the payload bytes; all three agree for H a multiple of these
MX_H_MULTIPLE = {"mx_fp8_e4m3": 256, "mx_fp8_e5m2": 256, "mx_fp4_e2m1": 512}


def a5_misfit(shape: MoeShape, options: Mapping[str, Any]) -> Misfit | None:
    """The 950 normal-mode tiling's refusals (cam_moe_dispatch_normal_tiling.cc)."""
    if not H_MIN <= shape.H <= H_MAX:
        return Misfit("workload.h", f"{shape.H}: xShape dims1(H) should be in [{H_MIN}, "
                      f"{H_MAX}] (cam_moe_dispatch_normal_tiling.cc H_MIN, H_MAX); allowed: "
                      f"{H_MIN}..{H_MAX}")
    step = MX_H_MULTIPLE.get(options["quant"])
    if step and shape.H % step:
        return Misfit("workload.h", f"{shape.H}: with quant {options['quant']} the 950 "
                      f"dispatch writes the E8M0 scales at Align256 of H elements "
                      f"(QuantDynamicMx) and copies the record up to hScaleIdxSize and reads "
                      f"them at Align256 of the payload bytes (ShareToOutputLongSeq), which "
                      f"hold the scales only for H a multiple of {step}; allowed: a multiple "
                      f"of {step}")
    return None


def a5_window_misfit(t: DeepepTiling, mb: int) -> Misfit | None:
    """HCCL_BUFFSIZE too small for the 950's layout although DeepEP's check passes: that
    check sizes two halves of HCCL_BUFFSIZE / 2, the kernels halve what follows the 4 MiB
    state zone, so half 1's records may run past the window's end."""
    w = t.window
    end = w.dispatch_data(1, t.max_bs * t.K)
    if end <= w.total:
        return None
    used = end - A5_MTE_STATE_WIN_SIZE - w.half  # what half 1 holds
    need = ceil_div(A5_MTE_STATE_WIN_SIZE + 2 * used, MiB)
    return Misfit("workload.hccl_buffsize", f"{mb} MB: on the 950 the data halves follow the "
                  f"{A5_MTE_STATE_WIN_SIZE // MiB} MiB state zone (A5_MTE_STATE_WIN_SIZE), "
                  f"which DeepEP's HCCL_BUFFSIZE check does not count, so half 1's dispatch "
                  f"records would end {end - w.total} B past the window; allowed: at least "
                  f"{need}")
