"""What the layered kernels refuse: the run and the window's size before tiling, the IPC
area, the window and the cores from the tiling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.kernels.deepep.layered_layout import (
    COMBINE_FLAGS_PER_SERVER,
    COMBINE_REDUCE_CORES,
    IPC_FLAG_OFFSET,
    KERNEL,
    RUNS,
    SERVER_RANK_SIZE,
    MiB,
    win_size_min,
)
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.kernels.family import Misfit
from npusim.units import ceil_div
from npusim.workload.shape import MoeShape


def misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any, op: str
           ) -> Misfit | None:
    """What the layered dispatch refuses beyond the A2 tiling's bounds."""
    if op not in RUNS:
        return Misfit("workload.op", f"{op}: get_dispatch_layout belongs to the normal mode; "
                      f"allowed with comm_alg hierarchy: {', '.join(RUNS)}")
    if hardware.rdma is None:
        return Misfit("hardware.rdma", f"{hardware.name}: the layered kernels post RDMA "
                      "WRITEs to the other servers; the preset has no RDMA NIC")
    need = win_size_min(shape)
    mb = options["hccl_buffsize"]
    if mb and mb * MiB < need:
        return Misfit("workload.hccl_buffsize", f"The HCCL_BUFFSIZE is {mb}MB, the min value "
                      f"should be {need // MiB}MB ({KERNEL} Init); allowed: at least "
                      f"{ceil_div(need, MiB)}")
    return None


def tiling_misfit(t: LayeredTiling, shape: MoeShape, options: Mapping[str, Any],
                  hardware: Any, op: str) -> Misfit | None:
    """What the layered kernels refuse of their window and cores, from the run's tiling."""
    mb = options["hccl_buffsize"]
    if t.window.rank_size_on_ipc < t.shape.BS * t.struct_len:
        return Misfit("workload.hccl_buffsize", f"{mb}: the IPC area leaves "
                      f"{t.window.rank_size_on_ipc} B per (expert, source), less than BS "
                      f"token structs ({t.shape.BS * t.struct_len} B)")
    size = max(t.window.total_size, t.window.end)
    if size > hardware.window.bytes:
        return Misfit("hardware.window.bytes", f"{hardware.window.bytes} B cannot hold the "
                      f"HCCL_BUFFSIZE {t.window.total_size // MiB} MB window the layered "
                      f"kernel needs; allowed: at least {size}")
    if "combine" in op:
        flags_end = (t.server_num + 1) * COMBINE_FLAGS_PER_SERVER
        if t.cores < COMBINE_REDUCE_CORES + t.server_num or flags_end > IPC_FLAG_OFFSET:
            most = SERVER_RANK_SIZE * (IPC_FLAG_OFFSET // COMBINE_FLAGS_PER_SERVER - 1)
            return Misfit("workload.ep_world_size", f"{shape.W}: the layered combine needs "
                          f"{COMBINE_REDUCE_CORES} + serverNum AIV cores ({t.cores} here) "
                          "and its per-server token flags ((serverNum + 1) x 128 KiB) below "
                          f"the IPC flags at 1 MiB; allowed: at most {most}")
    if t.cores < 2 * t.server_num + 1 or t.cores < t.shape.L or t.cores < SERVER_RANK_SIZE:
        return Misfit("workload.ep_world_size", f"{shape.W}: {t.cores} AIV cores cannot give "
                      "every server a sender and a Win2Ipc core and every local expert an "
                      "Ipc2Out core")
    return None
