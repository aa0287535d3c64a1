"""Run the vector-sample kernels on one rank without scenario files (tests only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.hw.config import HardwareConfig
from npusim.hw.machine import Machine
from npusim.kernels.cann_gelu.program import GeluTiling, gelu_program
from npusim.kernels.rms_norm_quant.program import rnq_program
from npusim.kernels.rms_norm_quant.tiling import make_tiling
from npusim.runtime.launch import LaunchResult, launch


def run_gelu(cfg: HardwareConfig, x: np.ndarray, vf: bool, tile_bytes: int = 32768
             ) -> tuple[np.ndarray, LaunchResult]:
    m = Machine(cfg, 1)
    m.ranks[0].tensor("x", x.astype(np.float32))
    m.ranks[0].tensor("y", x.size * 4)
    res = launch(m, gelu_program(GeluTiling(x.size, tile_bytes, vf)),
                 launch_ns=cfg.kernel.task_launch_ns, cores=1)
    return m.ranks[0].tensors["y"].as_array(np.float32).copy(), res


def run_rnq(cfg: HardwareConfig, step: int, x: np.ndarray, gamma: np.ndarray,
            scale: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, LaunchResult, Any]:
    a, r = x.shape
    t = make_tiling(step, a, r, cfg.chip.aiv_cores, cfg.ub.bytes)
    m = Machine(cfg, 1)
    rank = m.ranks[0]
    for name, arr in (("x", x), ("gamma", gamma), ("scale", scale), ("offset", offset)):
        rank.tensor(name, arr.copy())
    rank.tensor("y", a * r)
    res = launch(m, rnq_program(t), launch_ns=cfg.kernel.task_launch_ns, cores=t.cores)
    return rank.tensors["y"].as_array(np.int8).reshape(a, r).copy(), res, t


def rnq_inputs(a: int, r: int, seed: int, integer: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """gen_data.py's distributions (x, gamma uniform(-100, 100) fp16, scale uniform(-10, 10)
    fp16, offset uniform(-10, 10) int8); integer=True draws x from the integers in
    [-32, 32], whose float32 sums of squares are exact in any order."""
    rng = np.random.default_rng(seed)
    if integer:
        x = rng.integers(-32, 33, (a, r)).astype(np.float16)
    else:
        x = rng.uniform(-100, 100, (a, r)).astype(np.float16)
    gamma = rng.uniform(-100, 100, r).astype(np.float16)
    scale = rng.uniform(-10, 10, 1).astype(np.float16)
    offset = rng.uniform(-10, 10, 1).astype(np.int8)
    return x, gamma, scale, offset
