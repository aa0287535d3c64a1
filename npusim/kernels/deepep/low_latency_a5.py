"""DeepEP-Ascend's low-latency kernels on the Ascend 950 (A5): MoeDistributeDispatchV2A5 /
MoeDistributeCombineV2A5 (csrc/deepep/ops/op_kernel/moe_distribute_dispatch_v2_a5.h,
moe_distribute_combine_v2_a5.h), which the host tiling picks with Short_SoC_version
"Ascend950": TILING_KEY_A5_TYPE 50000 + quantMode for the dispatch, 50000 for the combine.

They are the A3 fork's steps (low_latency.py runs those on mc2's programs): the same send
split, slots, status entries, per-row LocalWindowCopy, UpdateTokenNumsOut and combine. What
the A5 changes, and how npusim takes it:

- one HCCL window per rank of totalWinSize = HCCL_BUFFSIZE whose first A5_MTE_STATE_WIN_SIZE
  (4 MiB) hold the states the A3 keeps in windowsExp; the data halves are (totalWinSize -
  4 MiB) / 2, which DeepEP's host check does not count: :func:`window_misfit` applies that
  check, then refuses a window whose halves cannot hold one call;
- per-token INT8 takes 127 / max only for max > 0, else 1 (:data:`ZERO_GUARD`);
- no TimeOutDetection in the waits (npusim models none on the A3 either), and the float
  overflow mode set to saturation (no effect on INT8: |x| 127 / max never exceeds 127;
  the FP8 / FP4 casts saturate);
- quantMode 3, 4 and 5, each a record of mc2's programs (:data:`MC2_QUANT`,
  npusim.kernels.mc2.quant_modes): MXFP8 e4m3 / e5m2 (mc2's ``mxfp8``), MXFP4 E2M1
  (``mxfp4_e2m1``: QuantDynamicMx with ComputeFp4Data, the 950 normal dispatch's
  quantiser) and per-token FP8 e4m3 (``pertoken_fp8``: QuantDynamicPerToken with 448 and
  the zero guard, where the normal dispatch has none).

comm_alg is "fullmesh_v1" (deep_ep.cpp); the CCU kernels (keys 60000 / 60002, comm_alg
"ccu" under MOE_ENABLE_CCU=1) run on the CCU engine, which npusim does not model: no option
selects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from npusim.kernels.deepep.window import DEFAULT_HCCL_BUFFSIZE_MB
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.units import MiB, align32, align_up, ceil_div

A5_MTE_STATE_WIN_SIZE = 4 * MiB  # moe_distribute_base.h: the state zone of windowsIn[r]
TILING_KEY_A5_TYPE = 50000  # moe_distribute_dispatch_v2_tiling.cpp
# deep_ep.cpp low_latency_dispatch (A5 build): quant_mode of each quant name
QUANT_MODE = {"bf16": 0, "int8": 2, "mx_fp8_e4m3": 3, "mx_fp8_e5m2": 3, "mx_fp4_e2m1": 4,
              "pertoken_fp8_e4m3": 5}
MODELLED_QUANTS = tuple(QUANT_MODE)
# QuantDynamicMx is quantize_functions.h's ComputeMaxExp / ComputeScale / ComputeFp8Data,
# mc2's ``mxfp8`` (saturating casts), on the A3 fork's record: Align256(H) FP8 bytes, then
# Align2(ceil(H / 32)) E8M0 scales, the triplet at the next 32 B; with ComputeFp4Data
# mc2's ``mxfp4_e2m1``: Align256(ceil(H / 2)) bytes of E2M1 pairs, then the same scales;
# QuantDynamicPerToken to e4m3 mc2's ``pertoken_fp8``: the INT8 record with FP8 codes
MC2_QUANT = {"mx_fp8_e4m3": "mxfp8", "mx_fp8_e5m2": "mxfp8", "mx_fp4_e2m1": "mxfp4_e2m1",
             "pertoken_fp8_e4m3": "pertoken_fp8"}
MX_FP8 = ("mx_fp8_e4m3", "mx_fp8_e5m2")
# CheckWinSize counts the expand_x element for these (quantMode 2 and 5), else 2 B
OUT_DTYPE_QUANTS = ("int8", "pertoken_fp8")
ZERO_GUARD = True  # QuantDynamicPerToken: dynamicScale = max > 0 ? maxVal / max : 1
SRC = "moe_distribute_dispatch_v2_a5.h"
HOST = "moe_distribute_dispatch_v2_tiling.cpp"
# CheckWinSize's constants (the same file)
WIN_ADDR_ALIGN = 512
SCALE_EXPAND_IDX_BUFFER = 44  # scale 32 B + the 3 x 4 B triplet
MAX_OUT_DTYPE_SIZE = 2
DOUBLE_DATA_BUFFER = 2


def tiling_key(quant: str) -> int:
    """The dispatch's tiling key (no smooth scales, tp 1, fullmesh_v1)."""
    return TILING_KEY_A5_TYPE + QUANT_MODE[quant]


