"""Family ``deepep``: DeepEP-Ascend (sgl-project/sgl-kernel-npu, python/deep_ep, kernels in
csrc/deepep/ops for the Atlas A3, csrc/deepep/ops2 for the Atlas A2). Normal mode:
Buffer.get_dispatch_layout -> dispatch -> combine as the four kernels it launches
(dispatch_layout, notify_dispatch, cam_moe_dispatch_normal, cam_moe_combine_normal); on an
A2 inside one server of 8 ranks (with more DeepEP switches to its internode kernels
notify_dispatch_a2, dispatch_normal_a2, moe_distribute_combine_a2, not modelled).
Low-latency mode (``workload.mode``): low_latency_dispatch / low_latency_combine, mc2's V2
programs (``low_latency.py``) on the A3 and on one A2 server (ops2's single-server kernels);
on 2+ A2 servers the layered kernels (``layered.py``, ``layered_combine.py``).

Tensor names are deep_ep.cpp's. Between notify_dispatch and the dispatch kernel DeepEP's host
reads max_bs and total_recv_token with `.item()` to size recv_x: a host sync that is not
device kernel time (bench_kineto measures kernels), so it is left out and npusim sizes recv_x
for the most rows a rank can receive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from npusim.kernels.common.limits import DEFAULT_LIMITS
from npusim.kernels.deepep import (
    layered,
    layered_combine,
    layered_layout,
    layered_misfit,
    layered_tiling,
)
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.combine import combine_program
from npusim.kernels.deepep.combine_rounds import combine_rounds_program
from npusim.kernels.deepep.dispatch import dispatch_program
from npusim.kernels.deepep.dispatch_layout import dispatch_layout_program
from npusim.kernels.deepep.notify import BUILD_CORES, notify_program
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.kernels.deepep.window import (
    DEFAULT_HCCL_BUFFSIZE_MB,
    SHMEM_DIE_STRIDE,
    SHMEM_SIGNAL_OFFSET,
    MiB,
    WindowTooSmall,
    check_buffsize,
    needed_buffsize,
)
from npusim.kernels.exchange import ExchangeFamily
from npusim.kernels.family import (
    Arrays,
    Call,
    Kernel,
    Misfit,
    Option,
    Phase,
    TensorSpec,
    Variant,
    const,
)
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.workload.inputs import uniform_tokens
from npusim.workload.routing import make_routing
from npusim.workload.shape import MoeShape

I32, I64, F32 = np.int32, np.int64, np.float32
MAX_TOTAL_TOKENS = 131072  # deep_ep.cpp
MAX_ROUNDS = 256
PER_ROUND_RANGE = (32, 8192)
A5_ONLY = ("mx_fp8_e4m3", "mx_fp8_e5m2", "mx_fp4_e2m1", "pertoken_fp8_e4m3")
# DeepEP's platform of a chip (the preset's chip.arch, a CANN SoC name)
PLATFORM_OF_CHIP = {"ascend910_93": "a3", "ascend910b": "a2", "ascend950": "a5"}
MODELLED = ("a3", "a2")
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


def _tok(t: DeepepTiling) -> np.dtype:
    return t.shape.np_dtype


def _rows(t: DeepepTiling, r: int) -> int:
    return t.rows_capacity


def _i32(name: str, shape: Any, help: str) -> TensorSpec:
    return TensorSpec(name, const(I32), shape, help)


TOPK_IDX = TensorSpec("topk_idx", const(I64), lambda t, r: (t.BS, t.K), "[BS, K] expert ids")
PER_EXPERT = _i32("num_tokens_per_expert", lambda t, r: (t.round, t.E),
                  "[round, E] tokens this rank sends each expert per round")
SEND_IDX = _i32("send_token_idx_small", lambda t, r: (t.BS, t.K),
                "[BS, K] each pair's place among its round's sends to its expert")
NOTIFY_OUT = {
    "send_data_offset": (lambda t, r: (t.round, t.E), "[round, E] prefix of the sends per expert"),
    "recv_count": (lambda t, r: (t.round, t.E), "[round, L*W] inclusive cumsum over le*W+src"),
    "recv_offset": (lambda t, r: (t.round, t.E), "[round, L*W] the sender's expert offset"),
    "expert_global_offset": (lambda t, r: (t.L,), "[L] first row of each local expert"),
    "srcrank_in_expert_offset": (lambda t, r: (t.E,), "[L*W] first row of each source in it"),
    "r_in_srcrank_offset": (lambda t, r: (t.E * t.round,), "[L*W*round] rows of earlier rounds"),
    "total_recv_token": (lambda t, r: (1,), "[1] rows this rank receives (host .item())"),
    "max_bs": (lambda t, r: (1,), "[1] the largest BS of the ranks (host .item())"),
    "recv_tokens_per_expert": (lambda t, r: (t.round * t.L,), "[round*L] rows per local expert"),
}


def _notify_spec(name: str) -> TensorSpec:
    shape, help = NOTIFY_OUT[name]
    return _i32(name, shape, help)


class DispatchLayout(Kernel):
    name = "dispatch_layout"
    phases = (Phase("count", "per round, min(tokens, C) cores: their tokens' ids scanned, "
                    "counts added atomically, SyncAll twice, the pairs numbered"),)
    inputs = (TOPK_IDX,)
    outputs = (_i32("num_tokens_per_rank", lambda t, r: (t.W,), "[W] tokens sent to each rank"),
               PER_EXPERT,
               _i32("is_token_in_rank", lambda t, r: (t.BS, t.W), "[BS, W] 0/1"),
               SEND_IDX)
    scratch = (_i32("notify_send_data", lambda t, r: (t.cores, t.E),
                    "[C, E] each core's expert-count prefix over the cores before it"),)

    def program(self, tiling: DeepepTiling) -> Any:
        return dispatch_layout_program(tiling)


class NotifyDispatch(Kernel):
    name = "notify_dispatch"
    phases = (Phase("assemble", "every core: its call counter; core 0: AssembleSendData"),
              Phase("exchange", "cores with ranks: slices into the own window, a flag to "
                    "each peer; wait for the peers' flags, pull this rank's slices"),
              Phase("build", "cores 0..7: one Build* scan each"))
    inputs = (PER_EXPERT,)
    outputs = tuple(_notify_spec(n) for n in NOTIFY_OUT)
    scratch = (_i32("send_data", lambda t, r: (t.W * t.notify_ints,), "[W, round, L, 3] sent"),
               _i32("recv_data", lambda t, r: (t.W * t.notify_ints,), "[W, round, L, 3] got"))

    def program(self, tiling: DeepepTiling) -> Any:
        return notify_program(tiling)


def _selected(run: Any, name: str) -> list[int]:
    """Per rank, how many transfers named `name` its cores made (rows moved)."""
    return [sum(s.count for core in rank for s in core if s.name == name)
            for rank in run.core_transfers]


def _bandwidth(t: DeepepTiling, run: Any, rows_name: str, ll_bytes: int) -> dict[str, Any]:
    """The test scripts' figures: test_intranode's recv_x.numel() * 2 bytes (BF16 even when
    quantised) over the time, printed by rank 0 (its "bottleneck bandwidth", the README's
    normal table); test_low_latency's num_selections x bytes per token, averaged over ranks
    (calculate_avg_stats). The time is this kernel's device time."""
    ns = run.end_ns - run.start_ns
    rows = _selected(run, rows_name)
    recv_bytes = [n * 2 * t.H for n in rows]
    return {"recv_x_rows": rows, "intranode_bytes": recv_bytes,
            "bottleneck_bandwidth_gbps": round(recv_bytes[0] / ns, 2) if ns else 0.0,
            "intranode_avg_gbps": round(float(np.mean(recv_bytes)) / ns, 2) if ns else 0.0,
            **ll.bandwidth_fields([t.BS * t.K] * t.W, ll_bytes, ns)}


