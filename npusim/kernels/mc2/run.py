"""Running the mc2 kernels on a machine: GM tensors in, launch, GM tensors out.

The glue the family declaration (and the tests) use: which tensors each op reads and
writes, sized from the tiling, and the outputs read back in the reference's format.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from npusim.engine.trace import Trace
from npusim.hw.config import HardwareConfig
from npusim.hw.machine import Machine
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2.combine import combine_program
from npusim.kernels.mc2.dispatch import dispatch_program
from npusim.kernels.mc2.full_mesh import full_mesh_dispatch_program
from npusim.kernels.mc2.reference import DispatchInputs, DispatchOutputs, Mc2Shape
from npusim.kernels.mc2.tiling import ARCH_OF_PRESET, Mc2Tiling, workspace_ints
from npusim.kernels.mc2.window import mc2_window
from npusim.kernels.quant import token_dtype
from npusim.runtime.launch import LaunchResult, launch


def arch_of(cfg: HardwareConfig) -> str:
    """arch22 for the A3 preset, arch35 for the 950 (the operators' two code paths)."""
    for prefix, arch in ARCH_OF_PRESET.items():
        if cfg.name.startswith(prefix):
            return arch
    raise ValueError(f"preset {cfg.name!r}: the mc2 family knows atlas_a3 (arch22) and "
                     "ascend950 (arch35)")


def make_tiling(shape: Mc2Shape, cfg: HardwareConfig, dispatch_quant: str = "none",
                combine_quant: str = "none", expert_token_nums_type: int = 1,
                ccl_mb: int | None = None, expert_scales_out: bool = False,
                smooth_scales: bool = False, timing_only: bool = False,
                x_active_mask: str = "none", expert_scales: bool = True,
                shared_expert_x: bool = False, performance_info: bool = False,
                comm_alg: str = "fullmesh_v1", static_scales: str = "per_channel",
                quant_dtype: str = "e5m2") -> Mc2Tiling:
    from npusim.kernels.mc2.window import default_ccl_buffer_mb

    arch = arch_of(cfg)
    if ccl_mb is None:
        ccl_mb = default_ccl_buffer_mb(shape.max_bs, shape.H, shape.W, shape.L, shape.K,
                                       shape.S, arch, comm_alg)
    win = mc2_window(shape.max_bs, shape.H, shape.W, shape.L, shape.K, shape.S, dispatch_quant,
                     arch, ccl_mb, cfg.chip.aiv_cores, expert_scales=expert_scales_out,
                     combine_quant=combine_quant, comm_alg=comm_alg)
    return Mc2Tiling(shape, dispatch_quant, combine_quant, expert_token_nums_type, arch,
                     cfg.chip.aiv_cores, cfg.ub.bytes, win, smooth_scales, timing_only,
                     x_active_mask, expert_scales, shared_expert_x, static_scales,
                     performance_info=performance_info, comm_alg=comm_alg,
                     quant_dtype=quant_dtype)


def machine_for(cfg: HardwareConfig, t: Mc2Tiling, trace: Trace | None = None) -> Machine:
    """A machine whose windows are the CCL buffers of this call."""
    cfg = dataclasses.replace(cfg, window=dataclasses.replace(cfg.window,
                                                              bytes=t.window.ccl_bytes))
    m = Machine(cfg, t.W, trace or Trace(detailed=False))
    zones = t.window.regions(0)
    for rank in m.ranks:
        rank.window.set_zones(zones)
    return m


def run_dispatch(m: Machine, t: Mc2Tiling, inputs: list[DispatchInputs],
                 limit_ns: float = 1e9) -> tuple[LaunchResult, list[DispatchOutputs]]:
    shape = t.shape
    dt = token_dtype(shape.dtype)
    slot = t.window.dispatch
    for r, (rank, inp) in enumerate(zip(m.ranks, inputs, strict=True)):
        a = shape.rows_capacity(r)
        rank.tensor("x", np.ascontiguousarray(inp.x, dtype=dt))
        rank.tensor("expert_ids", np.ascontiguousarray(inp.expert_ids, dtype=np.int32))
        if inp.expert_scales is not None:
            rank.tensor("expert_scales", np.ascontiguousarray(inp.expert_scales, np.float32))
        if inp.scales is not None:
            rank.tensor("scales", np.ascontiguousarray(inp.scales, np.float32))
        if inp.x_active_mask is not None:
            rank.tensor("x_active_mask", np.ascontiguousarray(inp.x_active_mask, np.uint8))
        rank.tensor("expand_x", a * slot.out_bytes)
        rank.tensor("dynamic_scales", a * max(slot.scale_bytes, 4))
        rank.tensor("assist_info_for_combine", 12 * a)
        rank.tensor("expert_token_nums", 8 * shape.L)
        rank.tensor("ep_recv_count", 4 * shape.W * shape.L)
        if slot.expert_scale_offset is not None:
            rank.tensor("expand_scales", 4 * a)
        if workspace_ints(t):
            rank.tensor("workspace", 4 * workspace_ints(t))
        if t.performance_info:
            rank.tensor("performance_info", 8 * shape.W)
            rank.tensor("performance_info_cores", 8 * shape.W * t.cores)
    program = full_mesh_dispatch_program(t) if t.comm_alg == "fullmesh_v2" else dispatch_program(t)
    res = launch(m, program, time_limit_ns=limit_ns, cores=t.cores)
    m.performance_info = [rank.tensors["performance_info"].as_array(np.int64)
                          if t.performance_info else None for rank in m.ranks]
    outs = []
    for r, rank in enumerate(m.ranks):
        tens = rank.tensors
        a = shape.rows_capacity(r)
        xd = dt if t.dispatch_quant == "none" else np.int8
        scales = None
        if t.dispatch_quant == "int8":
            scales = tens["dynamic_scales"].as_array(np.float32)
        elif qm.fp8_mode(t.dispatch_quant):
            xd = np.uint8
            sd = qm.scale_dtype(t.dispatch_quant)
            scales = tens["dynamic_scales"].as_array(sd, (a, slot.scale_bytes // sd.itemsize))
        ep = tens["ep_recv_count"].as_array(np.int32)
        n = int(ep[t.status_count(r) - 1])
        outs.append(DispatchOutputs(
            expand_x=tens["expand_x"].as_array(xd, (a, shape.H)),
            dynamic_scales=scales,
            assist_info_for_combine=tens["assist_info_for_combine"].as_array(
                np.int32, (a, 3)),
            expert_token_nums=tens["expert_token_nums"].as_array(np.int64),
            ep_recv_count=ep,
            expand_scales=(tens["expand_scales"].as_array(np.float32)
                           if "expand_scales" in tens else None),
            n=n))
    return res, outs


def run_combine(m: Machine, t: Mc2Tiling, dispatch_out: list[DispatchOutputs],
                expert_rows: list[np.ndarray], combine_in: list[dict[str, np.ndarray]],
                limit_ns: float = 1e9) -> tuple[LaunchResult, list[np.ndarray]]:
    """combine_in per rank: expert_ids, [expert_scales], [shared_expert_x], [ori_x, const_*]."""
    shape = t.shape
    dt = token_dtype(shape.dtype)
    for r, rank in enumerate(m.ranks):
        d = dispatch_out[r]
        rank.tensor("expand_x", np.ascontiguousarray(expert_rows[r], dtype=dt))
        rank.tensor("assist_info_for_combine", np.ascontiguousarray(
            d.assist_info_for_combine, np.int32))
        rank.tensor("ep_recv_count", np.ascontiguousarray(d.ep_recv_count, np.int32))
        for name, arr in combine_in[r].items():
            if arr is not None:
                arr = np.asarray(arr)
                rank.tensor(name, np.ascontiguousarray(arr.astype(np.uint8) if arr.dtype == bool
                                                       else arr))
        rank.tensor("x", shape.bs[r] * shape.H * 2)
        if t.performance_info:
            rank.tensor("performance_info_cores", 8 * shape.W * t.cores)
    res = launch(m, combine_program(t), time_limit_ns=limit_ns, cores=t.cores)
    m.performance_info = [rank.tensors["performance_info_cores"].as_array(np.int64).reshape(
        t.cores, shape.W).max(axis=0) if t.performance_info else None for rank in m.ranks]
    outs = [rank.tensors["x"].as_array(dt, (shape.bs[r], shape.H))
            for r, rank in enumerate(m.ranks)]
    return res, outs
