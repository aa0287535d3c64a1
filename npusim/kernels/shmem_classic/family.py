"""Family ``shmem_classic``: hicann/shmem's dispatch_classic and combine_classic examples.

Tensor names are the examples' file names (data_gen.py, main.cpp). The report gets the
examples' --perf metrics (full_op, comm_only, DataSize, bandwidth) as family_fields, and
`npusim run --harness-csv FILE` writes their CSV rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npusim.kernels.common.limits import kernel_limits
from npusim.kernels.common.padded import PaddedExchange, padded_chain, padded_specs, per_expert_spec
from npusim.kernels.family import Misfit, Option
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.shmem_classic import reference as ref
from npusim.kernels.shmem_classic.combine import combine_program
from npusim.kernels.shmem_classic.data_gen import example_inputs
from npusim.kernels.shmem_classic.dispatch import dispatch_program
from npusim.kernels.shmem_classic.harness import perf_fields
from npusim.kernels.shmem_classic.layout import (
    DTYPE_NAMES,
    MAX_LOCAL_EXPERTS,
    UB_TMP_OFFSET,
    WORKLOAD_DTYPE,
    ClassicTiling,
)
from npusim.runtime.shmem import MAX_AIV_PER_NPU
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

COMBINE_DTYPES = ("int32_t", "float16_t")  # COMBINE_FUNC_DEF; run.sh refuses bfloat16_t


def _tok(t: ClassicTiling) -> np.dtype:
    return t.np_dtype


X = TensorSpec("x", _tok, lambda t, r: (t.BS, t.H), "[BS, H] tokens")
IDS = TensorSpec("expert_ids", const(np.int32), lambda t, r: (t.BS, t.K),
                 "[BS, K] expert of each (token, k)")
SCALES = TensorSpec("expert_scales", const(np.float32), lambda t, r: (t.BS, t.K),
                    "[BS, K] routing weights (1.0 for int32_t)")
DISPATCHED = padded_specs(_tok, ("expand_x", "assist_info", "ep_recv_count"), "W*BS*K")


class DispatchClassic(Kernel):
    name = "dispatch"
    profiles = True  # fields reads Call.frames: the harness frames
    phases = (
        Phase("send", "every core c (dst_rank c): five scans of expert_ids, a row "
              "mte_put_nbi + quiet per routed (token, k), assist signal_ops, ready and count "
              "puts (frame comm_only), then barrier_core_soft"),
        Phase("counts", "core 0: signal_wait_until on the W*L count entries, ep_recv_count "
              "and expert_token_nums; barrier"),
        Phase("compact", "core 0: per row the 8 ready ints, the row and triplet copied by "
              "scalar GM loads/stores, the flags re-armed; barrier"),
    )
    inputs = (X, IDS)
    outputs = (*DISPATCHED, per_expert_spec("expert_token_nums", np.int32,
                                            "[L] rows per local expert"))

    def program(self, tiling: ClassicTiling) -> Any:
        return dispatch_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return _perf(call.tiling, call.frames) if call.frames else {}


class CombineClassic(Kernel):
    name = "combine"
    profiles = True  # fields reads Call.frames: the harness frames
    phases = (
        Phase("send", "every core c (src_rank c): per row of segments (le, c) a row "
              "mte_put_nbi + quiet and a 32 B status put + quiet (frame comm_only)"),
        Phase("reduce", "tokens strided over the cores: K*8 status ints, the scalar "
              "reduction, the status cleared; barrier"),
    )
    inputs = (*DISPATCHED, IDS, SCALES)
    outputs = (TensorSpec("x_out", _tok, lambda t, r: (t.BS, t.H),
                          "[BS, H] combined tokens"),)

    def program(self, tiling: ClassicTiling) -> Any:
        return combine_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return _perf(call.tiling, call.frames) if call.frames else {}


def _perf(t: ClassicTiling, frames: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    return perf_fields(t.shape, t.dtype_name, t.elem, t.cores, t.counter_mhz, frames)


DISPATCH, COMBINE = DispatchClassic(), CombineClassic()


# The examples' shape limits (hicann/shmem examples/{dispatch,combine}/*_classic):
# - ep_world_size <= 48: the kernels launch pe_size AIV cores (dispatch_kernel.cpp: core c
#   serves rank c) and meet in aclshmemi_barrier_core_soft, whose core sync pool holds
#   ACLSHMEM_MAX_AIV_PER_NPU = 48 cores (include/host_device/shmem_common_types.h);
# - experts_per_rank 1..1024: DISPATCH_MAX_LOCAL_EXPERT_NUM (dispatch_kernel.h; main.cpp
#   and scripts/run.sh refuse more), so E <= 48 * 1024;
# - shared_experts 0: the kernels route to moe_expert_num = pe_size * local experts only
#   (dispatch_kernel.cpp), no shared expert;
# - bs, h, k: main.cpp asks only that they be positive: npusim's default ranges stay.
CLASSIC_LIMITS = kernel_limits(
    "hicann/shmem dispatch_classic / combine_classic: ep_world_size, experts_per_rank, "
    "shared_experts; bs, h, k npusim's default", ep_world_size=(2, MAX_AIV_PER_NPU),
    experts=MAX_AIV_PER_NPU * MAX_LOCAL_EXPERTS, experts_per_rank=(1, MAX_LOCAL_EXPERTS),
    shared_experts=(0, 0))


def dtype_name(shape: MoeShape, options: Mapping[str, Any]) -> str:
    """The examples' dtype: workload.data_type, or workload.dtype's name when auto."""
    name = options.get("data_type", "auto")
    return WORKLOAD_DTYPE[shape.dtype] if name == "auto" else name


class ShmemClassic(PaddedExchange):
    name = "shmem_classic"
    help = ("hicann/shmem's dispatch_classic / combine_classic examples: one core per peer, "
            "a put and a quiet per token, scalar element-by-element compaction and reduction")
    ops = (DISPATCH, COMBINE)
    chain = padded_chain(DISPATCH, COMBINE)
    options = (
        Option("data_type", "choice", "auto", "the examples' --dtype: int32_t, float16_t or "
               "bfloat16_t (dispatch only); auto: workload.dtype (float16 -> float16_t, "
               "bfloat16 -> bfloat16_t)", choices=("auto", *DTYPE_NAMES)),
    )
    shape_limits = CLASSIC_LIMITS

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> ClassicTiling:
        return ClassicTiling(shape, dtype_name(shape, options), hardware.chip.system_counter_mhz,
                             timing_only)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        name = dtype_name(shape, options)
        key = "workload.dtype" if options.get("data_type", "auto") == "auto" \
            else "workload.data_type"
        if op != "dispatch" and name not in COMBINE_DTYPES:
            return Misfit(key, f"{name}: combine_classic is built for int32_t and float16_t "
                          "only (COMBINE_FUNC_DEF; its run.sh refuses bfloat16_t); allowed "
                          "with op combine or dispatch_combine: int32_t, float16_t")
        aiv = hardware.chip.aiv_cores
        if shape.W > aiv:
            fewer = f", or ep_world_size <= {aiv}" if aiv >= 2 else ""  # W is at least 2
            return Misfit("hardware.chip.aiv_cores", f"chip.aiv_cores {aiv} for block_dim = "
                          f"ep_world_size = {shape.W} cores (core c serves rank c); allowed: "
                          f"at least {shape.W}{fewer}")
        return None

    def tiling_misfit(self, tiling: ClassicTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        if UB_TMP_OFFSET + t.ub_size > hardware.ub.bytes:
            return Misfit("hardware.ub.bytes", f"{hardware.ub.bytes} B: tmp_buff holds "
                          f"UB_DMA_MAX_SIZE = {t.ub_size} B at UB offset {UB_TMP_OFFSET}; "
                          f"allowed: at least {UB_TMP_OFFSET + t.ub_size} B")
        if t.window.end > hardware.window.bytes:
            return Misfit("hardware.window.bytes", f"the dispatch and combine windows need "
                          f"{t.window.end} B; the preset's window is {hardware.window.bytes} B")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        dt = DTYPE_NAMES[dtype_name(shape, options)]
        seed = routing.seed
        ex = example_inputs(shape.W, shape.BS, shape.H, shape.K, shape.L, dt, seed)
        ids = list(ex.expert_ids)
        if routing.kind != "uniform":  # uniform is data_gen.py's draw (with repeats)
            ids = routing.expert_ids(shape.W, shape.BS, shape.K, shape.E,
                                     np.random.default_rng(seed))
        out = []
        for r in range(shape.W):
            x = ex.x[r] if payload else np.zeros_like(ex.x[r])
            out.append({"x": x, "expert_ids": np.ascontiguousarray(ids[r], np.int32),
                        "expert_scales": ex.expert_scales[r]})
        return out

    def reference_dispatch(self, tiling: ClassicTiling, inputs: list[Arrays]) -> list[Arrays]:
        return ref.reference_dispatch([a["x"] for a in inputs],
                                      [a["expert_ids"] for a in inputs], tiling.L)


FAMILY = ShmemClassic()
