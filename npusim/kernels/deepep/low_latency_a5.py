"""DeepEP-Ascend's low-latency kernels on the Ascend 950 (A5): MoeDistributeDispatchV2A5 /
MoeDistributeCombineV2A5 (csrc/deepep/ops/op_kernel/moe_distribute_dispatch_v2_a5.h,
moe_distribute_combine_v2_a5.h), which the host tiling picks with Short_SoC_version
"Ascend950": TILING_KEY_A5_TYPE 50000 + quantMode for the dispatch, 50000 for the combine.

They are the A3 fork's steps (low_latency.py runs those on mc2's programs): the same send
split, slots, status entries, per-row LocalWindowCopy, UpdateTokenNumsOut and combine. What
the A5 changes, and how npusim takes it:

- one HCCL window per rank whose first A5_MTE_STATE_WIN_SIZE (4 MiB) hold the states the A3
  keeps in windowsExp; the data halves are (totalWinSize - 4 MiB) / 2, which the host check
  does not count: a window too small for them is refused (:func:`window_misfit`);
- per-token INT8 takes 127 / max only for max > 0, else 1 (:data:`ZERO_GUARD`);
- no TimeOutDetection in the waits (npusim models none on the A3 either), and the float
  overflow mode set to saturation (no effect on INT8: |x| 127 / max never exceeds 127);
- quantMode 3 (MXFP8 e4m3 / e5m2: :data:`MC2_QUANT`); 4 and 5 (MXFP4, per-token FP8) are
  not modelled here (:data:`QUANT_MODE`).

comm_alg is "fullmesh_v1" (deep_ep.cpp); the CCU kernels (keys 60000 / 60002, comm_alg
"ccu" under MOE_ENABLE_CCU=1) run on the CCU engine, which npusim does not model: no option
selects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.units import MiB, ceil_div

A5_MTE_STATE_WIN_SIZE = 4 * MiB  # moe_distribute_base.h: the state zone of windowsIn[r]
TILING_KEY_A5_TYPE = 50000  # moe_distribute_dispatch_v2_tiling.cpp
# deep_ep.cpp low_latency_dispatch (A5 build): quant_mode of each quant name
QUANT_MODE = {"bf16": 0, "int8": 2, "mx_fp8_e4m3": 3, "mx_fp8_e5m2": 3, "mx_fp4_e2m1": 4,
              "pertoken_fp8_e4m3": 5}
MODELLED_QUANTS = ("bf16", "int8", "mx_fp8_e4m3", "mx_fp8_e5m2")
# QuantDynamicMx is quantize_functions.h's ComputeMaxExp / ComputeScale / ComputeFp8Data,
# mc2's ``mxfp8`` (saturating casts), on the A3 fork's record: Align256(H) FP8 bytes, then
# Align2(ceil(H / 32)) E8M0 scales, the triplet at the next 32 B
MC2_QUANT = {"mx_fp8_e4m3": "mxfp8", "mx_fp8_e5m2": "mxfp8"}
ZERO_GUARD = True  # QuantDynamicPerToken: dynamicScale = max > 0 ? maxVal / max : 1
SRC = "moe_distribute_dispatch_v2_a5.h"


def tiling_key(quant: str) -> int:
    """The dispatch's tiling key (no smooth scales, tp 1, fullmesh_v1)."""
    return TILING_KEY_A5_TYPE + QUANT_MODE[quant]


def fp8_format(options: Mapping[str, Any]) -> dict[str, str]:
    """mc2's quant_dtype of an MX mode (the expand_x dtype deep_ep.cpp allocates)."""
    q = options["quant"]
    return {"quant_dtype": q.rsplit("_", 1)[1]} if q in MC2_QUANT else {}


def host_check_quant(quant: str) -> str:
    """The quant whose A3 window check is the A5 host's: CheckWinSize counts the out dtype
    (1 B) for INT8 and per-token FP8, 2 B otherwise, so the MX modes as BF16."""
    return "bf16" if quant in MC2_QUANT else quant


def quant_misfit(options: Mapping[str, Any]) -> Misfit | None:
    """The A5 build takes all six quant names; npusim runs bf16, int8 and MXFP8 (keys
    50000, 50002, 50003)."""
    q = options["quant"]
    if q in MODELLED_QUANTS:
        return None
    return Misfit("workload.quant", f"{q}: the A5 low-latency dispatch runs it (tiling key "
                  f"{tiling_key(q)}, {SRC} QuantDynamicMx / QuantDynamicPerToken), but npusim "
                  f"does not model it on this path; allowed on ascend950: "
                  f"{', '.join(MODELLED_QUANTS)}")


def data_half(t: Mc2Tiling) -> int:
    """baseWindSize_ / 2: a data half of the window past the 4 MiB state zone."""
    return (t.window.ccl_bytes - A5_MTE_STATE_WIN_SIZE) // 2


def used(t: Mc2Tiling) -> int:
    """What one call fills of a data half: the combine area, then the dispatch's."""
    return t.window.combine_area + t.window.dispatch_area


def least_mb(t: Mc2Tiling) -> int:
    """The smallest hccl_buffsize whose A5 data halves hold :func:`used` (npusim's window
    opens 2 x hccl_buffsize, as for the A3)."""
    return ceil_div(2 * used(t) + A5_MTE_STATE_WIN_SIZE, 2 * MiB)


def tiling(t: Mc2Tiling) -> Mc2Tiling:
    return replace(t, int8_zero_guard=ZERO_GUARD)


def window_misfit(t: Mc2Tiling, hccl_mb: int) -> Misfit | None:
    """The A5 data halves start past the state zone; the host check (the A3's formula)
    lets a window through whose halves then overrun."""
    if used(t) <= data_half(t):
        return None
    return Misfit("workload.hccl_buffsize", f"{hccl_mb} MB passes the host check, but on "
                  f"the A5 a data half is (totalWinSize - 4 MiB A5_MTE_STATE_WIN_SIZE) / 2 = "
                  f"{data_half(t)} B and one call fills {used(t)} B ({SRC}); allowed: "
                  f">= {least_mb(t)}")


def reference_scales(outputs: list[Arrays]) -> list[Arrays]:
    """mc2's INT8 reference stores 1 / inf = 0 for a received zero row; the A5 stores 1 / 1
    (the rows past layout_range's total are not written)."""
    out = []
    for o in outputs:
        s = o["packed_recv_x_scales"].copy()
        n = int(o["layout_range"][-1]) if o["layout_range"].size else 0
        s[:n][s[:n] == 0] = 1.0
        out.append({**o, "packed_recv_x_scales": s})
    return out
