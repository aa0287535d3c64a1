"""Family ``mega_moe``: CANN SHMEM's MegaMoE (hicann/shmem examples/shmem_mega_moe), the
fused dispatch -> GEMM1 -> SwiGLU -> GEMM2 -> combine layer of the Ascend 950, declared
for the registry. One op, `mega_moe`, one kernel on the MIX launch (1 AIC : 2 AIV per
block). Tensor names are the README's data table (snake case).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.common.limits import DEFAULT_LIMITS, kernel_limits
from npusim.kernels.exchange import ExchangeFamily
from npusim.kernels.family import Misfit, Option, Variant
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.mega_moe import reference as ref
from npusim.kernels.mega_moe.inputs import make_rank_inputs, weights_of
from npusim.kernels.mega_moe.overlap import timing_fields
from npusim.kernels.mega_moe.tiling import RING_BYTES, MegaTiling, auto_capacity
from npusim.kernels.quant import BF16
from npusim.units import align_up, ceil_div
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

U8 = const(np.uint8)
I32 = const(np.int32)


def _spec(name: str, dtype: Any, shape: Any, help_: str) -> TensorSpec:
    return TensorSpec(name, dtype, shape, help_)


INPUTS = (
    _spec("x", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 tokens"),
    _spec("expert_ids", I32, lambda t, r: (t.BS, t.K), "[BS, K] global expert ids"),
    _spec("routing_weights", const(np.float32), lambda t, r: (t.BS, t.K), "[BS, K] fp32"),
    _spec("weight1", U8, lambda t, r: (t.L, t.H, t.F),
          "[L, H, F] FP8 codes (gate columns, then up)"),
    _spec("weight1_scale", U8, lambda t, r: (t.L, t.H // 32, t.F), "[L, H/32, F] E8M0 per 32 "
          "along H"),
    _spec("weight2", U8, lambda t, r: (t.L, t.F2, t.H), "[L, F/2, H] FP8 codes"),
    _spec("weight2_scale", U8, lambda t, r: (t.L, t.F2 // 32, t.H), "[L, F/64, H] E8M0 per 32 "
          "along F/2"),
)
OUTPUTS = (
    _spec("y", const(BF16), lambda t, r: (t.BS, t.H), "[BS, H] bf16 combined output"),
    _spec("expert_token_counts", I32, lambda t, r: (t.L,), "[L] rows each local expert ran"),
)
SCRATCH = (
    _spec("received_token_data", U8, lambda t, r: (t.max_recv, t.H), "pulled FP8 rows"),
    _spec("received_token_scales", U8, lambda t, r: (t.max_recv, t.H // 32), "their E8M0"),
    _spec("activated_token_data", U8, lambda t, r: (t.max_recv, t.F2), "SwiGLU, FP8"),
    _spec("activated_token_scales", U8, lambda t, r: (t.max_recv, t.F2 // 32), "their E8M0"),
    _spec("received_token_counts", I32, lambda t, r: (t.L * 8 * t.block_dim,),
          "per expert and AIC, 32 B: the expert's row count"),
    _spec("routing_metadata", I32, lambda t, r: (t.max_recv * 8,),
          "32 B per row: source rank, token, k"),
    _spec("activation_ready", I32, lambda t, r: (t.L * 16,), "GEMM1 tiles done, per expert"),
    _spec("input_ready", I32, lambda t, r: (t.L * t.wave_slots,),
          "rows pulled per 256-row wave, per expert"),
)

PHASES = (
    Phase("build_send_masks", "every AIV: experts e = core mod 2*AIC, mask + count to the "
          "expert's rank"),
    Phase("quantize_local_tokens", "every AIV: its share of the tokens, bf16 -> MXFP8"),
    Phase("synchronize_ranks", "SyncAll, then AIV i < W: the generation-counter barrier"),
    Phase("count_received_tokens", "AIV1 of every block, per local expert; then the AIC"),
    Phase("dispatch", "AIV1 (BuildRoutingMetadataAndDispatch): remote MTE2 pulls of its "
          "(source rank, part) items, 256-row waves"),
    Phase("first_projection", "AIC: GEMM1 (gate, up) tiles to AIV0's UB; AIV0: SwiGLU + "
          "requant epilogue"),
    Phase("second_projection", "AIC: GEMM2 tiles to AIV0's UB, ping-pong; AIV0: "
          "CombineTokens, 512 B remote write-back per row"),
    Phase("combine", "SyncAll + SynchronizeRanks, then every AIV: CombineRoutedTokens"),
)


class MegaMoeKernel(Kernel):
    name = "mega_moe"
    phases = PHASES
    inputs = INPUTS
    outputs = OUTPUTS
    scratch = SCRATCH
    core_kind = "mix_aic_1_2"
    variant = "mode"

    def program(self, tiling: MegaTiling) -> Any:
        from npusim.kernels.mega_moe.program import mega_moe_program
        return mega_moe_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return {"expert_token_counts": [[int(v) for v in o["expert_token_counts"]]
                                        for o in call.outputs],
                **timing_fields(call.run, call.cores)}


MEGA_MOE = MegaMoeKernel()


# MegaMoE's shape limits (hicann/shmem @01fec19c examples/shmem_mega_moe):
# - h at most 7936: the dispatch pulls a quantised row (Align32(Align256(H) + H/32) B) into
#   one of six TOKEN_SCALE_SIZE = 8 KiB copy buffers (kernel/arch35/shmem_mega_moe_kernel.h),
#   so H <= 7936 among the multiples of 32;
# - shared_experts 0: README.md, global_expert_count = rank_count * local_expert_count;
# - the README's other constraints are options or the preset's (ffn_dim even,
#   local_expert_count <= the AIC cores; k <= W * L holds for every family);
# - bs, k, ep_world_size, E: no bound in the sample: npusim's default ranges stay.
MAX_H = max(h for h in range(32, RING_BYTES + 1, 32)
            if align_up(align_up(h, 256) + ceil_div(h, 32), 32) <= RING_BYTES)
MEGA_LIMITS = kernel_limits("hicann/shmem shmem_mega_moe: h at most 7936, no shared experts; "
                            "the rest npusim's default", h=(DEFAULT_LIMITS.h[0], MAX_H),
                            shared_experts=(0, 0))


class MegaMoe(ExchangeFamily):
    name = "mega_moe"
    help = ("CANN SHMEM MegaMoE (examples/shmem_mega_moe): dispatch, GEMM1, SwiGLU, GEMM2 "
            "and combine fused in one MIX kernel (1 AIC : 2 AIV), Ascend 950 only")
    ops = (MEGA_MOE,)
    references = True  # reference_outputs: the one kernel is the whole layer
    runs = {"mega_moe": ("mega_moe",)}
    shape_limits = MEGA_LIMITS
    # advise: its op is mega_moe (the layer fused), so only a shape of that op; the tokens
    # always travel MXFP8 (E4M3 or E5M2 elements, the two modes), the combine in bf16
    variants = tuple(Variant(m, {"mode": m}) for m in ("e4m3", "e5m2"))
    dispatch_quants = {"mxfp8": {}}
    combine_quants = {"none": {}}
    options = (
        Option("ffn_dim", "int", 1024, "FFN_DIM: GEMM1's output width (gate + up), even; "
               "F/2 a multiple of 32 (the E8M0 blocks of the activations)", lo=64, hi=16384),
        Option("mode", "choice", "e4m3", "MODE: arch35_e4m3 or arch35_e5m2 (FP8 tokens and "
               "weights, E8M0 scales per 32)", choices=("e4m3", "e5m2")),
        Option("max_received_tokens", "int", 0, "MAX_RECEIVED_TOKENS: rows a rank may receive "
               "over its experts (0: BS * W * min(K, L), also the least allowed)", lo=0,
               hi=1_000_000),
        Option("inputs", "choice", "random", "random (seeded tensors) or harness (the "
               "example harness's all-ones case: y = silu(H) * H * F/2)",
               choices=("random", "harness")),
    )

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> MegaTiling:
        return MegaTiling(shape, options["ffn_dim"], options["mode"],
                          options["max_received_tokens"] or auto_capacity(shape),
                          options["inputs"] == "harness", _aic_cores(hardware), timing_only)

    def window(self, tiling: MegaTiling) -> MegaTiling:
        return tiling

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        if hardware.chip.arch != "ascend950":
            return Misfit("hardware.chip.arch", f"{hardware.chip.arch}: mega_moe runs on the "
                          "Ascend 950 only (the MIX kernel of shmem_mega_moe is arch35); "
                          "allowed: ascend950")
        F = options["ffn_dim"]
        if F % 64:
            return Misfit("workload.ffn_dim", f"{F}: F/2 must be a multiple of 32 (E8M0 blocks "
                          "of the activations); allowed: multiples of 64")
        aic = _aic_cores(hardware)
        if shape.L > aic:
            return Misfit("workload.experts_per_rank", f"{shape.L} local experts exceed the "
                          f"{aic} AIC cores (LOCAL_EXPERT_COUNT <= #AIC)")
        cap = auto_capacity(shape)
        mr = options["max_received_tokens"]
        if mr and mr < cap:
            return Misfit("workload.max_received_tokens", f"{mr} is below BS * W * min(K, L) = "
                          f"{cap}; allowed: 0 (that capacity) or at least {cap}")
        return None

    def tiling_misfit(self, tiling: MegaTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        if t.row_bytes > RING_BYTES:
            return Misfit("workload.h", f"a quantised row of H = {shape.H} is {t.row_bytes} B, "
                          f"more than the {RING_BYTES} B pull buffer; allowed: H <= {MAX_H}")
        if t.window_bytes > hardware.window.bytes:
            return Misfit("hardware.window.bytes", f"the symmetric memory needs "
                          f"{t.window_bytes} B, more than the window's {hardware.window.bytes}")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        seeds = np.random.SeedSequence(routing.seed).spawn(1 + shape.W)
        ids = routing.expert_ids(shape.W, shape.BS, shape.K, shape.E,
                                 np.random.default_rng(seeds[0]))
        return [make_rank_inputs(np.random.default_rng(seeds[1 + r]), shape.BS, shape.H,
                                 shape.K, shape.L, options["ffn_dim"], options["mode"],
                                 options["inputs"] == "harness", ids[r], payload)
                for r in range(shape.W)]

    def reference_outputs(self, kernel: str, tiling: MegaTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        got = ref.reference_layer([a["x"] for a in inputs], [a["expert_ids"] for a in inputs],
                                  [a["routing_weights"] for a in inputs],
                                  [weights_of(a) for a in inputs], tiling.L, tiling.mode)
        return [{"y": y, "expert_token_counts": c}
                for y, c in zip(got.y, got.expert_token_counts, strict=True)]


def _aic_cores(hardware: Any) -> int:
    """AIC cores per rank (aic.cores), else half the AIV: the MIX launch is 1 AIC : 2 AIV."""
    aic = getattr(hardware, "aic", None)
    n = getattr(aic, "cores", None)
    return int(n) if n else hardware.chip.aiv_cores // 2


FAMILY = MegaMoe()
