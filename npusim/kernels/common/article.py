"""The inputs of the cann-recipes-infer SHMEM article's worker (tilelang_shmem and
pypto_shmem run the same draw), and what their tilings share.

One numpy Generator seeded with the routing's seed draws the expert ids (the scenario's
routing), then per rank x ~ U(-1, 1) as bf16 [BS, H] and expert_scales ~ U(-1, 1) as
float32 [BS, K], in that order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.formats import token_dtype
from npusim.kernels.common.mix import MixLaunch
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, TensorSpec, const
from npusim.kernels.shape import OnShape
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

BF16 = token_dtype("bfloat16")

# the worker's three inputs, as both families' kernels take them
X = TensorSpec("x", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 tokens")
IDS = TensorSpec("expert_ids", const(np.int32), lambda t, r: (t.BS, t.K),
                 "[BS, K] expert of each (token, k), K distinct per token")
SCALES = TensorSpec("expert_scales", const(np.float32), lambda t, r: (t.BS, t.K),
                    "[BS, K] routing weights")


class ArticleTiling(MixLaunch, OnShape):
    """A tiling of the article's kernels: a MIX launch on a MoE shape whose dispatch
    writes every source's BS tokens for each local expert."""

    @property
    def max_recv(self) -> int:
        """expandX's rows: ep_world_size * Bs * local_expert_num."""
        return self.W * self.BS * self.L


def article_inputs(shape: MoeShape, routing: Routing, payload: bool) -> list[Arrays]:
    """Per rank x (zeros when not payload, drawn all the same), expert_ids, expert_scales."""
    rng = np.random.default_rng(routing.seed)
    ids = routing.expert_ids(shape.W, shape.BS, shape.K, shape.E, rng)
    out = []
    for r in range(shape.W):
        x = rng.uniform(-1.0, 1.0, (shape.BS, shape.H)).astype(BF16)
        scales = rng.uniform(-1.0, 1.0, (shape.BS, shape.K)).astype(np.float32)
        out.append({"x": x if payload else np.zeros_like(x),
                    "expert_ids": np.ascontiguousarray(ids[r], np.int32),
                    "expert_scales": scales})
    return out


class ArticleInputs:
    """A family whose make_inputs is the worker's draw (put before ExchangeFamily)."""

    def make_inputs(self, shape: MoeShape, options: Any, op: str, routing: Routing,
                    payload: bool) -> list[Arrays]:
        return article_inputs(shape, routing, payload)

    def bf16_misfit(self, shape: MoeShape, built: str) -> Misfit | None:
        """The worker's x is bf16 (X): kernels `built` for it take no other token dtype."""
        if shape.dtype == "bfloat16":
            return None
        return Misfit("workload.dtype", f"{shape.dtype}: {built} for bfloat16 tokens; "
                      "allowed: bfloat16")


def window_misfit(need: int, hardware: Any, held: str) -> Misfit | None:
    """The worker's aclshmem tensors (`held` says which) against the preset's window."""
    have = hardware.window.bytes
    if need <= int(have):
        return None
    return Misfit("hardware.window.bytes", f"{held} need {need} B; the window is {have} B: "
                  "lower ep_world_size x experts_per_rank or bs")
