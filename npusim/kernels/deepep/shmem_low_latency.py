"""DeepEP-Ascend's low-latency mode with SHMEM (``mode: low_latency``, ``context: shmem``):
the `shmem_ver` branch's aclnnShmemMoeDistributeDispatchV2 / CombineV2 (sgl-project/
sgl-kernel-npu, DEEPEP_SHMEM_ENABLE=1, A3 only).

They are the branch's HCCL fork of mc2's V2 pair step for step, so low_latency.py's
programs, tiling, chain and reference run them; what differs is the window (the metadata
block's addresses, SHMEM's put: shmem_ll_window.py), the per-core state word both kernels
share (the combine finds it as the dispatch left it: the ``shmem_state`` heap input), no
in-kernel window check, and the limits of the branch's own tilings (its Shmem_Buff check
of a constant 4000 MiB).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep import shmem_layout as sl
from npusim.kernels.deepep import shmem_ll_window as sw
from npusim.kernels.deepep.common import limits_misfit
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, TensorSpec, const
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.units import MiB
from npusim.workload.shape import MoeShape

U32 = np.uint32
STATE_WORDS = sw.WIN_ADDR_ALIGN // 4  # uint32 per core's 512 B
# the branch's tilings (op_host/shmem_moe_distribute_{dispatch,combine}_v2_tiling.cpp), as
# (workload key, what, the shape's value, lo, hi, the constants)
LIMITS = (
    ("workload.ep_world_size", "epWorldSize", lambda s: s.W, 2, 768,
     "MIN_EP_WORLD_SIZE, MAX_EP_WORLD_SIZE"),
    ("workload.experts_per_rank", "moeExpertNum (ep_world_size * experts_per_rank)",
     lambda s: s.E, 1, 1024, "MOE_EXPERT_MAX_NUM"),
    ("workload.bs", "xDim0 (BS)", lambda s: s.BS, 1, 512, "BS_UPPER_BOUND"),
    ("workload.h", "H", lambda s: s.H, 1024, 8192, "H_MIN, H_MAX"),
    ("workload.k", "K", lambda s: s.K, 1, 16, "K_MAX"),
)
RUNS = {"dispatch": ("shmem_moe_distribute_dispatch_v2",),
        "dispatch_combine": ("shmem_moe_distribute_dispatch_v2",
                             "shmem_moe_distribute_combine_v2"),
        "combine": ("shmem_moe_distribute_combine_v2",)}
DISPATCH_PHASES = {
    "set_status": "every core: S_r + E counts, SyncAll, one 32 B shmem_put_int32_mem_nbi each "
                  "into the expert's rank's status (the metadata block)",
}
COMBINE_PHASES = {
    "send": "every core: its share of ep_recv_count[-1] rows, one row "
            "(shmem_put_bfloat16_mem_nbi), barrier and flag (shmem_put_float_mem_nbi) at a "
            "time",
}


def _state_words(t: Mc2Tiling, r: int) -> tuple[int, int]:
    return (t.cores, STATE_WORDS)


SHMEM_STATE = TensorSpec(
    "shmem_state", const(U32), _state_words,
    "[C, 128] the metadata block's per-core state words (heap offset 0) as the dispatch "
    "left them: ShmemInitWinState flipped word 0 from the calloc'd 0 to 1",
    heap=lambda t: 0)


class ShmemDispatch(ll.LowLatencyDispatch):
    """ShmemMoeDistributeDispatchV2: the fork's dispatch on the metadata block."""

    name = "shmem_moe_distribute_dispatch_v2"
    phases = ll._phases(ll.DISPATCH.phases, DISPATCH_PHASES)


class ShmemCombine(ll.LowLatencyCombine):
    """ShmemMoeDistributeCombineV2: the fork's combine; its data state is the word the
    dispatch flipped."""

    name = "shmem_moe_distribute_combine_v2"
    phases = ll._phases(ll.COMBINE.phases, COMBINE_PHASES)
    inputs = (*ll.COMBINE.inputs, SHMEM_STATE)


DISPATCH, COMBINE = ShmemDispatch(), ShmemCombine()


def state_after_dispatch(t: Mc2Tiling) -> np.ndarray:
    """The state words a dispatch leaves from the calloc'd block: word 0 flipped to 1 (the
    other words are not read by the combine)."""
    words = np.zeros((t.cores, STATE_WORDS), U32)
    words[:, 0] = 1
    return words


