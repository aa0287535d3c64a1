"""What DeepEP-Ascend's modes share: the options a scenario sets them by, DeepEP's platform
of a preset, HCCL_BUFFSIZE, the A2 build's limits, the inputs and the checks every mode
makes first. Each mode is a family on `DeepepMode` (normal.py, low_latency.py, layered.py);
family.py names them as the modes of the family ``deepep``.

Tensor names are deep_ep.cpp's (x, topk_idx, topk_weights)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from npusim.kernels.common.limits import DEFAULT_LIMITS
from npusim.kernels.deepep.misfit_a5 import a5_misfit
from npusim.kernels.deepep.window import DEFAULT_HCCL_BUFFSIZE_MB, needed_buffsize
from npusim.kernels.deepep.window_a5 import A5_MTE_STATE_WIN_SIZE
from npusim.kernels.exchange import ExchangeFamily
from npusim.kernels.family import Misfit, Option, Variant
from npusim.kernels.kernel import Arrays
from npusim.units import MiB
from npusim.workload.inputs import uniform_tokens
from npusim.workload.routing import make_routing
from npusim.workload.shape import MoeShape

I64, F32 = np.int64, np.float32
MAX_TOTAL_TOKENS = 131072  # deep_ep.cpp
MAX_ROUNDS = 256
PER_ROUND_RANGE = (32, 8192)
A5_ONLY = ("mx_fp8_e4m3", "mx_fp8_e5m2", "mx_fp4_e2m1", "pertoken_fp8_e4m3")
# DeepEP's platform of a chip (the preset's chip.arch, a CANN SoC name)
PLATFORM_OF_CHIP = {"ascend910_93": "a3", "ascend910b": "a2", "ascend950": "a5"}
MODELLED = ("a3", "a2", "a5")
A2_MAX_HCCS_PEERS = 8  # deep_ep.cpp: ranks per A2 server; more go over RDMA
# ops2 tiling (cam_moe_dispatch_normal_tiling.cc): the A2 build's shape limits, as
# (workload key, what, the shape's value, lo, hi, the tiling's constant)
A2_LIMITS: tuple[tuple[str, str, Callable[[MoeShape], int], int, int, str], ...] = (
    ("workload.bs", "tokens per rank", lambda s: s.BS, 1, 65536, "BS_UPPER_BOUND"),
    ("workload.experts_per_rank", "experts (ep_world_size * experts_per_rank)",
     lambda s: s.E, 1, 512, "MOE_EXPERT_MAX_NUM"),
    ("workload.h", "H", lambda s: s.H, 1024, 7168, "H_MIN, H_MAX"),
    ("workload.k", "top-k", lambda s: s.K, 1, 16, "K_MAX"),
)

OPTIONS = (
    Option("mode", "choice", "normal", "DeepEP's mode: normal (prefill: the four kernels) "
           "or low_latency (decode: low_latency_dispatch, low_latency_combine)",
           choices=("normal", "low_latency")),
    Option("quant", "choice", "bf16", "dispatch's quant_mode: bf16, int8 (per-token dynamic); "
           "on the Ascend 950 also mx_fp8_e4m3, mx_fp8_e5m2 (E8M0 per 32), mx_fp4_e2m1 "
           "(E2M1 pairs, E8M0 per 32) and pertoken_fp8_e4m3 (one fp32 scale per token), "
           "which DeepEP refuses on A2 and A3",
           choices=("bf16", "int8", *A5_ONLY)),
    Option("context", "choice", "hccl", "hccl: the HCCL kernels on HCCL's windows "
           "(windowsIn + windowsExp; on the A2 the status in windowsIn's last 8 MiB); "
           "shmem (A3): the shmem_ver branch's SHMEM kernels on DeepEP's 8 GiB SHMEM heap "
           "(DEEPEP_SHMEM_ENABLE=1)",
           choices=("hccl", "shmem")),
    Option("hccl_buffsize", "int", 0, "HCCL_BUFFSIZE in MB (totalWinSize); 0: the "
           "smallest DeepEP's check accepts (at least its default 200)", lo=0, hi=65536),
    Option("long_seq_round", "int", 1, "DEEPEP_NORMAL_LONG_SEQ_ROUND", lo=1, hi=MAX_ROUNDS),
    Option("per_round_tokens", "int", 8192, "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS",
           lo=PER_ROUND_RANGE[0], hi=PER_ROUND_RANGE[1]),
    Option("combine_enable_long_seq", "int", 0, "DEEPEP_NORMAL_COMBINE_ENABLE_LONG_SEQ: 1 "
           "hands the combine long_seq_round and per_round_tokens (the multi-round kernel "
           "when long_seq_round > 1); 0 (DeepEP's default): one round of up to 8192",
           lo=0, hi=1),
    Option("comm_alg", "choice", "fullmesh", "low_latency on an A2 with more than 8 "
           "ranks: hierarchy runs the layered kernels (DeepEP with "
           "HCCL_INTRA_PCIE_ENABLE=1 and HCCL_INTRA_ROCE_ENABLE=0: RDMA between servers, "
           "HCCS inside), fullmesh the AICPU BatchWrite kernels (not "
           "modelled); one server or the A3: fullmesh",
           choices=("fullmesh", "hierarchy")),
    Option("num_max_dispatch_tokens_per_rank", "int", 0, "low_latency: the argument of "
           "low_latency_dispatch / combine (global_bs = it x W sizes the window); 0: bs",
           lo=0, hi=MAX_TOTAL_TOKENS),
)


def platform(hardware: Any) -> str | None:
    """DeepEP's platform of the preset's chip (a user's copy under any name included)."""
    return PLATFORM_OF_CHIP.get(hardware.chip.arch)


def buffsize_mb(shape: MoeShape, options: Mapping[str, Any], platform: str = "a3") -> int:
    """hccl_buffsize, or 0: the smallest DeepEP's check accepts (on the 950 plus the 4 MiB
    state zone the check does not count, which the data halves follow)."""
    if options["hccl_buffsize"]:
        return options["hccl_buffsize"]
    per_round = options["per_round_tokens"]
    need = needed_buffsize(min(shape.BS, per_round), shape.H, shape.K,
                           options["long_seq_round"], platform)
    if platform == "a5":
        need += A5_MTE_STATE_WIN_SIZE
    return max(DEFAULT_HCCL_BUFFSIZE_MB, need // MiB + 1)


class DeepepMode(ExchangeFamily):
    """One of DeepEP's modes as a family: the declarations every mode shares (the
    options, advise's variants and quantisations, the shape limit), the inputs of
    deep_ep.cpp's calls and the checks every mode makes first."""

    name = "deepep"
    references = True  # reference_outputs
    chains = True  # next_reads
    shape_limits = replace(DEFAULT_LIMITS, bs=(1, MAX_TOTAL_TOKENS), why="kernel limit",
                           source="deep_ep.cpp: MAX_TOTAL_TOKENS; the rest npusim's default")
    # advise: each mode in each context (the context moves addresses only); dispatch's
    # quant_mode 0 / 2 and A5's MXFP8 (refused here as DeepEP refuses it off the A5); the
    # combine is BF16 whatever the dispatch (comm_quant_mode 0)
    variants = tuple(Variant(f"{m}_{c}", {"mode": m, "context": c})
                     for m in ("normal", "low_latency") for c in ("hccl", "shmem"))
    dispatch_quants = {"none": {"quant": "bf16"}, "int8": {"quant": "int8"},
                       "mxfp8": {"quant": "mx_fp8_e4m3"}}
    combine_quants = {"none": {}}
    options = OPTIONS

    def window(self, tiling: Any) -> Any:
        return tiling.window

    def shared_misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any
                      ) -> Misfit | None:
        """What every mode refuses: SHMEM off the A3, an unmodelled platform, the A2
        normal kernels' bounds, A5-only quantisations, shared experts, non-BF16 tokens."""
        p = platform(hardware)
        if options["context"] == "shmem" and p != "a3":
            return Misfit("workload.context", f"shmem: preset {hardware.name!r} has no SHMEM "
                          "DeepEP kernels (the shmem_ver kernels are csrc/deepep/ops, built for "
                          "A3); allowed: hccl")
        if p not in MODELLED:
            return Misfit("hardware", f"{hardware.name}: the deepep family models the A3 "
                          "kernels (csrc/deepep/ops), the A2's (ops2) inside one server and "
                          "the Ascend 950's normal and low-latency modes; allowed: atlas_a3, "
                          "atlas_a2, ascend950")
        if p == "a2" and options["mode"] == "normal":
            bad = a2_misfit(shape)
            if bad is not None:
                return bad
        if p == "a5":
            bad = a5_misfit(shape, options) if options["mode"] == "normal" else None
            if bad is not None:
                return bad
        elif options["quant"] in A5_ONLY:
            return Misfit("workload.quant", f"{options['quant']} is not supported on this "
                          "device, please use int8 or bf16 instead (deep_ep.cpp, A2 and A3 "
                          "builds); allowed: bf16, int8")
        if shape.S:
            return Misfit("workload.shared_experts", f"{shape.S}: shared-expert ranks are not "
                          "modelled in the deepep family; allowed: 0")
        if shape.dtype != "bfloat16":
            return Misfit("workload.dtype", f"{shape.dtype}: DeepEP's dispatch takes bf16 "
                          "tokens; allowed: bfloat16")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Mapping[str, Any], payload: bool) -> list[Arrays]:
        rx, rr, rw = _rngs(routing)
        ids = topk_ids(shape, routing, rr)
        dt = shape.np_dtype
        out = []
        for r in range(shape.W):
            x = (uniform_tokens(rx, (shape.BS, shape.H), dt) if payload
                 else np.zeros((shape.BS, shape.H), dt))
            out.append({"x": x, "topk_idx": np.asarray(ids[r], I64),
                        "topk_weights": rw.uniform(0, 1, (shape.BS, shape.K)).astype(F32)})
        return out