def buffer_dispatch_fields(runs: Any) -> list[dict[str, Any]]:
    """test_intranode times `buffer.dispatch`, notify_dispatch included: where notify_dispatch
    ran just before the normal dispatch, the dispatch's bottleneck bandwidth is rank 0's
    bytes over both kernels' device time (the host's `.item()` between them is not
    modelled); `kernel_bandwidth_gbps` keeps the kernel's own."""
    out: list[dict[str, Any]] = [{} for _ in runs]
    for i in range(1, len(runs)):
        notify, run = runs[i - 1], runs[i]
        if (notify.op, run.op) != (NOTIFY.name, DISPATCH.name):
            continue
        ns = (notify.end_ns - notify.start_ns) + (run.end_ns - run.start_ns)
        recv = run.family_fields["intranode_bytes"]
        out[i] = {"kernel_bandwidth_gbps": run.family_fields["bottleneck_bandwidth_gbps"],
                  "buffer_dispatch_us": round(ns / 1000, 4),
                  "bottleneck_bandwidth_gbps": round(recv[0] / ns, 2) if ns else 0.0}
    return out


class CamMoeDispatchNormal(Kernel):
    name = "dispatch"
    bandwidth = "bottleneck_bandwidth_gbps"
    phases = (Phase("input_to_share", "every core: its pairs of the round into the own window"),
              Phase("set_status", "every core: a 32 B flag per expert of its share"),
              Phase("wait_status", "every core: its le*W+src entries"),
              Phase("share_to_output", "every core: pull its entries' records"),
              Phase("round_sync", "more than one round: core 0's round flags"))
    variant = "quant"
    inputs = (TensorSpec("x", _tok, lambda t, r: (t.BS, t.H), "[BS, H] tokens"),
              _i32("expert_ids", lambda t, r: (t.BS, t.K), "[BS, K] topk_idx as int32"),
              _notify_spec("send_data_offset"), SEND_IDX, _notify_spec("recv_offset"),
              _notify_spec("recv_count"), _notify_spec("expert_global_offset"),
              _notify_spec("srcrank_in_expert_offset"), _notify_spec("r_in_srcrank_offset"))
    outputs = (TensorSpec("recv_x", lambda t: t.out_dtype, lambda t, r: (_rows(t, r), t.H),
                          "[rows, H] received rows by (local expert, source, token)"),
               TensorSpec("dynamic_scales", const(F32), lambda t, r: (_rows(t, r),),
                          "[rows] int8 scales"),
               _i32("expand_idx", lambda t, r: (3 * _rows(t, r),),
                    "[rows*3] (source rank, token, k): the handle's recv_src_idx"))

    def program(self, tiling: DeepepTiling) -> Any:
        return dispatch_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        t = call.tiling
        return _bandwidth(t, call.run, "recv_x", ll.token_bytes(t.H, t.quant))


