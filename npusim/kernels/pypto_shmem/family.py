"""Family ``pypto_shmem``: the pyPTO SHMEM dispatch / combine subgraphs of the
cann-recipes-infer article "NPU DeepSeek SHMEM通信优化实践" as tile tasks on a MIX launch, placed
by a model of pyPTO's scheduling AICPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.common.article import BF16, IDS, SCALES, ArticleInputs, X, window_misfit
from npusim.kernels.common.limits import kernel_limits
from npusim.kernels.common.padded import PaddedExchange, padded_chain, padded_dispatch, padded_specs
from npusim.kernels.family import Misfit, Option
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.pypto_shmem.combine import combine_program
from npusim.kernels.pypto_shmem.dispatch import dispatch_program
from npusim.kernels.pypto_shmem.scheduler import stitch_fields
from npusim.kernels.pypto_shmem.tiling import STITCH_DEFAULT, STITCH_MAX, PyptoTiling
from npusim.units import ceil_div
from npusim.workload.shape import MoeShape

BF, I32, F32 = const(BF16), const(np.int32), const(np.float32)

EXPAND_X, ASSIST, RECV = padded_specs(
    BF, ("expand_x", "assist_info_for_combine", "ep_recv_counts"), "W*BS*L")


class Subgraph(Kernel):
    """A subgraph's tile tasks: a MIX launch whose WaitUntil the scheduling AICPUs poll;
    the report gets the stitching's device tasks (scheduler.stitch_fields)."""

    core_kind = "mix_aic_1_2"
    engines = ("aicpu",)

    def fields(self, call: Call) -> dict[str, Any]:
        return stitch_fields(call.tiling, call.cores)


class Dispatch(Subgraph):
    name = "dispatch"
    phases = (
        Phase("prepare", "AIV 0 (not in the article): offsetTable and totalOffset by a scalar "
              "scan of expert_ids"),
        Phase("send_token", "tasks (row, col) round robin over the AIVs: ShmemPut of the x "
              "row and of the 3-int message to the expert's slot at offsetTable"),
        Phase("send_signal", "tasks per expert: ShmemPut of the count, ShmemSignal ADD"),
        Phase("receive_token", "WaitUntil(signal == E) polled by the AICPU, ShmemGet of the "
              "counts, CumSum; tasks per (slot, row): ShmemGet + Assemble into expandX, per "
              "slot its info rows"),
    )
    inputs = (X, IDS)
    outputs = (EXPAND_X, ASSIST, RECV)
    scratch = (TensorSpec("offset_table", I32, lambda t, r: (t.BS, t.K),
                          "[BS, K] each pair's row in its expert's slot"),
               TensorSpec("total_offset", I32, lambda t, r: (t.E,), "[E] pairs per expert"))

    def program(self, tiling: PyptoTiling) -> Any:
        return dispatch_program(tiling)


class Combine(Subgraph):
    name = "combine"
    phases = (
        Phase("send", "tasks per received row round robin over the AIVs: ShmemPut to "
              "[rank, K*token + k], ShmemSignal ADD on the token"),
        Phase("receive", "per token on block token mod blocks: WaitUntil(K) by the AICPU; "
              "AIV0/AIV1 ShmemGet + Cast fp32 of half the rows each; AIC Matmul [1,K]x[K,H] "
              "(cube); AIV0 Cast bf16 + Assemble"),
    )
    inputs = (EXPAND_X, ASSIST,
              TensorSpec("recv_counts", I32, lambda t, r: (t.E,),
                         "[W*L] dispatch's ep_recv_counts (its last value: rows to send)"),
              SCALES)
    outputs = (TensorSpec("out", BF, lambda t, r: (t.BS, t.H),
                          "[BS, H] bf16 weighted sums"),)
    scratch = (TensorSpec("rows_fp32", F32, lambda t, r: (t.BS * t.K, t.H),
                          "[BS*K, H] the gathered rows cast to fp32"),
               TensorSpec("sum_fp32", F32, lambda t, r: (t.BS, t.H),
                          "[BS, H] the Matmul's fp32 output"))

    def program(self, tiling: PyptoTiling) -> Any:
        return combine_program(tiling)


