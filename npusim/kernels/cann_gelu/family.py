"""cann_gelu declared for the registry: op `gelu`, x[n] fp32 -> y[n] fp32 on one core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.cann_gelu.program import GeluTiling, gelu_program
from npusim.kernels.family import Misfit, Option
from npusim.kernels.kernel import Arrays, Phase, TensorSpec, const
from npusim.kernels.vector_sample import TaskKernel, Unwindowed, regbase_misfit
from npusim.workload.routing import Routing


@dataclass(frozen=True)
class Tiling(GeluTiling):
    world: int = 1  # one device
    cores: int = 1  # numBlocks = 1


class Gelu(TaskKernel):
    name = "gelu"
    phases = (Phase("gelu", "core 0: CopyIn, Compute, CopyOut per tile"),)
    inputs = (TensorSpec("x", const(np.float32), lambda t, r: (t.n,), "[n] input"),)
    outputs = (TensorSpec("y", const(np.float32), lambda t, r: (t.n,), "[n] GeLU(x)"),)
    variant = "vf"

    def program(self, tiling: Tiling) -> Any:
        return gelu_program(tiling)


GELU = Gelu()


class CannGelu(Unwindowed):
    name = "cann_gelu"
    uses_moe_shape = False  # one core's GeLU: no tokens, ranks or experts
    help = ("the GeLU sample of cann-samples hardware_features/vector_function: MemBase "
            "calls between PipeBarriers, or one vector function (vf: true)")
    ops = (GELU,)
    runs = {"gelu": ("gelu",)}
    options = (
        Option("vf", "bool", False, "gelu_with_vf (one VF per tile) instead of "
               "gelu_without_vf (MemBase calls)"),
        Option("elements", "int", 409600, "fp32 elements (the sample: 409,600)", lo=1,
               hi=10_000_000),
        Option("tile_bytes", "int", 32768, "bytes per tile, a multiple of 256 (the sample: "
               "32 KiB)", lo=256, hi=1 << 16),
    )

    def tiling(self, shape: None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Tiling:
        return Tiling(options["elements"], options["tile_bytes"], options["vf"])

    def misfit(self, shape: None, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if options["vf"]:
            refused = regbase_misfit(hardware, "gelu_with_vf (vf: true)")
            if refused:
                return refused
        tb = options["tile_bytes"]
        if tb % 256:
            return Misfit("workload.tile_bytes", f"{tb} is not a multiple of 256")
        if 6 * tb > hardware.ub.bytes:
            return Misfit("workload.tile_bytes", f"{tb}: the six tile buffers need "
                          f"{6 * tb} B of UB, more than {hardware.ub.bytes}")
        return None

    def make_inputs(self, shape: None, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        n = options["elements"]
        if not payload:
            return [{"x": np.zeros(n, np.float32)}]
        rng = np.random.default_rng(routing.seed)
        return [{"x": rng.uniform(-10.0, 10.0, n).astype(np.float32)}]  # the sample's


FAMILY = CannGelu()