class CamMoeCombineNormal(Kernel):
    name = "combine"
    bandwidth = "bottleneck_bandwidth_gbps"
    phases = (Phase("copy_to_share", "every core: its received rows to their sources' windows "
                    "and a flag each"),
              Phase("read_from_remote", "every core: its tokens' K flags, weighted sum"),
              Phase("round_sync", "multi-round kernel, more than one round: core 0's round "
                    "flags"))
    inputs = (TensorSpec("x", _tok, lambda t, r: (_rows(t, r), t.H), "[rows, H] expert outputs"),
              _i32("expand_idx", lambda t, r: (3 * _rows(t, r),), "the handle's recv_src_idx"),
              _i32("ep_recv_count", lambda t, r: (t.E,), "the handle's send_head"),
              _i32("topk_idx", lambda t, r: (t.BS, t.K), "[BS, K] as int32"),
              TensorSpec("topk_weights", const(F32), lambda t, r: (t.BS, t.K), "[BS, K]"))
    outputs = (TensorSpec("combined_x", _tok, lambda t, r: (t.BS, t.H), "[BS, H]"),)

    def program(self, tiling: DeepepTiling) -> Any:
        """The kernel the host tiling's key selects (13000 / 13001 on the A3)."""
        if tiling.combine_multi_round:
            return combine_rounds_program(tiling)
        return combine_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return _bandwidth(call.tiling, call.run, "load_row", 2 * call.tiling.H)


