"""DeepEP-Ascend's low-latency mode on the A3: Buffer.low_latency_dispatch / low_latency_combine,
the kernels MoeLowLatencyDispatchV2 / CombineV2 (csrc/deepep/ops/op_kernel
moe_distribute_dispatch_v2.h, moe_distribute_combine_v2.h).

They are DeepEP's forks of ops-transformer's MoeDistributeDispatchV2 / CombineV2, which the
``mc2`` family models with ``comm_alg: fullmesh_v1``. So this module runs mc2's programs on
mc2's tiling and names what differs (docs/kernels/deepep.md, "Low-latency mode"):

- the call: deep_ep.cpp passes no expert scales to the dispatch (it copies none), global_bs =
  num_max_dispatch_tokens_per_rank x W, quant_mode 0 or 2, expert_token_nums_type 1, combine
  in BF16 (comm_quant_mode 0);
- the fork is an earlier state of the operators than mc2's: its dispatch copies received rows
  one at a time and ends with UpdateTokenNumsOut, its combine sends one row per MTE3 barrier
  and waits for its tokens in order (``Mc2Tiling`` fields, whose defaults are mc2's);
- its own change: the combine's LocalWindowCopy loads all BS x K expert scales on every core
  with tokens (``whole_expert_scales``) where ExpertScaleCopy loads the core's span.

The tensors DeepEP returns carry its python API's names (packed_recv_x, packed_recv_x_scales,
packed_recv_count, the handle's src_info and layout_range, combined_x); `TensorSpec.gm` keeps
the operator's name the program reads them by. The conversions between the two namings are
the only glue: inputs, the chain and the reference are mc2's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from npusim.kernels.deepep import low_latency_a5 as a5
from npusim.kernels.deepep.common import DeepepMode, platform
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec
from npusim.kernels.mc2 import family as mc2
from npusim.kernels.mc2.family import FAMILY as MC2
from npusim.kernels.mc2.family import Combine, Dispatch
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.workload.shape import MoeShape

BS_UPPER_BOUND = 512  # moe_distribute_dispatch_v2_tiling.cpp (DeepEP's fork), x.size(0)
SRC_TILING = "moe_distribute_dispatch_v2_tiling.cpp"
# ops2 (the A2 build): moe_distribute_dispatch_v2_tiling.cc's A2 bounds, as (workload key,
# what, the shape's value, hi, the tiling's constant); the lower bounds are 1
A2_SRC_TILING = "ops2 moe_distribute_dispatch_v2_tiling.cc"
RANK_NUM_PER_NODE_A2 = 8  # one server: MoeDistributeDispatchA2GetIsSingle, else layered
A2_LL_LIMITS: tuple[tuple[str, str, Any, int, str], ...] = (
    ("workload.ep_world_size", "epWorldSize", lambda s: s.W, 256, "MAX_EP_WORLD_SIZE_A2"),
    ("workload.experts_per_rank", "moeExpertNum (ep_world_size * experts_per_rank)",
     lambda s: s.E, 512, "MAX_MOE_EXPERT_NUMS_A2"),
    ("workload.h", "H", lambda s: s.H, 7168, "MAX_HIDDEN_SIZE_A2"),
    ("workload.k", "K", lambda s: s.K, 16, "MAX_K_VALUE_A2"),
)

# DeepEP's python names -> the operator's (mc2's) names, per kernel
DISPATCH_NAMES = {"topk_idx": "expert_ids", "packed_recv_x": "expand_x",
                  "packed_recv_x_scales": "dynamic_scales",
                  "src_info": "assist_info_for_combine",
                  "packed_recv_count": "expert_token_nums", "layout_range": "ep_recv_count"}
COMBINE_NAMES = {"x": "expand_x", "topk_idx": "expert_ids", "topk_weights": "expert_scales",
                 "src_info": "assist_info_for_combine", "layout_range": "ep_recv_count",
                 "combined_x": "x"}
# what DeepEP passes and returns; the operators' other tensors (optional, zero rows with
# DeepEP's call) are declared as scratch
DISPATCH_API = ("x", *DISPATCH_NAMES)
COMBINE_API = tuple(COMBINE_NAMES)

# The operators' options DeepEP's host code fixes (deep_ep.cpp low_latency_dispatch /
# low_latency_combine, MOE_ENABLE_CCU and MOE_EXPERT_TOKEN_NUMS_TYPE unset). arch22: the A3
# fork's code path, which the A2's single-server kernels (ops2 moe_distribute_*_v2_single.h)
# share step for step (no elastic ranks, no timeout probe)
FIXED = {"arch": "arch22", "comm_alg": "fullmesh_v1", "combine_quant": "none",
         "expert_token_nums_type": 1, "x_active_mask": "none", "expand_scales": False,
         "shared_expert_x": False}
QUANT = {"bf16": "none", "int8": "int8", **a5.MC2_QUANT}
# the dispatch quants test_low_latency.py counts num_fp8_bytes for (mc2's names)
FP8_BYTES = ("int8", "pertoken_fp8", "mxfp4_e2m1")
# the deepep key a mc2 refusal is reported on
KEYS = {"workload.ccl_buffer_size": "workload.hccl_buffsize",
        "workload.dispatch_quant": "workload.quant",
        "workload.global_bs": "workload.num_max_dispatch_tokens_per_rank"}

# mc2's kernels and the run that holds both, by mc2's own declarations
MC2_DISPATCH, MC2_COMBINE = mc2.DISPATCH.name, mc2.COMBINE.name
MC2_BOTH = next(op for op, ks in MC2.runs.items() if ks == (MC2_DISPATCH, MC2_COMBINE))

RUNS = {"dispatch": ("low_latency_dispatch",),
        "dispatch_combine": ("low_latency_dispatch", "low_latency_combine"),
        "combine": ("low_latency_combine",)}


def _exposed(specs: Sequence[TensorSpec], names: Mapping[str, str]) -> tuple[TensorSpec, ...]:
    """mc2's specs under DeepEP's names (the program keeps reading the operator's)."""
    back = {v: k for k, v in names.items()}
    return tuple(replace(s, name=back[s.name], gm=s.name) if s.name in back else s
                 for s in specs)


def _split(specs: tuple[TensorSpec, ...], api: Sequence[str]
           ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(the tensors DeepEP's API has, the operators' others)."""
    return (tuple(s for s in specs if s.name in api),
            tuple(s for s in specs if s.name not in api))


def token_bytes(h: int, quant: str) -> int:
    """test_low_latency.py's bytes per selection: num_fp8_bytes H + H/128 * 4 + 16 when the
    dispatch is quantised with use_fp8 alone (INT8; on the 950 also mc2's pertoken_fp8
    and mxfp4_e2m1, the test's fp8_configs (True, False)), num_mxfp8_bytes H + H/32 + 16
    with use_ue8m0 (MXFP8), num_bf16_bytes 2H otherwise and for the combine."""
    if quant == "mxfp8":
        return h + h // 32 + 16
    return h + h // 128 * 4 + 16 if quant in FP8_BYTES else 2 * h


def bandwidth_fields(selections: Sequence[int], per_selection: int, ns: float
                     ) -> dict[str, Any]:
    """test_low_latency.py's figure: num_selections (topk_idx != -1, local included) x bytes
    per selection over the kernel's time, averaged over the ranks (calculate_avg_stats)."""
    nbytes = [n * per_selection for n in selections]
    mean = float(np.mean(nbytes)) if nbytes else 0.0
    return {"low_latency_bytes": int(round(mean)),
            "low_latency_gbps": round(mean / ns, 2) if ns else 0.0,
            "kernel_us": round(ns / 1000.0, 2)}


def _selections(t: Mc2Tiling) -> list[int]:
    return [t.bs(r) * t.K for r in range(t.W)]


# the phases whose cores work otherwise in the fork (the rest: mc2's words)
DISPATCH_PHASES = {
    "local_copy": "the cores with entries, one received row per copy",
    "token_nums": "every core SyncAlls (L > 1); the last core with entries re-reads "
                  "ep_recv_count (UpdateTokenNumsOut)",
}
COMBINE_PHASES = {
    "send": "every core: its share of ep_recv_count[-1] rows, one row, barrier and flag "
            "at a time",
    "receive": "every core: its share of the tokens, each waited for in order",
}


def _phases(phases: Sequence[Phase], words: Mapping[str, str]) -> tuple[Phase, ...]:
    return tuple(replace(p, cores=words.get(p.name, p.cores)) for p in phases)


_d_in, _d_absent = _split(_exposed(Dispatch.inputs, DISPATCH_NAMES), DISPATCH_API)
_d_absent = tuple(s for s in _d_absent if s.name != "expert_scales")  # not read: none passed
_d_out, _d_hidden = _split(_exposed(Dispatch.outputs, DISPATCH_NAMES), DISPATCH_API)
_c_in, _c_absent = _split(_exposed(Combine.inputs, COMBINE_NAMES), COMBINE_API)
_c_out, _c_hidden = _split(_exposed(Combine.outputs, COMBINE_NAMES), COMBINE_API)


class LowLatencyDispatch(Dispatch):
    """MoeLowLatencyDispatchV2: mc2's fullmesh_v1 dispatch without expert scales."""

    name = "low_latency_dispatch"
    variant = "quant"
    phases = _phases(Dispatch.phases, DISPATCH_PHASES)
    inputs = _d_in
    outputs = _d_out
    scratch = (*Dispatch.scratch, *_d_absent, *_d_hidden)

    def program(self, tiling: Mc2Tiling) -> Any:
        return super().program(replace(tiling, expert_scales=False))

    def fields(self, call: Call) -> dict[str, Any]:
        t, run = call.tiling, call.run
        return bandwidth_fields(_selections(t), token_bytes(t.H, t.dispatch_quant),
                                run.end_ns - run.start_ns)


class LowLatencyCombine(Combine):
    """MoeLowLatencyCombineV2: mc2's combine, all expert scales loaded per core."""

    name = "low_latency_combine"
    variant = None
    phases = _phases(Combine.phases, COMBINE_PHASES)
    inputs = _c_in
    outputs = _c_out
    scratch = (*Combine.scratch, *_c_absent, *_c_hidden)

    def fields(self, call: Call) -> dict[str, Any]:
        t, run = call.tiling, call.run
        return bandwidth_fields(_selections(t), token_bytes(t.H, "bf16"), run.end_ns - run.start_ns)


DISPATCH, COMBINE = LowLatencyDispatch(), LowLatencyCombine()
OPS = (DISPATCH, COMBINE)


def mc2_options(shape: MoeShape, options: Mapping[str, Any]) -> dict[str, Any]:
    """The operators' options as deep_ep.cpp sets them from DeepEP's."""
    top = options["num_max_dispatch_tokens_per_rank"] or shape.BS
    return {**FIXED, "dispatch_quant": QUANT[options["quant"]], **a5.fp8_format(options),
            "ccl_buffer_size": options["hccl_buffsize"], "global_bs": top * shape.W}


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> Mc2Tiling:
    t = MC2.tiling(shape, mc2_options(shape, options), hardware, timing_only)
    return replace(t, whole_expert_scales=True, local_copy_batches=False,
                   update_token_nums_out=True, combine_send_rows=1,
                   combine_tokens_in_order=True, fill_triple_waits_mte3=True)


def misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any, op: str,
           platform: str = "a3", v2: bool = True) -> Misfit | None:
    """deep_ep.cpp's asserts, the fork's BS bound, then mc2's checks on DeepEP's keys."""
    if v2 and op not in RUNS:
        return Misfit("workload.op", f"{op}: get_dispatch_layout belongs to the normal mode; "
                      f"allowed with mode low_latency: {', '.join(RUNS)}")
    if platform == "a2":
        bad = a2_misfit(shape)
        if bad is not None:
            return bad
    if shape.BS > BS_UPPER_BOUND:
        return Misfit("workload.bs", f"xDim0(BS) is invalid. Should be between [0, "
                      f"{BS_UPPER_BOUND}], but got xDim0={shape.BS} ({SRC_TILING})")
    top = options["num_max_dispatch_tokens_per_rank"]
    if top and top < shape.BS:
        return Misfit("workload.num_max_dispatch_tokens_per_rank", f"{top}: "
                      f"num_max_dispatch_tokens_per_rank >= x.size(0) fails (deep_ep.cpp "
                      f"EP_HOST_ASSERT); allowed: 0 (bs) or at least bs = {shape.BS}")
    if not v2:  # the layered kernel: its own window and checks
        return None
    m = MC2.misfit(shape, mc2_options(shape, options), hardware, MC2_BOTH)
    if m is None:
        return None
    return Misfit(KEYS.get(m.key, m.key), m.message)


def is_single_server(shape: MoeShape) -> bool:
    """MoeDistributeDispatchA2GetIsSingle: W <= 8 runs the single-server kernels (tiling
    keys 2000011000 / 5000), more ranks the layered ones (2100001000 / 3000)."""
    return shape.W <= RANK_NUM_PER_NODE_A2


def a2_misfit(shape: MoeShape) -> Misfit | None:
    """The A2 tiling's bounds (MAX_BATCH_SIZE_A2 is BS_UPPER_BOUND, checked after) and its
    whole servers: more than 8 ranks come in servers of 8 (epWorldSize % 8)."""
    for key, what, value, hi, name in A2_LL_LIMITS:
        v = value(shape)
        if v > hi:
            return Misfit(key, f"{v}: the A2 low-latency kernels take {what} up to {hi} "
                          f"({A2_SRC_TILING} {name}); allowed: 1..{hi}")
    if not is_single_server(shape) and shape.W % RANK_NUM_PER_NODE_A2:
        return Misfit("workload.ep_world_size", f"{shape.W}: epWorldSize is invalid (more "
                      f"than {RANK_NUM_PER_NODE_A2} ranks run the layered kernels on whole "
                      f"servers, epWorldSize % {RANK_NUM_PER_NODE_A2} == 0, {A2_SRC_TILING}); "
                      f"allowed: 1..{RANK_NUM_PER_NODE_A2} or a multiple of "
                      f"{RANK_NUM_PER_NODE_A2}")
    return None


# ---- the chain, in mc2's names inside
def _mc2_inputs(t: Mc2Tiling, inputs: list[Arrays]) -> list[Arrays]:
    """The run's DeepEP inputs as mc2's run inputs (ids as int32: topk_idx.int())."""
    empty = np.zeros((0, t.H), t.shape.np_dtype)
    out = []
    for a in inputs:
        out.append({"x": a["x"], "expert_ids": a["topk_idx"].astype(np.int32),
                    "expert_scales": a["topk_weights"],
                    "x_active_mask": np.zeros(0, np.uint8), "scales": np.zeros(0, np.float32),
                    "shared_expert_x": empty, "ori_x": empty, "const_expert_alpha_1": empty,
                    "const_expert_alpha_2": empty, "const_expert_v": empty})
    return out


def _to_mc2(specs: Sequence[TensorSpec], arrays: list[Arrays]) -> list[Arrays]:
    return [{s.gm_name: a[s.name] for s in specs if s.name in a} for a in arrays]


def _from_mc2(specs: Sequence[TensorSpec], arrays: list[Arrays]) -> list[Arrays]:
    return [{s.name: a[s.gm_name] for s in specs if s.gm_name in a} for a in arrays]


def _mc2_dispatch_out(t: Mc2Tiling, inputs: list[Arrays],
                      previous: list[Arrays] | None) -> list[Arrays]:
    if previous is not None:
        return _to_mc2(DISPATCH.outputs, previous)
    got = MC2.reference_outputs(MC2_DISPATCH, t, _mc2_inputs(t, inputs))
    assert got is not None
    return got


class LowLatency(DeepepMode):
    """``mode: low_latency`` on the A3, on one A2 server and on the 950 (the A5 kernels,
    low_latency_a5.py): mc2's V2 programs under DeepEP's call (the layered family extends
    it for 2+ A2 servers)."""

    help = ("DeepEP-Ascend's low-latency mode: MoeLowLatencyDispatchV2 / CombineV2, mc2's V2 "
            "programs on A3, on one A2 server and (DeepEP's A5 kernels) on the 950")
    ops = OPS
    runs = RUNS
    dispatch: Dispatch = DISPATCH
    combine: Combine = COMBINE

    def kernels_of(self, op: str, options: Mapping[str, Any] | None = None
                   ) -> tuple[Kernel, ...]:
        """None for the normal mode's own op (layout), which misfit then refuses naming
        the mode."""
        return super().kernels_of(op, options) if op in self.runs else ()

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Any:
        t = tiling(shape, options, hardware, timing_only)
        if platform(hardware) != "a5":
            return t
        mb = options["hccl_buffsize"] or a5.least_mb(t)
        return a5.tiling(tiling(shape, {**options, "hccl_buffsize": mb}, hardware, timing_only))

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        """Every mode's checks, the normal mode's keys left at their defaults, the A2
        bounds, then the V2 kernels' (on 2+ A2 servers only the layered kernels run)."""
        bad = self.low_latency_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        p = platform(hardware)
        if p == "a2" and not is_single_server(shape):
            return Misfit("workload.comm_alg", "fullmesh: over 2+ A2 servers the fullmesh "
                          "kernels (tiling keys 2000001000 / 2000) send through hccl "
                          "BatchWrite, whose AICPU side is not public, so they are not "
                          "modelled; allowed: hierarchy, the layered kernels across servers "
                          "(DeepEP with HCCL_INTRA_PCIE_ENABLE=1, HCCL_INTRA_ROCE_ENABLE=0, "
                          "which A2_DEEPEP.md requires on 2 nodes)")
        if p != "a5":
            return misfit(shape, options, hardware, op, p)
        # mc2's checks but its window's (DeepEP's A5 window: a5.window_misfit)
        rest = {**options, "quant": a5.host_check_quant(options["quant"]), "hccl_buffsize": 0}
        bad = a5.quant_misfit(options) or misfit(shape, rest, hardware, op, p)
        if bad is not None or not options["hccl_buffsize"]:
            return bad
        t = tiling(shape, {**options, "hccl_buffsize": 0}, hardware, True)
        return a5.window_misfit(t, options["hccl_buffsize"])

    def low_latency_misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any
                           ) -> Misfit | None:
        """What both low-latency kernels refuse first: every mode's checks, the normal
        mode's rounds set, the A2 low-latency bounds."""
        bad = self.shared_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        for key in ("long_seq_round", "per_round_tokens"):
            if options[key] != self.option_defaults()[key]:
                return Misfit(f"workload.{key}", f"{options[key]}: DEEPEP_NORMAL_LONG_SEQ_* "
                              "set the normal mode's rounds; allowed with mode "
                              "low_latency: the default")
        return a2_misfit(shape) if platform(hardware) == "a2" else None

    def op_inputs(self, kernel: str, tiling: Mc2Tiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        m_in = _mc2_inputs(tiling, inputs)
        if kernel == self.dispatch.name:
            return _from_mc2(self.dispatch.inputs, m_in)
        got = MC2.op_inputs(MC2_COMBINE, tiling, m_in,
                            _mc2_dispatch_out(tiling, inputs, previous))
        return _from_mc2(self.combine.inputs, got)

    def reference_outputs(self, kernel: str, tiling: Mc2Tiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        if kernel != self.dispatch.name:
            return None
        got = _from_mc2(self.dispatch.outputs, _mc2_dispatch_out(tiling, inputs, None))
        a5_int8 = tiling.int8_zero_guard and tiling.dispatch_quant == "int8"
        return a5.reference_scales(got) if a5_int8 else got

    def next_reads(self, kernel: str, tiling: Mc2Tiling, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        return MC2.next_reads(MC2_DISPATCH, tiling, _mc2_inputs(tiling, inputs),
                              _to_mc2(DISPATCH.outputs, outputs))


LOW_LATENCY = LowLatency()
