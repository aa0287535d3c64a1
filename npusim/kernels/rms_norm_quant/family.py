"""rms_norm_quant declared for the registry: op `rms_norm_quant`, x[rows, cols] fp16 ->
y int8, the sample's step 0..6 as the option `step`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.family import Misfit, Option
from npusim.kernels.kernel import Arrays, Phase, TensorSpec, const
from npusim.kernels.rms_norm_quant.program import rnq_program
from npusim.kernels.rms_norm_quant.tiling import RnqTiling, make_tiling
from npusim.kernels.vector_sample import TaskKernel, Unwindowed, regbase_misfit
from npusim.workload.routing import Routing


@dataclass(frozen=True)
class Tiling:
    rnq: RnqTiling
    world: int = 1

    @property
    def cores(self) -> int:
        return self.rnq.cores


def _xy(t: Tiling, r: int) -> tuple[int, int]:
    return (t.rnq.a, t.rnq.r)


class RmsNormQuantKernel(TaskKernel):
    name = "rms_norm_quant"
    phases = (Phase("init", "every core: scale and offset from GM, UB buffers"),
              Phase("gamma", "every core, steps 1-6: gamma copied and cast once"),
              Phase("rows", "every core: its rows, CopyInX / Compute / CopyOut"))
    inputs = (
        TensorSpec("x", const(np.float16), _xy, "[a, r] input"),
        TensorSpec("gamma", const(np.float16), lambda t, r: (t.rnq.r,), "[r] weight"),
        TensorSpec("scale", const(np.float16), const((1,)), "quantisation scale"),
        TensorSpec("offset", const(np.int8), const((1,)), "quantisation offset"),
    )
    outputs = (TensorSpec("y", const(np.int8), _xy, "[a, r] quantised"),)
    # no variant: the steps are seven programs, each row its own evidence (a ratio to a
    # default step would repeat two rows, not add one)

    def program(self, tiling: Tiling) -> Any:
        return rnq_program(tiling.rnq)

    def cores(self, tiling: Tiling) -> int | None:
        return tiling.cores


RNQ = RmsNormQuantKernel()


class RmsNormQuant(Unwindowed):
    name = "rms_norm_quant"
    uses_moe_shape = False  # a vector kernel on its own x: no tokens, ranks or experts
    help = ("RmsNormQuant of cann-samples rms_norm_quant_story, steps 0-6 of its src/ "
            "(MemBase, gamma once, 64 cores, VF, double buffer, UB rows, binary sum)")
    ops = (RNQ,)
    runs = {"rms_norm_quant": ("rms_norm_quant",)}
    options = (
        Option("step", "int", 5, "the sample's step: 0 naive, 1 gamma once, 2 multi-core, "
               "3 VF, 4 double buffer, 5 UB rows, 6 binary sum", lo=0, hi=6, exact=True),
        Option("rows", "int", 4096, "a, rows of x (the sample: 4096)", lo=1, hi=100_000),
        Option("cols", "int", 8192, "r, the normalised length (the sample: 8192); at most "
               "what the step's UB buffers hold (on the 950: 15,392 for steps 0-2, 29,120 "
               "for 3, 21,824 for 4 and 5, 8,192 for 6)", lo=1, hi=1 << 16),
    )

    def tiling(self, shape: None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Tiling:
        return Tiling(make_tiling(options["step"], options["rows"], options["cols"],
                                  hardware.chip.aiv_cores, hardware.ub.bytes))

    def misfit(self, shape: None, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if options["step"] >= 3:
            refused = regbase_misfit(hardware, f"step {options['step']}")
            if refused:
                return refused
        try:
            make_tiling(options["step"], options["rows"], options["cols"],
                        hardware.chip.aiv_cores, hardware.ub.bytes)
        except ValueError as exc:
            return Misfit("workload.cols", str(exc))
        return None

    def make_inputs(self, shape: None, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        """gen_data.py's distributions, seeded by the routing seed."""
        a, r = options["rows"], options["cols"]
        if not payload:
            return [{"x": np.zeros((a, r), np.float16), "gamma": np.zeros(r, np.float16),
                     "scale": np.zeros(1, np.float16), "offset": np.zeros(1, np.int8)}]
        rng = np.random.default_rng(routing.seed)
        return [{"x": rng.uniform(-100, 100, (a, r)).astype(np.float16),
                 "gamma": rng.uniform(-100, 100, r).astype(np.float16),
                 "scale": rng.uniform(-10, 10, 1).astype(np.float16),
                 "offset": rng.uniform(-10, 10, 1).astype(np.int8)}]


FAMILY = RmsNormQuant()
