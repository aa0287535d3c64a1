"""DeepEP-Ascend's normal mode with SHMEM (``mode: normal``, ``context: shmem``): the
`shmem_ver` branch's kernels (sgl-project/sgl-kernel-npu, DEEPEP_SHMEM_ENABLE=1, A3 only):
dispatch_layout (the same kernel, its num_tokens_per_expert a symmetric tensor),
ShmemNotifyDispatch, ShmemMoeDispatchNormal, ShmemMoeCombineNormal.

What is the HCCL normal mode's is reused (normal.py: the tiling, dispatch_layout, the
layout chain, the report's fields); the heap layout and the limits the branch's tilings
check are shmem_layout.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from npusim.hw.memory import RowTable
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep import shmem_layout as sl
from npusim.kernels.deepep import shmem_reference as sref
from npusim.kernels.deepep.common import topk_ids
from npusim.kernels.deepep.normal import (
    LAYOUT,
    SEND_IDX,
    Normal,
    _bandwidth,
    _padded,
    buffer_dispatch_fields,
    normal_runs,
)
from npusim.kernels.deepep.shmem_combine import shmem_combine_program
from npusim.kernels.deepep.shmem_dispatch import shmem_dispatch_program
from npusim.kernels.deepep.shmem_notify import builder_cores, shmem_notify_program
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.workload.shape import MoeShape

I32, I64, F32 = np.int32, np.int64, np.float32


def _heap(name: str) -> Any:
    return lambda t: getattr(sl.ShmemHeap(t), name)


def _tok(t: DeepepTiling) -> np.dtype:
    return t.shape.np_dtype


def _rows(t: DeepepTiling, r: int) -> int:
    return t.rows_capacity


def _i32(name: str, shape: Any, help: str, heap: Any = None) -> TensorSpec:
    return TensorSpec(name, const(I32), shape, help, heap=heap)


COUNTS = _i32("num_tokens_per_expert", lambda t, r: (1, t.E),
              "[1, E] this rank's pairs per expert (one round; symmetric: peers pull it)",
              _heap("num_tokens_per_expert"))
PUT_OFFSET = _i32("put_offset", lambda t, r: (t.W * t.E,),
                  "[R*E] row of source s's first pair for expert e: put_offset[e*R + s]")


class ShmemKernel(Kernel):
    """A SHMEM normal kernel: its program from `build`; with `rows` the transfers that move
    a rank's rows of `row_bytes(tiling)` B each, for test_intranode's figures."""

    build: ClassVar[Callable[[DeepepTiling], Any]]
    rows: ClassVar[str] = ""
    row_bytes: ClassVar[Callable[[DeepepTiling], int]]

    def program(self, tiling: DeepepTiling) -> Any:
        return type(self).build(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        if not self.rows:
            return {}
        return _bandwidth(call.tiling, call.run, self.rows, type(self).row_bytes(call.tiling))


class ShmemNotifyDispatch(ShmemKernel):
    name = "shmem_notify_dispatch"
    build = shmem_notify_program
    phases = (Phase("all_gather", "cores with ranks: each peer's counts pulled through "
                    "shmem_ptr; SyncAll, shmem_barrier_all"),
              Phase("build", "every core: recv_data into UB; cores [0, min(R, C/2)): "
                    "put_offset; C/2, C/2+1, C/2+2: max_bs, total_recv_tokens, "
                    "recv_tokens_per_expert"))
    inputs = (COUNTS,)
    outputs = (_i32("recv_data", lambda t, r: (t.W, t.E), "[R, E] every rank's counts",
                    _heap("recv_data")),
               PUT_OFFSET,
               _i32("total_recv_tokens", lambda t, r: (1,), "[1] the most rows a rank receives"),
               _i32("max_bs", lambda t, r: (1,), "[1] the most pairs a rank sends, over K"),
               TensorSpec("recv_tokens_per_expert", const(I64), lambda t, r: (t.L,),
                          "[L] rows this rank receives per local expert"))


class ShmemMoeDispatchNormal(ShmemKernel):
    """Its rows: the puts a rank makes (each lands on the expert's rank)."""

    name = "shmem_moe_dispatch_normal"
    build = shmem_dispatch_program
    rows = "expand_x"
    row_bytes = staticmethod(lambda t: ll.token_bytes(t.H, t.quant))
    bandwidth = "bottleneck_bandwidth_gbps"
    phases = (Phase("input_to_dst_output", "every core: its pairs, each row put straight "
                    "into its expert's rank's expand_x"),
              Phase("barrier", "SyncAll, shmem_barrier_all"))
    variant = "quant"
    inputs = (TensorSpec("x", _tok, lambda t, r: (t.BS, t.H), "[BS, H] tokens"),
              _i32("expert_ids", lambda t, r: (t.BS, t.K), "[BS, K] topk_idx as int32"),
              SEND_IDX, PUT_OFFSET)
    outputs = (TensorSpec("expand_x", lambda t: t.out_dtype, lambda t, r: (_rows(t, r), t.H),
                          "[rows, H] recv_x (symmetric) by (local expert, source, token)",
                          heap=_heap("expand_x")),
               TensorSpec("dynamic_scales", const(F32), lambda t, r: (_rows(t, r),),
                          "[rows] int8 scales (symmetric)", heap=_heap("dynamic_scales")))


class ShmemMoeCombineNormal(ShmemKernel):
    """Its rows: the reads a rank makes (BS K, each from the expert's rank)."""

    name = "shmem_moe_combine_normal"
    build = shmem_combine_program
    rows = "read_row"
    row_bytes = staticmethod(lambda t: 2 * t.H)
    bandwidth = "bottleneck_bandwidth_gbps"
    phases = (Phase("read_from_remote", "every core: its tokens, K rows read from the "
                    "experts' ranks through shmem_ptr, weighted sum"),
              Phase("barrier", "SyncAll, shmem_barrier_all"))
    inputs = (TensorSpec("x", _tok, lambda t, r: (_rows(t, r), t.H),
                         "[rows, H] expert outputs (symmetric: the dispatch's recv_x)",
                         heap=_heap("combine_x")),
              _i32("ep_send_counts", lambda t, r: (t.W * t.E,), "the handle's put_offset"),
              TensorSpec("expert_scales", const(F32), lambda t, r: (t.BS, t.K),
                         "[BS, K] topk_weights"),
              _i32("expand_ids", lambda t, r: (t.BS, t.K), "[BS, K] topk_idx as int32"),
              SEND_IDX)
    outputs = (TensorSpec("combined_x", _tok, lambda t, r: (t.BS, t.H), "[BS, H]"),)


SHMEM_NOTIFY, SHMEM_DISPATCH, SHMEM_COMBINE = (ShmemNotifyDispatch(), ShmemMoeDispatchNormal(),
                                               ShmemMoeCombineNormal())
UB_NEEDS = ((SHMEM_NOTIFY, sl.notify_build_ub), (SHMEM_DISPATCH, sl.dispatch_ub),
            (SHMEM_COMBINE, sl.combine_ub))


def _limit(key: str, value: int, lo: int, hi: int, what: str) -> Misfit | None:
    if lo <= value <= hi:
        return None
    return Misfit(key, f"{value}: the SHMEM normal kernels take {what} in [{lo}, {hi}] "
                  f"(shmem_ver op_host tilings); allowed: {lo}..{hi}")


def _counts_misfit(shape: MoeShape) -> Misfit | None:
    """ShmemNotifyDispatch sums counts as fp32 (Cast, ReduceSum): a rank's rows must stay
    within fp32's exact integers."""
    most = shape.W * shape.BS * min(shape.K, shape.L)
    if most <= sl.FP32_EXACT:
        return None
    return Misfit("workload.bs", f"{shape.BS}: a rank can receive up to {most} rows, and "
                  "ShmemNotifyDispatch sums its counts with Cast to fp32 and ReduceSum, exact "
                  f"only up to {sl.FP32_EXACT}; allowed: ep_world_size * bs * min(k, "
                  f"experts_per_rank) <= {sl.FP32_EXACT}")


class NormalShmem(Normal):
    help = ("DeepEP-Ascend's normal mode with SHMEM (sgl-kernel-npu shmem_ver, A3): "
            "dispatch_layout, then the Shmem notify, dispatch and combine normal kernels")
    ops = (LAYOUT, SHMEM_NOTIFY, SHMEM_DISPATCH, SHMEM_COMBINE)
    runs = normal_runs(ops)
    sized_by_routing = True

    def size_by_routing(self, tiling: DeepepTiling, shape: MoeShape,
                        options: Mapping[str, Any], routing: Any) -> DeepepTiling:
        """deep_ep.cpp (SHMEM branch) makes expandx_out, dynamic_scales_out and the
        combine's recv_x in the heap for num_recv_tokens: notify's total_recv_tokens, the
        most rows any rank receives (1 when none), the same on every PE."""
        most = sref.most_recv_rows(sref.routed_counts(topk_ids(shape, routing), shape.E))
        return replace(tiling, recv_rows=max(1, most))

    def window_bytes(self, tiling: DeepepTiling, hardware: Any) -> int:
        """The PE's heap: local_mem_size, the library's sync pool past it (npusim places
        the pool right after the tensors)."""
        return max(sl.LOCAL_MEM_SIZE, sl.ShmemHeap(tiling).end)

    def window(self, tiling: DeepepTiling) -> sl.ShmemHeap:
        return sl.ShmemHeap(tiling)

    def run_fields(self, tiling: Any, runs: Any) -> list[dict[str, Any]]:
        return buffer_dispatch_fields(runs, (SHMEM_NOTIFY.name, SHMEM_DISPATCH.name))

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        """The normal calls' checks, then the branch's tilings' limits and the shapes
        whose result the kernels leave undefined."""
        bad = self.normal_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        if options["long_seq_round"] != 1:
            return Misfit("workload.long_seq_round", f"{options['long_seq_round']}: the SHMEM "
                          "kernels exchange one round of counts (sendCount = E, no round "
                          "dimension); allowed: 1")
        for bad in (_limit("workload.ep_world_size", shape.W, sl.MIN_EP_WORLD_SIZE,
                           sl.MAX_EP_WORLD_SIZE, "ep world size (MIN/MAX_EP_WORLD_SIZE)"),
                    _limit("workload.experts_per_rank", shape.E, 1,
                           min(sl.MOE_EXPERT_MAX_NUM, sl.DISPATCH_STATUS_MAX_SUPPORT_NUM),
                           "experts (MOE_EXPERT_MAX_NUM)"),
                    _limit("workload.k", shape.K, 1, min(sl.K_MAX, shape.E),
                           "top-k (K_MAX, at most the experts)"),
                    _limit("workload.h", shape.H, sl.H_MIN, sl.H_MAX, "H (H_MIN, H_MAX)"),
                    _counts_misfit(shape)):
            if bad is not None:
                return bad
        # the dispatch's rows are Align32(H item) B apart in the [rows, H] expandx_out and
        # the combine reads them 2H B apart: they agree only for H a multiple of 32 (INT8;
        # 16 for BF16), which npusim's H limit (multiples of 32) already requires
        return None

    def tiling_misfit(self, tiling: DeepepTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        roles = builder_cores(t.cores)
        if max(roles) >= t.cores:
            return Misfit("hardware.chip.aiv_cores", f"{t.cores}: ShmemNotifyDispatch builds "
                          f"{', '.join(roles.values())} on cores C/2, C/2 + 1, C/2 + 2 "
                          "(shmem_notify_dispatch.h); allowed: at least 6")
        ub = int(hardware.ub.bytes)
        for kernel, plan in UB_NEEDS:
            if kernel.name not in self.runs[op]:
                continue
            need = sl.ub_total(plan(t))
            if need > ub:
                return Misfit("workload.experts_per_rank", f"{shape.E} experts on {shape.W} "
                              f"ranks: {kernel.name} needs {need} B of UB (R * E * 4 = "
                              f"{4 * shape.W * shape.E} B of counts in UB; the tiling does "
                              f"not check it) but the UB has {ub}; allowed: R * E * 4 within "
                              f"{ub - need + 4 * shape.W * shape.E} B")
        heap = sl.ShmemHeap(t)
        if heap.sync_pool > sl.LOCAL_MEM_SIZE:
            return Misfit("workload.bs", f"{shape.BS}: the symmetric tensors for this "
                          f"routing's {t.rows_capacity} rows on the busiest rank end at "
                          f"{heap.sync_pool} B, past DeepEP's SHMEM heap (local_mem_size "
                          f"{sl.LOCAL_MEM_SIZE} B); allowed: fewer tokens")
        return None

    def pair_bytes(self, tiling: DeepepTiling, op: str, timing_only: bool, workers: int) -> int:
        """Dispatch: the row and scale it lands in expand_x; combine: its input row; with
        two workers the forked combine's reference dispatch rows as well."""
        t, kernels = tiling, self.runs[op]
        dispatch = sl.expand_row_bytes(t) + 4 if SHMEM_DISPATCH.name in kernels else 0
        combine = 0 if timing_only or SHMEM_COMBINE.name not in kernels else 2 * t.H
        reference = dispatch if workers >= 2 and SHMEM_COMBINE.name in kernels else 0
        return dispatch + combine + reference

    # ---- the chain (Normal.op_inputs with these steps)
    def _notify(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        got = self._kept(inputs).get(SHMEM_NOTIFY.name)
        if got is not None:
            return got
        lay = self._layout(t, inputs)
        return sref.notify([o["num_tokens_per_expert"] for o in lay], t.K)

    def _dispatch_counts(self, note: Arrays) -> Arrays:
        return {"put_offset": note["put_offset"]}

    def _combine_inputs(self, t: DeepepTiling, inputs: list[Arrays], lay: list[Arrays],
                        note: list[Arrays], previous: list[Arrays] | None) -> list[Arrays]:
        disp = previous if previous is not None else self._assumed_dispatch(t, inputs)
        return [{"x": self._combine_rows(t, d), "ep_send_counts": n["put_offset"],
                 "expert_scales": a["topk_weights"], "expand_ids": a["topk_idx"].astype(I32),
                 "send_token_idx_small": lo["send_token_idx_small"]}
                for a, lo, n, d in zip(inputs, lay, note, disp, strict=True)]

    def _combine_rows(self, t: DeepepTiling, d: Arrays) -> np.ndarray | RowTable:
        """The combine's recv_x: the dispatch's rows (INT8: per_token_cast_back, fp32(q) *
        scale to bf16, in a symmetric tensor of its own)."""
        rows = d["expand_x"]
        if t.quant != "int8":
            return rows
        if t.timing_only:  # zeros whatever the records held
            return RowTable.zeros(t.rows_capacity, t.H * _tok(t).itemsize)
        return (rows.astype(F32) * d["dynamic_scales"][:, None]).astype(_tok(t))

    def _x_rows_read(self, arrays: Arrays) -> int | None:
        """All of x: the other ranks read its rows at their own put offsets."""
        return None

    def _assumed_dispatch(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        if t.timing_only:
            return [{"expand_x": np.zeros((t.rows_capacity, t.H), t.out_dtype),
                     "dynamic_scales": np.zeros(t.rows_capacity, F32)} for _ in inputs]
        got = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs],
                           self._sizes(t), t.quant)
        return [{"expand_x": _padded(o["recv_x"], t.rows_capacity),
                 "dynamic_scales": _padded(o["dynamic_scales"], t.rows_capacity)} for o in got]


NORMAL_SHMEM = NormalShmem()