LAYOUT, NOTIFY, DISPATCH, COMBINE = (DispatchLayout(), NotifyDispatch(), CamMoeDispatchNormal(),
                                     CamMoeCombineNormal())


def platform(hardware: Any) -> str | None:
    """DeepEP's platform of the preset's chip (a user's copy under any name included)."""
    return PLATFORM_OF_CHIP.get(hardware.chip.arch)


def buffsize_mb(shape: MoeShape, options: Mapping[str, Any], platform: str = "a3") -> int:
    """hccl_buffsize, or 0: the smallest DeepEP's check accepts."""
    if options["hccl_buffsize"]:
        return options["hccl_buffsize"]
    per_round = options["per_round_tokens"]
    need = needed_buffsize(min(shape.BS, per_round), shape.H, shape.K,
                           options["long_seq_round"], platform)
    return max(DEFAULT_HCCL_BUFFSIZE_MB, need // MiB + 1)


class DeepEP(ExchangeFamily):
    name = "deepep"
    help = ("DeepEP-Ascend (sgl-kernel-npu csrc/deepep/ops on A3, ops2 on one A2 server): "
            "normal mode (dispatch_layout, notify_dispatch, cam_moe_dispatch_normal, "
            "cam_moe_combine_normal) or low latency (MoeLowLatencyDispatchV2 / CombineV2: "
            "mc2's V2 programs on A3 and on one A2 server, the layered kernels on 2+ A2 "
            "servers)")
    ops = (LAYOUT, NOTIFY, DISPATCH, COMBINE, *ll.OPS, layered.DISPATCH,
           layered_combine.COMBINE)
    references = True  # reference_outputs
    chains = True  # next_reads
    runs = {"layout": ("dispatch_layout",),
            "dispatch": ("dispatch_layout", "notify_dispatch", "dispatch"),
            "dispatch_combine": ("dispatch_layout", "notify_dispatch", "dispatch", "combine"),
            "combine": ("combine",)}
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
    options = (
        Option("mode", "choice", "normal", "DeepEP's mode: normal (prefill: the four kernels) "
               "or low_latency (decode: low_latency_dispatch, low_latency_combine)",
               choices=("normal", "low_latency")),
        Option("quant", "choice", "bf16", "dispatch's quant_mode: bf16, int8 (per-token dynamic); "
               "the A5-only modes are refused on A2 and A3 as DeepEP refuses them",
               choices=("bf16", "int8", *A5_ONLY)),
        Option("context", "choice", "hccl", "where the windows live: hccl (windowsIn + "
               "windowsExp; on the A2 the status in windowsIn's last 8 MiB) or shmem (A3: "
               "one aclshmem allocation per die, status right after the data at +1022 MiB)",
               choices=("hccl", "shmem")),
        Option("hccl_buffsize", "int", 0, "HCCL_BUFFSIZE in MB (totalWinSize); 0: the "
               "smallest DeepEP's check accepts (at least its default 200)", lo=0, hi=65536),
        Option("long_seq_round", "int", 1, "DEEPEP_NORMAL_LONG_SEQ_ROUND", lo=1, hi=MAX_ROUNDS),
        Option("per_round_tokens", "int", 8192, "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS",
               lo=PER_ROUND_RANGE[0], hi=PER_ROUND_RANGE[1]),
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

    def runs_of(self, options: Mapping[str, Any] | None = None
                ) -> Mapping[str, tuple[str, ...]]:
        if options is not None and options.get("mode") == "low_latency":
            return layered_layout.RUNS if options.get("comm_alg") == "hierarchy" else ll.RUNS
        return self.runs

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> DeepepTiling | Mc2Tiling:
        if options["mode"] == "low_latency":
            if options["comm_alg"] == "hierarchy":
                return layered_tiling.tiling(shape, options, hardware, timing_only)
            return ll.tiling(shape, options, hardware, timing_only)
        p = platform(hardware) or "a3"
        return DeepepTiling(shape, options["quant"], options["long_seq_round"],
                            options["per_round_tokens"], hardware.chip.aiv_cores,
                            options["context"], buffsize_mb(shape, options, p), timing_only, p)

    def window(self, tiling: DeepepTiling) -> Any:
        return tiling.window

    def run_fields(self, tiling: Any, runs: Any) -> list[dict[str, Any]]:
        return buffer_dispatch_fields(runs)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        p = platform(hardware)
        if options["context"] == "shmem" and p != "a3":
            return Misfit("workload.context", f"shmem: preset {hardware.name!r} has no SHMEM "
                          "DeepEP kernels (the shmem_ver kernels are csrc/deepep/ops, built for "
                          "A3); allowed: hccl")
        if p not in MODELLED:
            return Misfit("hardware", f"{hardware.name}: the deepep family models the A3 "
                          "kernels (csrc/deepep/ops) and the A2's (ops2) inside one server; "
                          "the A5 variants are not modelled yet; allowed: atlas_a3, atlas_a2")
        if p == "a2" and options["mode"] == "normal":
            bad = self._a2_misfit(shape)
            if bad is not None:
                return bad
        if options["quant"] in A5_ONLY:
            return Misfit("workload.quant", f"{options['quant']} is not supported on this "
                          "device, please use int8 or bf16 instead (deep_ep.cpp, A2 and A3 "
                          "builds); allowed: bf16, int8")
        if shape.S:
            return Misfit("workload.shared_experts", f"{shape.S}: shared-expert ranks are not "
                          "modelled in the deepep family; allowed: 0")
        if shape.dtype != "bfloat16":
            return Misfit("workload.dtype", f"{shape.dtype}: DeepEP's dispatch takes bf16 "
                          "tokens; allowed: bfloat16")
        if options["mode"] == "low_latency":
            for key in ("long_seq_round", "per_round_tokens"):
                if options[key] != self.option_defaults()[key]:
                    return Misfit(f"workload.{key}", f"{options[key]}: DEEPEP_NORMAL_LONG_SEQ_* "
                                  "set the normal mode's rounds; allowed with mode "
                                  "low_latency: the default")
            return self._low_latency_misfit(shape, options, hardware, op, p)
        if options["comm_alg"] != "fullmesh":
            return Misfit("workload.comm_alg", f"{options['comm_alg']}: picks the A2's "
                          "low-latency kernels; allowed with mode normal: fullmesh")
        top = options["num_max_dispatch_tokens_per_rank"]
        if top:
            return Misfit("workload.num_max_dispatch_tokens_per_rank", f"{top}: an argument of "
                          "the low-latency calls; allowed with mode normal: 0")
        rounds, per_round = options["long_seq_round"], options["per_round_tokens"]
        if rounds * per_round > MAX_TOTAL_TOKENS:
            return Misfit("workload.long_seq_round", f"DEEPEP_NORMAL_LONG_SEQ_ROUND ({rounds}) * "
                          f"DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS ({per_round}) must not "
                          f"exceed MAX_TOTAL_TOKENS ({MAX_TOTAL_TOKENS})")
        if shape.BS > rounds * per_round:
            return Misfit("workload.bs", f"num_tokens ({shape.BS}) must not exceed the "
                          f"configured capacity ({rounds * per_round}), calculated as round "
                          f"({rounds}) * per_round_tokens ({per_round})")
        mb = buffsize_mb(shape, options, p)
        try:
            check_buffsize(min(shape.BS, per_round), shape.H, shape.K, rounds, mb, p)
        except WindowTooSmall as exc:
            return Misfit("workload.hccl_buffsize", str(exc))
        return None

    def tiling_misfit(self, tiling: DeepepTiling | Mc2Tiling | layered_tiling.LayeredTiling,
                      shape: MoeShape, options: Mapping[str, Any], hardware: Any, op: str
                      ) -> Misfit | None:
        if options["mode"] == "low_latency":
            if options["comm_alg"] == "hierarchy":
                return layered_misfit.tiling_misfit(tiling, shape, options, hardware, op)
            return None  # the V2 kernels: mc2's checks, in misfit
        t = tiling
        p = platform(hardware)
        if NOTIFY.name in self.runs[op] and t.cores < len(BUILD_CORES):
            return Misfit("hardware.chip.aiv_cores", f"{t.cores}: notify_dispatch builds its "
                          f"{len(BUILD_CORES)} outputs ({', '.join(BUILD_CORES)}) each on its "
                          f"own fixed core 0..{len(BUILD_CORES) - 1} (notify_dispatch.h); "
                          f"allowed: at least {len(BUILD_CORES)}")
        mb = buffsize_mb(shape, options, p)
        if t.context == "shmem":
            if mb * MiB > SHMEM_SIGNAL_OFFSET:
                return Misfit("workload.hccl_buffsize", f"{mb} MB: with context shmem the data "
                              f"and the status (at +{SHMEM_SIGNAL_OFFSET // MiB} MiB) share one "
                              f"aclshmem allocation per die, which would exceed the "
                              f"{SHMEM_DIE_STRIDE // MiB} MiB stride between dies; allowed: at "
                              f"most {SHMEM_SIGNAL_OFFSET // MiB}")
        if t.window.end > hardware.window.bytes:
            status = ("with its status inside" if p == "a2" else "plus the 1 MiB status window")
            return Misfit("hardware.window.bytes", f"{hardware.window.bytes} B: HCCL_BUFFSIZE "
                          f"{mb} MB {status} needs {t.window.end} B; "
                          f"allowed: at least {t.window.end}")
        return None

    @staticmethod
    def _low_latency_misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
                            op: str, p: str) -> Misfit | None:
        """The V2 kernels' checks; on an A2 past one server, the layered kernel's
        (MoeDistributeDispatchA2GetIsSingle, then CheckCommAlg)."""
        if p == "a2":
            bad = ll.a2_misfit(shape)
            if bad is not None:
                return bad
        layered_alg = options["comm_alg"] == "hierarchy"
        internode = p == "a2" and not ll.is_single_server(shape)
        if layered_alg and not internode:
            return Misfit("workload.comm_alg", "hierarchy: the layered kernels run on an A2 "
                          f"with more than {ll.RANK_NUM_PER_NODE_A2} ranks (one server or the "
                          "A3: the V2 kernels); allowed here: fullmesh")
        if internode and not layered_alg:
            return Misfit("workload.comm_alg", "fullmesh: over 2+ A2 servers the fullmesh "
                          "kernels (tiling keys 2000001000 / 2000) send through hccl "
                          "BatchWrite, whose AICPU side is not public, so they are not "
                          "modelled; allowed: hierarchy, the layered kernels across servers "
                          "(DeepEP with HCCL_INTRA_PCIE_ENABLE=1, HCCL_INTRA_ROCE_ENABLE=0, "
                          "which A2_DEEPEP.md requires on 2 nodes)")
        bad = ll.misfit(shape, options, hardware, op, p, v2=not layered_alg)
        if bad is not None or not layered_alg:
            return bad
        return layered_misfit.misfit(shape, options, hardware, op)

    @staticmethod
    def _a2_misfit(shape: MoeShape) -> Misfit | None:
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
        for key, what, value, lo, hi, name in A2_LIMITS:
            v = value(shape)
            if not lo <= v <= hi:
                return Misfit(key, f"{v}: the A2 normal kernels take {what} in [{lo}, {hi}] "
                              f"(ops2 {name}); allowed: {lo}..{hi}")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Mapping[str, Any], payload: bool) -> list[Arrays]:
        seeds = np.random.SeedSequence(routing.get("seed", 0)).spawn(3)
        rx, rr, rw = (np.random.default_rng(c) for c in seeds)
        ids = routing.get("expert_ids")
        if ids is None:
            extra = {"sigma": routing["sigma"]} if "sigma" in routing else {}
            ids = make_routing(routing.get("routing", "balanced"), shape.W, shape.BS, shape.K,
                               shape.E, rng=rr, zipf_s=routing.get("zipf_s", 1.2), **extra)
        dt = shape.np_dtype
        out = []
        for r in range(shape.W):
            x = (uniform_tokens(rx, (shape.BS, shape.H), dt) if payload
                 else np.zeros((shape.BS, shape.H), dt))
            out.append({"x": x, "topk_idx": np.asarray(ids[r], I64),
                        "topk_weights": rw.uniform(0, 1, (shape.BS, shape.K)).astype(F32)})
        return out

    def pair_bytes(self, tiling: DeepepTiling, op: str, timing_only: bool, workers: int) -> int:
        """Dispatch: the record's window slot and its recv_x row with scale and triple;
        combine: its window slot and, functional, its input row. Dispatch's machine is freed
        before combine's (a second worker runs notify_dispatch, which holds no rows). Low
        latency: not estimated (as mc2)."""
        if isinstance(tiling, Mc2Tiling | layered_tiling.LayeredTiling):
            return 0
        t, kernels = tiling, self.runs[op]
        kept = t.H * t.out_dtype.itemsize + 4 + 12
        dispatch = t.window.disp + kept if DISPATCH.name in kernels else 0
        combine = 0
        if COMBINE.name in kernels:
            combine = t.window.combine_row + (0 if timing_only else 2 * t.H)
        if not dispatch or not combine:
            return dispatch + combine
        return max(dispatch, kept + combine)

    # ---- the chain: every kernel's inputs from the run's inputs and earlier outputs
    def __init__(self) -> None:
        self._chain: dict[int, dict[str, list[Arrays]]] = {}

    def _sizes(self, t: DeepepTiling) -> ref.Sizes:
        return ref.Sizes(t.W, t.E, t.K, t.round, t.per_round_tokens)

    def _layout(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        got = self._chain.get(id(inputs), {}).get("dispatch_layout")
        return got if got is not None else [ref.layout(a["topk_idx"], self._sizes(t))
                                            for a in inputs]

    def _notify(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        got = self._chain.get(id(inputs), {}).get("notify_dispatch")
        if got is not None:
            return got
        lay = self._layout(t, inputs)
        return ref.notify([a["num_tokens_per_expert"] for a in lay], [t.BS] * t.W,
                          self._sizes(t))

    def op_inputs(self, kernel: str, tiling: DeepepTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        if isinstance(tiling, layered_tiling.LayeredTiling):
            return layered.op_inputs(kernel, tiling, inputs, previous)
        if isinstance(tiling, Mc2Tiling):
            return ll.op_inputs(kernel, tiling, inputs, previous)
        t = tiling
        chain = self._chain.setdefault(id(inputs), {})
        before = self.runs["dispatch_combine"]
        if previous is not None and kernel in before[1:]:
            chain[before[before.index(kernel) - 1]] = previous
        if kernel == LAYOUT.name:
            self._chain = {id(inputs): chain}  # one run at a time
            return [{"topk_idx": a["topk_idx"]} for a in inputs]
        lay = self._layout(t, inputs)
        if kernel == NOTIFY.name:
            return [{"num_tokens_per_expert": o["num_tokens_per_expert"]} for o in lay]
        note = self._notify(t, inputs)
        if kernel == DISPATCH.name:
            return [{"x": a["x"], "expert_ids": a["topk_idx"].astype(I32),
                     "send_token_idx_small": lo["send_token_idx_small"], **n}
                    for a, lo, n in zip(inputs, lay, note, strict=True)]
        if t.timing_only:  # the simulated records carry no triple (dispatch.fill_triple)
            triples = self._expand_idx(t, inputs)
            disp = previous if previous is not None else [
                {"recv_x": np.zeros((t.rows_capacity, t.H), t.out_dtype)} for _ in inputs]
        else:
            disp = previous if previous is not None else self._reference_dispatch(t, inputs)
            triples = [d["expand_idx"] for d in disp]
        res = []
        for a, n, d, idx in zip(inputs, note, disp, triples, strict=True):
            rows = d["recv_x"]
            if t.quant == "int8":  # per_token_cast_back: fp32(q) * scale, to bf16
                full = np.zeros((t.rows_capacity, t.H), t.shape.np_dtype)
                m = int(n["total_recv_token"][0])
                if not t.timing_only:
                    full[:m] = (rows[:m].astype(F32) * d["dynamic_scales"][:m, None]).astype(
                        t.shape.np_dtype)
                rows = full
            res.append({"x": rows, "expand_idx": idx,
                        "ep_recv_count": n["recv_count"].sum(axis=0).astype(I32),
                        "topk_idx": a["topk_idx"].astype(I32), "topk_weights": a["topk_weights"]})
        return res

    def _reference_dispatch(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        got = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs],
                           self._sizes(t), t.quant)
        cap = t.rows_capacity
        return [{"recv_x": _padded(o["recv_x"], cap),
                 "dynamic_scales": _padded(o["dynamic_scales"], cap),
                 "expand_idx": _padded(o["expand_idx"], 3 * cap)} for o in got]

    def _expand_idx(self, t: DeepepTiling, inputs: list[Arrays]) -> list[np.ndarray]:
        """Every rank's expand_idx from the routing alone: what a timing-only combine reads."""
        got = ref.source_triples([a["topk_idx"] for a in inputs], self._sizes(t))
        return [_padded(tr.reshape(-1), 3 * t.rows_capacity) for tr in got]

    def reference_outputs(self, kernel: str, tiling: DeepepTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        if isinstance(tiling, layered_tiling.LayeredTiling):
            return (layered.reference_dispatch(tiling, inputs)
                    if kernel == layered.DISPATCH.name else None)
        if isinstance(tiling, Mc2Tiling):
            return ll.reference_outputs(kernel, tiling, inputs)
        if kernel != LAYOUT.name:
            return None
        return [ref.layout(a["topk_idx"], self._sizes(tiling)) for a in inputs]

    def next_reads(self, kernel: str, tiling: DeepepTiling, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        if isinstance(tiling, layered_tiling.LayeredTiling):
            return layered.next_reads(tiling, outputs)
        if isinstance(tiling, Mc2Tiling):
            return ll.next_reads(kernel, tiling, inputs, outputs)
        h = hashlib.sha256()
        for o in outputs:
            for name in ("num_tokens_per_expert", "send_token_idx_small"):
                h.update(np.ascontiguousarray(o[name], I32).tobytes())
        return h.digest()


def _padded(a: np.ndarray, rows: int) -> np.ndarray:
    """`a` in the first rows of a zero tensor of `rows` rows (a GM output's capacity)."""
    out = np.zeros((rows, *a.shape[1:]), a.dtype)
    out[:a.shape[0]] = a
    return out


FAMILY = DeepEP()
