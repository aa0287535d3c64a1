"""The examples' --perf metrics (hicann/shmem examples/utils/moe_perf_host.h), computed the
way the harness computes them, from the frames the cores recorded.

Frame full_op covers the whole kernel, comm_only its stage 1 (SHMEMI_PROF_START / END,
GetSystemCycle() at `chip.system_counter_mhz`: 50 ticks per us on A2/A3, 1000 on the
950). A core's time is its frame's ticks / ticks-per-us; a PE's CoreMaxTime is the max
over its cores; `--prof-pe all` profiles every PE, and summarize_moe_perf.py keeps the
max over PEs. DataSize = BS * K * H * elem per PE, GlobalDataSize = DataSize * W;
bandwidth = bytes / time with GB = 2^30.

These functions are shared by the SHMEM example families (classic and doubleplane): a
family's Kernel.fields returns perf_fields(...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from npusim.kernels.shmem_classic.layout import UB_DMA_MAX_SIZE

FRAMES = ("full_op", "comm_only")  # frame 0 and frame 1, in the CSV's row order
COLUMNS = ("DataSize/B", "Npus", "Blocks", "UBsize/KB", "Bandwidth/GB/s", "CoreMaxTime/us",
           "Metric", "GlobalDataSize/B", "PerPeBandwidth/GB/s", "BS", "H", "TopK",
           "ExpertPerPe", "Dtype", "Warmup", "Loops", "ProfPe", "CaseId", "SingleCoreTime/us")
GIB = float(1 << 30)


def frame_us(start_ns: float, end_ns: float, counter_mhz: float) -> float:
    """A frame as GetSystemCycle() sees it: whole counter ticks at start and end (from the
    op's start), their difference over ticks per us."""
    ticks = math.floor(end_ns * counter_mhz / 1000 + 1e-9) - math.floor(
        start_ns * counter_mhz / 1000 + 1e-9)
    return ticks / counter_mhz


def gbps(nbytes: int, us: float) -> float:
    """MoeBytesToGBps: bytes / us * 1e6 / 2^30 (0 for no time)."""
    return nbytes / us * 1e6 / GIB if us > 0 else 0.0


def fmt(v: float) -> str:
    """MoeDoubleToString: fixed, four decimals."""
    return f"{v:.4f}"


def case_id(BS: int, H: int, K: int, E: int, W: int) -> str:
    """run.sh's case id: shape_{bs}_{h}_{topk}_{moe_expert_num}_{pes}."""
    return f"shape_{BS}_{H}_{K}_{E}_{W}"


def perf_fields(shape: Any, dtype_name: str, elem: int, blocks: int, counter_mhz: float,
                frames: Sequence[Sequence[Mapping[str, tuple[float, float]]]]
                ) -> dict[str, Any]:
    """family_fields of one op: per metric the max over PEs (`<metric>_us`), its global and
    per-PE bandwidth, every core's time per PE (`<metric>_core_us`, rank x core) and the
    rows the harness's per-PE CSVs hold (`harness_perf`: columns and rows, ProfPe = the
    rank, rows in rank order, full_op then comm_only)."""
    W = shape.W
    per_pe = shape.BS * shape.K * shape.H * elem
    glob = per_pe * W
    out: dict[str, Any] = {"data_size_b": per_pe, "global_data_size_b": glob}
    core_us = {m: [[frame_us(*f[m], counter_mhz) for f in row if m in f] for row in frames]
               for m in FRAMES}
    for m in FRAMES:
        top = max((max(r) for r in core_us[m] if r), default=0.0)
        out[f"{m}_us"] = top
        out[f"{m}_bandwidth_gbps"] = gbps(glob, top)
        out[f"{m}_per_pe_bandwidth_gbps"] = gbps(per_pe, top)
    for m in FRAMES:
        out[f"{m}_core_us"] = core_us[m]
    cid = case_id(shape.BS, shape.H, shape.K, shape.E, W)
    rows = []
    for pe in range(W):
        for m in FRAMES:
            times = core_us[m][pe]
            worst = max(times, default=0.0)
            rows.append([str(per_pe), str(W), str(blocks), str(UB_DMA_MAX_SIZE // 1024),
                         fmt(gbps(glob, worst)), fmt(worst), m, str(glob),
                         fmt(gbps(per_pe, worst)), str(shape.BS), str(shape.H), str(shape.K),
                         str(shape.L), dtype_name, "0", "1", str(pe), cid,
                         *(fmt(v) for v in times)])
    out["harness_perf"] = {"columns": list(COLUMNS), "rows": rows}
    return out