def shmem_tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
                 timing_only: bool) -> Mc2Tiling:
    """The fork's tiling (HCCL_BUFFSIZE plays no part: its window is replaced)."""
    t = ll.tiling(shape, {**options, "hccl_buffsize": 0}, hardware, timing_only)
    return replace(t, window=sw.ShmemLLWindow.of(t.window, shape.BS))


class LowLatencyShmem(ll.LowLatency):
    help = ("DeepEP-Ascend's low-latency mode with SHMEM (sgl-kernel-npu shmem_ver, A3): "
            "ShmemMoeDistributeDispatchV2 / CombineV2, mc2's V2 programs on the metadata block")
    ops = (DISPATCH, COMBINE)
    runs = RUNS
    dispatch = DISPATCH
    combine = COMBINE

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Any:
        return shmem_tiling(shape, options, hardware, timing_only)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        """Every low-latency check, deep_ep.cpp's assert, then the branch's tilings."""
        bad = self.low_latency_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        if op not in RUNS:
            return Misfit("workload.op", f"{op}: get_dispatch_layout belongs to the normal "
                          f"mode; allowed with mode low_latency: {', '.join(RUNS)}")
        if options["comm_alg"] != "fullmesh":
            return Misfit("workload.comm_alg", f"{options['comm_alg']}: deep_ep.cpp passes "
                          "comm_alg fullmesh_v1 to the SHMEM pair; allowed: fullmesh")
        bad = limits_misfit(LIMITS, shape, "the SHMEM low-latency kernels", sw.SRC)
        if bad is not None:
            return bad
        if shape.K > shape.E:
            return Misfit("workload.k", f"{shape.K}: K must be at most the experts {shape.E} "
                          f"({sw.SRC}); allowed: 1..{shape.E}")
        top = options["num_max_dispatch_tokens_per_rank"]
        if top and top < shape.BS:
            return Misfit("workload.num_max_dispatch_tokens_per_rank", f"{top}: "
                          "num_max_dispatch_tokens_per_rank >= x.size(0) fails (deep_ep.cpp "
                          f"EP_HOST_ASSERT); allowed: 0 (bs) or at least bs = {shape.BS}")
        max_bs = top or shape.BS
        need = sw.shmem_buff_need(max_bs, shape.H, shape.W, shape.L, shape.K, shape.S)
        if need > sw.SHMEM_BUFF:
            return Misfit("workload.num_max_dispatch_tokens_per_rank", f"{max_bs} tokens per "
                          f"rank: Shmem_Buff is too SMALL: NEEDED {need // MiB + 1} MB "
                          "(((maxBs Align512(Align32(2H) + 44) W L) + (maxBs Align512(2H) "
                          f"K)) x 2) > the constant {sw.SHMEM_BUFF_MB} MB ({sw.SRC} "
                          "CheckWinSize); allowed: fewer tokens, a smaller H or fewer ranks")
        return None

    def tiling_misfit(self, tiling: Mc2Tiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        """The areas of one dispatch / combine pair: apart and inside the 8 GiB heap."""
        win = tiling.window
        both = win.overlap()
        if both is not None:
            return Misfit("workload.bs", f"{shape.BS}: the pair's {both[0]} and {both[1]} "
                          "areas overlap in the metadata block's fixed offsets "
                          "(shmem_moe_distribute_{dispatch,combine}_v2.h GetWind*AddrByRankId),"
                          " so a put would overwrite another's bytes; allowed: a shape whose "
                          "areas stay apart")
        if win.end > sl.LOCAL_MEM_SIZE:
            return Misfit("workload.bs", f"{shape.BS}: the pair's areas end at {win.end} B, "
                          f"past DeepEP's SHMEM heap (local_mem_size {sl.LOCAL_MEM_SIZE} B, "
                          "deep_ep.cpp); allowed: fewer tokens")
        return None

    def window_bytes(self, tiling: Mc2Tiling, hardware: Any) -> int:
        """The PE's heap, deep_ep.cpp's local_mem_size (the preset's window is another
        host's choice: the CANN sample's)."""
        return sl.LOCAL_MEM_SIZE

    def op_inputs(self, kernel: str, tiling: Mc2Tiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        got = super().op_inputs(kernel, tiling, inputs, previous)
        if kernel != COMBINE.name:
            return got
        return [{**a, SHMEM_STATE.name: state_after_dispatch(tiling)} for a in got]


LOW_LATENCY_SHMEM = LowLatencyShmem()