def fp8_format(options: Mapping[str, Any]) -> dict[str, str]:
    """mc2's quant_dtype of an MXFP8 mode (the expand_x dtype deep_ep.cpp allocates)."""
    q = options["quant"]
    return {"quant_dtype": q.rsplit("_", 1)[1]} if q in MX_FP8 else {}


def host_check_quant(quant: str) -> str:
    """The quant mc2's checks run with: they refuse MX and do not know per-token FP8 on the
    A3 fork's code path (arch22), and their other checks do not depend on it."""
    return "bf16" if quant in MC2_QUANT else quant


def quant_misfit(options: Mapping[str, Any]) -> Misfit | None:
    """The A5 build takes all six quant names (keys 50000, 50002 - 50005) and npusim runs
    them all; a name deep_ep.cpp does not map (its EP_HOST_ASSERT) is refused."""
    q = options["quant"]
    if q in MODELLED_QUANTS:
        return None
    return Misfit("workload.quant", f"{q}: deep_ep.cpp low_latency_dispatch maps no quant "
                  f"mode to it (EP_HOST_ASSERT); allowed on ascend950: "
                  f"{', '.join(MODELLED_QUANTS)}")


def host_need(t: Mc2Tiling) -> int:
    """CheckWinSize (DeepEP's moe_distribute_dispatch_v2_tiling.cpp, A3 and A5 alike):
    ((maxBs tokenNeedSizeDispatch W L) + (maxBs tokenNeedSizeCombine K)) x 2, the dispatch
    token Align512(Align32(H d) + 44) with d the expand_x element (1 B) for INT8 and
    per-token FP8 and MAX_OUT_DTYPE_SIZE (2 B) otherwise (MX too), the combine's
    Align512(2H)."""
    s = t.shape
    d = 1 if t.dispatch_quant in OUT_DTYPE_QUANTS else MAX_OUT_DTYPE_SIZE
    dispatch = align_up(align32(s.H * d) + SCALE_EXPAND_IDX_BUFFER, WIN_ADDR_ALIGN)
    combine = align_up(s.H * MAX_OUT_DTYPE_SIZE, WIN_ADDR_ALIGN)
    return (s.max_bs * dispatch * s.W * s.L + s.max_bs * combine * s.K) * DOUBLE_DATA_BUFFER


def used(t: Mc2Tiling) -> int:
    """What one call fills of a data half: the combine area, then the dispatch's."""
    return t.window.combine_area + t.window.dispatch_area


def least_mb(t: Mc2Tiling) -> int:
    """The smallest HCCL_BUFFSIZE (MB) that passes the host check and whose data halves,
    (totalWinSize - 4 MiB) / 2, hold :func:`used`; at least DeepEP's default 200."""
    return max(DEFAULT_HCCL_BUFFSIZE_MB, ceil_div(host_need(t), MiB),
               ceil_div(2 * used(t) + A5_MTE_STATE_WIN_SIZE, MiB))


def tiling(t: Mc2Tiling) -> Mc2Tiling:
    return replace(t, int8_zero_guard=ZERO_GUARD)


def window_misfit(t: Mc2Tiling, hccl_mb: int) -> Misfit | None:
    """totalWinSize = HCCL_BUFFSIZE: the host check, then the data halves past the state
    zone, which the host check does not count."""
    total = hccl_mb * MiB
    if host_need(t) > total:
        return Misfit("workload.hccl_buffsize", f"{hccl_mb}: HCCL_BUFFSIZE is too SMALL, "
                      f"NEEDED_HCCL_BUFFSIZE = {host_need(t) // MiB + 1}MB, HCCL_BUFFSIZE="
                      f"{hccl_mb}MB ({HOST} CheckWinSize); allowed: >= {least_mb(t)}")
    half = (total - A5_MTE_STATE_WIN_SIZE) // 2
    if used(t) <= half:
        return None
    return Misfit("workload.hccl_buffsize", f"{hccl_mb} MB passes the host check, but on "
                  f"the A5 a data half is (totalWinSize - 4 MiB A5_MTE_STATE_WIN_SIZE) / 2 = "
                  f"{half} B and one call fills {used(t)} B ({SRC}); allowed: "
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
