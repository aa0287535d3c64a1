"""Family ``tilelang_shmem``: the TileLang-Ascend SHMEM dispatch / combine of
the cann-recipes-infer article "NPU DeepSeek SHMEM通信优化实践"
(tile-ai/tilelang-ascend examples/dispatch_combine/dispatch_combine_shmem.py). Tensor
names are the kernels' parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.common.article import BF16, IDS, SCALES, ArticleInputs, X, window_misfit
from npusim.kernels.common.limits import kernel_limits
from npusim.kernels.common.padded import PaddedExchange, padded_chain, padded_specs, per_expert_spec
from npusim.kernels.family import Misfit, Option
from npusim.kernels.kernel import Arrays, Kernel, Phase, TensorSpec, const
from npusim.kernels.tilelang_shmem import reference as ref
from npusim.kernels.tilelang_shmem.combine import combine_program
from npusim.kernels.tilelang_shmem.dispatch import dispatch_program
from npusim.kernels.tilelang_shmem.tiling import TileLangTiling, default_ub_size
from npusim.workload.shape import MoeShape

BF, I32 = const(BF16), const(np.int32)

DISPATCHED = padded_specs(BF, ("expand_x_out", "expand_ids", "ep_receive_count"), "W*Bs*L")


class Dispatch(Kernel):
    name = "dispatch"
    core_kind = "mix_aic_1_2"
    phases = (
        Phase("send", "every AIV (cur_vid = vid + 2 cid): its share of the Bs*K pairs; per "
              "pair the count macro, x row GM -> UB, the triple, shmem_ub_put_nbi of ub_size "
              "elements to the expert's rank"),
        Phase("status", "every AIV: its experts' [flag, count] entries; T.sync_all; an 8-word "
              "put per expert"),
        Phase("wait", "every AIV: its own status entries polled (copy + reduce_sum of the "
              "flags) until they sum to aiv_expert_fp_num; cleared"),
        Phase("prefix", "every AIV: its row total to workspace; T.sync_all; the prefix of "
              "the earlier cores' totals"),
        Phase("copy", "every AIV: per received row win_data -> UB -> expand_x_out and "
              "expand_ids; ep_receive_count"),
        Phase("token_nums", "T.sync_all; the last AIV: expert_token_nums_out by scalar "
              "loads between dcci's"),
    )
    inputs = (X, IDS)
    outputs = (*DISPATCHED, per_expert_spec("expert_token_nums_out", np.int64,
                                            "[L] int64 rows per local expert"))
    scratch = (TensorSpec("workspace", I32, lambda t, r: (t.aiv_num, 8),
                          "[aiv_num, 8] per-core row totals"),)

    def program(self, tiling: TileLangTiling) -> Any:
        return dispatch_program(tiling)


class Combine(Kernel):
    name = "combine"
    core_kind = "mix_aic_1_2"
    phases = (
        Phase("send", "every AIV: its share of the M received rows, rotated by rank; per "
              "row x -> UB, put H elements and then 8 x 1.0 status to the token's owner"),
        Phase("reduce", "every AIV: its share of the Bs tokens; per token poll the K*8 "
              "status floats into [8K-0.5, 8K+0.5], clear, K rows cast/muls/add, RINT cast, "
              "copy out"),
    )
    inputs = (TensorSpec("expand_x", BF, lambda t, r: (t.max_recv, t.H),
                         "[M, H] rows to send back (dispatch's expand_x_out)"),
              TensorSpec("assist_info_combine", I32, lambda t, r: (t.max_recv, 3),
                         "[M, 3] their triples (dispatch's expand_ids)"),
              TensorSpec("ep_send_counts", I32, lambda t, r: (t.total_expert_num,),
                         "[W*L] dispatch's ep_receive_count; M is its last value"),
              SCALES)
    outputs = (TensorSpec("combine_out", BF, lambda t, r: (t.BS, t.H),
                          "[Bs, H] bf16 weighted sums"),)

    def program(self, tiling: TileLangTiling) -> Any:
        return combine_program(tiling)


DISPATCH, COMBINE = Dispatch(), Combine()


def _ai_core_num(options: Mapping[str, Any], hardware: Any) -> int:
    n = int(options.get("ai_core_num", 0))
    return n or int(hardware.aic.cores)


def _ub_size(shape: MoeShape, options: Mapping[str, Any]) -> int:
    return int(options.get("ub_size", 0)) or default_ub_size(shape.H)


def max_h(fits: Any, lo: int = 1, hi: int = 1 << 16) -> int:
    """The largest H for which fits(H) holds (fits is monotone), 0 if none."""
    if not fits(lo):
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


# The example's shape limits (tile-ai/tilelang-ascend examples/dispatch_combine/
# dispatch_combine_shmem.py): shared_experts 0, its experts are total_expert_num =
# ep_world_size * local_expert_num and nothing else. It bounds no bs, h, k or
# ep_world_size (the UB and window needs are checked on the tiling): npusim's default stays.
TILELANG_LIMITS = kernel_limits("tilelang-ascend dispatch_combine_shmem.py: no shared experts; "
                                "the rest npusim's default", shared_experts=(0, 0))


class TileLangShmem(ArticleInputs, PaddedExchange):
    name = "tilelang_shmem"
    help = ("TileLang-Ascend SHMEM dispatch / combine (cann-recipes-infer's SHMEM "
            "article; tilelang-ascend examples/dispatch_combine): every AIV sends its share "
            "of pairs as UB -> remote puts, float status flags, row-by-row window copies")
    ops = (DISPATCH, COMBINE)
    chain = padded_chain(DISPATCH, COMBINE)
    shape_limits = TILELANG_LIMITS
    options = (
        Option("ai_core_num", "int", 0, "ai_core_num: blocks of T.Kernel (1 AIC + 2 AIV "
               "each), aiv_num = 2 x ai_core_num; 0: the preset's aic.cores", lo=0, hi=128),
        Option("ub_size", "int", 0, "ub_size: bf16 elements of a win_data row, the length of "
               "every dispatch put; 0: the worker's Align512(Align32(2H) + 32 + 12) / 2",
               lo=0, hi=262144),
    )

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> TileLangTiling:
        return TileLangTiling(shape, _ai_core_num(options, hardware), _ub_size(shape, options),
                              timing_only)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        bad = self.bf16_misfit(shape, "the TileLang kernels are written")
        if bad is not None:
            return bad
        if getattr(hardware, "aic", None) is None:
            return Misfit("hardware", "the TileLang kernels run a MIX launch (1 AIC : 2 AIV "
                          "per block); the preset has no aic section")
        aic, aiv = int(hardware.aic.cores), int(hardware.chip.aiv_cores)
        n = _ai_core_num(options, hardware)
        if aiv < 2:  # not even one block: no ai_core_num fits
            return Misfit("hardware.chip.aiv_cores", f"{aiv}: T.Kernel(ai_core_num) takes one "
                          f"AIC and two AIVs per block, {max(n, 1)} here; allowed: at least "
                          f"{2 * max(n, 1)}")
        if n > aic or 2 * n > aiv:
            return Misfit("workload.ai_core_num", f"{n}: T.Kernel(ai_core_num) takes one AIC "
                          f"and two AIVs per block; allowed: at most {min(aic, aiv // 2)} "
                          f"(aic.cores {aic}, chip.aiv_cores {aiv})")
        return None

    def tiling_misfit(self, tiling: TileLangTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        ub = int(hardware.ub.bytes)
        if t.ub_size < t.x_ub_elems:
            return Misfit("workload.ub_size", f"{t.ub_size}: a win_data row must hold x_ub's "
                          f"H + 22 = {t.x_ub_elems} bf16 elements (the row, 32 B of quant "
                          f"space and the triple); allowed: at least {t.x_ub_elems}")
        if t.row_bytes > ub:
            return Misfit("workload.ub_size", f"{t.ub_size}: shmem_ub_put_nbi puts ub_size "
                          f"elements ({t.row_bytes} B) from x_ub, more than the UB's {ub} B "
                          f"(the put returns silently past the UB); allowed: at most {ub // 2}")
        need = max(t.dispatch_ub(), t.combine_ub() if op != "dispatch" else 0)
        if need > ub:
            def fits(h: int) -> bool:
                s = MoeShape(shape.W, shape.BS, h, shape.K, shape.L, dtype=shape.dtype)
                u = TileLangTiling(s, t.block_dim, max(_ub_size(s, {}), h + 22))
                return max(u.dispatch_ub(), u.combine_ub() if op != "dispatch" else 0) <= ub
            return Misfit("workload.h", f"{shape.H}: the kernels' alloc_ub buffers (x_ub of "
                          f"H + 22 bf16, the combine's bf16 and fp32 rows) need {need} B of "
                          f"UB, the preset's UB is {ub} B; allowed: H <= {max_h(fits)} here")
        return window_misfit(t.window.end, hardware, f"win_data [W*L*Bs = "
                             f"{t.total_expert_num}*{shape.BS}, ub_size {t.ub_size}] and the "
                             "other three tensors")

    def reference_dispatch(self, tiling: TileLangTiling, inputs: list[Arrays]
                           ) -> list[Arrays]:
        return ref.reference_dispatch([a["x"] for a in inputs],
                                      [a["expert_ids"] for a in inputs], tiling.L)


FAMILY = TileLangShmem()
