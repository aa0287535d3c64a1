"""The mc2 kernels in tests, driven as every family is: the family's tiling from a shape
and its options, then npusim.sim.run_op on a machine whose windows are the call's CCL
buffers; the outputs in the reference's format (npusim.kernels.mc2.reference)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from npusim.engine.trace import Trace
from npusim.hw.config import HardwareConfig
from npusim.hw.machine import Machine
from npusim.kernels.kernel import Kernel
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2.family import COMBINE, DISPATCH, FAMILY
from npusim.kernels.mc2.reference import DispatchInputs, DispatchOutputs
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.result import OpRun
from npusim.sim import run_op
from npusim.workload.shape import MoeShape


def make_tiling(shape: MoeShape, cfg: HardwareConfig, dispatch_quant: str = "none",
                combine_quant: str = "none", expert_token_nums_type: int = 1,
                expert_scales_out: bool = False, smooth_scales: bool = False,
                timing_only: bool = False, **options: Any) -> Mc2Tiling:
    """FAMILY.tiling of the shape with these options (the others: their defaults)."""
    opts = {**FAMILY.option_defaults(), "dispatch_quant": dispatch_quant,
            "combine_quant": combine_quant, "expert_token_nums_type": expert_token_nums_type,
            "expand_scales": expert_scales_out, "smooth_scales": smooth_scales,
            "bs_per_rank": shape.bs, "global_bs": shape.global_bs,
            "zero_experts": shape.zero_experts, "copy_experts": shape.copy_experts,
            "const_experts": shape.const_experts, **options}
    return FAMILY.tiling(shape, opts, cfg, timing_only=timing_only)


def machine_for(cfg: HardwareConfig, t: Mc2Tiling) -> Machine:
    """A machine whose windows are the CCL buffers of this call."""
    cfg = dataclasses.replace(cfg, window=dataclasses.replace(cfg.window,
                                                              bytes=t.window.ccl_bytes))
    return Machine(cfg, t.W, Trace(detailed=False))


def _op_inputs(kernel: Kernel, t: Mc2Tiling, given: list[dict[str, Any]]
               ) -> list[dict[str, np.ndarray]]:
    """Each input tensor of the kernel: the given array, or zeros of its declared shape."""
    out = []
    for r, arrays in enumerate(given):
        row = {}
        for spec in kernel.inputs:
            a = arrays.get(spec.name)
            if a is None:
                a = np.zeros(spec.shape(t, r), spec.np_dtype(t))
            elif np.asarray(a).dtype == bool:
                a = np.asarray(a).astype(np.uint8)
            row[spec.name] = a
        out.append(row)
    return out


def run_dispatch(m: Machine, t: Mc2Tiling, inputs: list[DispatchInputs],
                 limit_ns: float = 1e9) -> tuple[OpRun, list[DispatchOutputs]]:
    given = [dataclasses.asdict(i) for i in inputs]
    run = run_op(m, FAMILY, DISPATCH, t, _op_inputs(DISPATCH, t, given), limit_ns)
    m.performance_info = [o["performance_info"] if t.performance_info else None
                          for o in run.outputs]
    outs = []
    for r, o in enumerate(run.outputs):
        scales = None
        if t.dispatch_quant in qm.PER_TOKEN_MODES or qm.vf_mode(t.dispatch_quant):
            scales = o["dynamic_scales"]
        ep = o["ep_recv_count"]
        outs.append(DispatchOutputs(
            expand_x=o["expand_x"], dynamic_scales=scales,
            assist_info_for_combine=o["assist_info_for_combine"],
            expert_token_nums=o["expert_token_nums"], ep_recv_count=ep,
            expand_scales=(o["expand_scales"] if t.window.dispatch.expert_scale_offset
                           is not None else None),
            n=int(ep[t.status_count(r) - 1])))
    return run, outs


def run_combine(m: Machine, t: Mc2Tiling, dispatch_out: list[DispatchOutputs],
                expert_rows: list[np.ndarray], combine_in: list[dict[str, np.ndarray]],
                limit_ns: float = 1e9) -> tuple[OpRun, list[np.ndarray]]:
    """combine_in per rank: expert_ids, [expert_scales], [shared_expert_x], [ori_x, const_*]."""
    given = [{**c, "expand_x": rows, "assist_info_for_combine": d.assist_info_for_combine,
              "ep_recv_count": d.ep_recv_count}
             for d, rows, c in zip(dispatch_out, expert_rows, combine_in, strict=True)]
    run = run_op(m, FAMILY, COMBINE, t, _op_inputs(COMBINE, t, given), limit_ns)
    m.performance_info = [o["performance_info_cores"].reshape(t.cores, t.W).max(axis=0)
                          if t.performance_info else None for o in run.outputs]
    return run, [o["x"] for o in run.outputs]
