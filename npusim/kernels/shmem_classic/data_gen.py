"""Inputs drawn the way the examples' scripts/data_gen.py draws them (written anew).

One numpy Generator (PCG64) seeded with the seed draws, in this order: every rank's x
(int32: integers in [-5, 5]; fp16 / bf16: U(-1, 1) cast), then expert_ids [W, BS, K]
uniform in [0, W * L) with repeats, then expert_scales [W, BS, K] U(0.05, 1) as float32
(all 1.0 for int32). dispatch's data_gen.py stops after the ids; combine's draws the
scales next, so both scripts' values come out of the same stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def gen_x(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype == np.int32:
        return rng.integers(-5, 6, size=shape, dtype=np.int32)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


@dataclass(frozen=True)
class ExampleInputs:
    x: np.ndarray  # [W, BS, H]
    expert_ids: np.ndarray  # [W, BS, K] int32
    expert_scales: np.ndarray  # [W, BS, K] float32


def example_inputs(W: int, BS: int, H: int, K: int, L: int, dtype: np.dtype,
                   seed: int) -> ExampleInputs:
    rng = np.random.default_rng(seed)
    x = np.stack([gen_x(rng, (BS, H), dtype) for _ in range(W)])
    ids = rng.integers(0, W * L, size=(W, BS, K), dtype=np.int32)
    scales = rng.uniform(0.05, 1.0, size=(W, BS, K)).astype(np.float32)
    if dtype == np.int32:
        scales.fill(1.0)
    return ExampleInputs(x, ids, scales)