DISPATCH, COMBINE = Dispatch(), Combine()


# pyPTO's shape limits: shared_experts 0, the dispatch sends expert e to rank
# e // expert_num_per_rank with moe_expert_num = W * L routed experts only (hicann/pypto
# python/tests/st/operator/distributed/test_moe_distributed_dispatch_combine.py,
# moe_distributed_dispatch_kernel). The same file's validate_moe_kernel_params admits only
# its test cases (ep_world_size 2, 4, 8 or 16; bs 1 or 8, 256 for combine; h 5120; 160
# experts; k 8) of that later kernel, not bounds of the subgraphs modelled here: bs, h, k,
# ep_world_size and E keep npusim's default ranges.
PYPTO_LIMITS = kernel_limits("pyPTO's MoE dispatch: no shared experts; the rest npusim's default",
                             shared_experts=(0, 0))


class PyptoShmem(ArticleInputs, PaddedExchange):
    name = "pypto_shmem"
    help = ("pyPTO SHMEM dispatch / combine (cann-recipes-infer's SHMEM article): LOOP "
            "subgraphs as tile tasks that scheduling AICPUs place on AIV/AIC cores; "
            "WaitUntil polled by the AICPU; the combine's weighted sum a cube Matmul")
    ops = (DISPATCH, COMBINE)
    chain = padded_chain(DISPATCH, COMBINE)
    shape_limits = PYPTO_LIMITS
    options = (
        Option("stitch_function_max_num", "int", STITCH_DEFAULT,
               "runtime_options.stitch_function_max_num: the root functions (loop "
               "iterations) the control-flow AICPU stitches into one device task; the "
               "scheduling AICPUs synchronise between device tasks", lo=1, hi=STITCH_MAX),
    )

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> PyptoTiling:
        aic = getattr(hardware, "aic", None)
        blocks = min(int(aic.cores), int(hardware.chip.aiv_cores) // 2) if aic else 1
        return PyptoTiling(shape, blocks, timing_only,
                           int(options.get("stitch_function_max_num", STITCH_DEFAULT)))

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        bad = self.bf16_misfit(shape, "the pyPTO subgraphs are built")
        if bad is not None:
            return bad
        for section, what in (("aic", "the AIC cores the Matmul runs on"),
                              ("aicpu", "the scheduling AICPUs that place the tile tasks")):
            if getattr(hardware, section, None) is None:
                return Misfit("hardware", f"the preset has no {section} section: {what}")
        return None

    def tiling_misfit(self, tiling: PyptoTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        ub, h = int(hardware.ub.bytes), ceil_div(shape.K, 2)
        if 6 * h * shape.H > ub:
            return Misfit("workload.h", f"{shape.H}: the receive's Cast tile [K/2, H] = "
                          f"[{h}, {shape.H}] in bf16 and fp32 needs {6 * h * shape.H} B of "
                          f"UB, the preset's UB is {ub} B; allowed: H <= {ub // (6 * h)}")
        return window_misfit(t.window.end, hardware, f"shmemData [W*L = {t.E}, BS {shape.BS}, "
                             f"H {shape.H}] and the rest")

    def reference_dispatch(self, tiling: PyptoTiling, inputs: list[Arrays]) -> list[Arrays]:
        """expandX holds W * BS * L rows (max_recv), rows past the received ones zero."""
        return [{"expand_x": p.rows, "assist_info_for_combine": p.triples,
                 "ep_recv_counts": p.running}
                for p in padded_dispatch([a["x"] for a in inputs],
                                         [a["expert_ids"] for a in inputs], tiling.L,
                                         tiling.max_recv)]


FAMILY = PyptoShmem()