def _rngs(routing: Mapping[str, Any]) -> list[np.random.Generator]:
    """The draws of x, the routing and the weights, each from its own child of the seed."""
    seeds = np.random.SeedSequence(routing.get("seed", 0)).spawn(3)
    return [np.random.default_rng(c) for c in seeds]


def topk_ids(shape: MoeShape, routing: Mapping[str, Any],
             rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Per rank [BS, K] topk_idx: the routing file's, else drawn as make_inputs draws them."""
    ids = routing.get("expert_ids")
    if ids is not None:
        return list(ids)
    extra = {"sigma": routing["sigma"]} if "sigma" in routing else {}
    return make_routing(routing.get("routing", "balanced"), shape.W, shape.BS, shape.K,
                        shape.E, rng=_rngs(routing)[1] if rng is None else rng,
                        zipf_s=routing.get("zipf_s", 1.2), **extra)


def a2_misfit(shape: MoeShape) -> Misfit | None:
    """The A2 build's own limits: one server (deep_ep.cpp's groups of 8) and the ops2
    tiling's bounds."""
    if shape.W > A2_MAX_HCCS_PEERS:
        return Misfit("workload.ep_world_size", f"{shape.W}: on an A2, DeepEP runs more "
                      f"than {A2_MAX_HCCS_PEERS} ranks (one server) with its internode "
                      "kernels (notify_dispatch_a2, dispatch_normal_a2, "
                      "moe_distribute_combine_a2), which send through hccl BatchWrite, "
                      "whose AICPU side is not public, so they are not modelled; allowed: "
                      f"at most {A2_MAX_HCCS_PEERS} (across servers: mode low_latency, "
                      "comm_alg hierarchy)")
    return limits_misfit(A2_LIMITS, shape, "the A2 normal kernels", "ops2")


def limits_misfit(limits: tuple[tuple[str, str, Callable[[MoeShape], int], int, int, str], ...],
                  shape: MoeShape, kernels: str, src: str) -> Misfit | None:
    """The first of a tiling's (key, what, value, lo, hi, constants) bounds the shape
    passes, on its key."""
    for key, what, value, lo, hi, name in limits:
        v = value(shape)
        if not lo <= v <= hi:
            return Misfit(key, f"{v}: {kernels} take {what} in [{lo}, {hi}] ({src} {name}); "
                          f"allowed: {lo}..{hi}")
    return None
