"""DeepEP-Ascend's normal mode (``mode: normal``): Buffer.get_dispatch_layout -> dispatch ->
combine as the four kernels it launches (dispatch_layout, notify_dispatch,
cam_moe_dispatch_normal, cam_moe_combine_normal; csrc/deepep/ops on the A3 and, built for the
Ascend 950, its *_a5 variants; the ops2 build on an A2 inside one server of 8 ranks: with
more DeepEP switches to its internode kernels notify_dispatch_a2, dispatch_normal_a2,
moe_distribute_combine_a2, not modelled).

Between notify_dispatch and the dispatch kernel DeepEP's host reads max_bs and
total_recv_token with `.item()` to size recv_x: a host sync that is not device kernel time
(bench_kineto measures kernels), so it is left out and npusim sizes recv_x for the most rows a
rank can receive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npusim.hw.memory import RowTable
from npusim.kernels.common.chain import digest_rows
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep import reference_a5 as ref_a5
from npusim.kernels.deepep.combine import combine_program
from npusim.kernels.deepep.combine_rounds import combine_rounds_program
from npusim.kernels.deepep.common import (
    MAX_TOTAL_TOKENS,
    DeepepMode,
    buffsize_mb,
    platform,
)
from npusim.kernels.deepep.dispatch import dispatch_program
from npusim.kernels.deepep.dispatch_layout import dispatch_layout_program
from npusim.kernels.deepep.misfit_a5 import a5_window_misfit
from npusim.kernels.deepep.notify import BUILD_CORES, notify_program
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.kernels.deepep.window import WindowTooSmall, check_buffsize
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.workload.shape import MoeShape

I32, I64, F32 = np.int32, np.int64, np.float32


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


def buffer_dispatch_fields(runs: Any, pair: tuple[str, str] = ("notify_dispatch", "dispatch")
                           ) -> list[dict[str, Any]]:
    """test_intranode times `buffer.dispatch`, notify_dispatch included: where the notify
    kernel of `pair` ran just before its dispatch, the dispatch's bottleneck bandwidth is
    rank 0's bytes over both kernels' device time (the host's `.item()` between them is not
    modelled); `kernel_bandwidth_gbps` keeps the kernel's own."""
    out: list[dict[str, Any]] = [{} for _ in runs]
    for i in range(1, len(runs)):
        notify, run = runs[i - 1], runs[i]
        if (notify.op, run.op) != pair:
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
    outputs = (TensorSpec("recv_x", lambda t: t.out_dtype,
                          lambda t, r: (_rows(t, r), t.recv_cols),
                          "[rows, H] received rows by (local expert, source, token); MXFP4: "
                          "[rows, H / 2] code pairs"),
               TensorSpec("dynamic_scales", lambda t: t.scale_dtype,
                          lambda t, r: (_rows(t, r) * t.scales_per_row,),
                          "[rows] fp32 per-token scales; MX: [rows * H / 32] E8M0"),
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


def normal_runs(ops: tuple[Kernel, ...]) -> dict[str, tuple[str, ...]]:
    """A normal mode's ops from its kernels (dispatch_layout, notify, dispatch, combine)."""
    names = tuple(k.name for k in ops)
    return {"layout": names[:1], "dispatch": names[:3], "dispatch_combine": names,
            "combine": names[3:]}


class Normal(DeepepMode):
    help = ("DeepEP-Ascend's normal mode (csrc/deepep/ops on A3 and the Ascend 950, ops2 on "
            "one A2 server): "
            "dispatch_layout, notify_dispatch, cam_moe_dispatch_normal, "
            "cam_moe_combine_normal")
    ops = (LAYOUT, NOTIFY, DISPATCH, COMBINE)
    runs = normal_runs(ops)

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> DeepepTiling:
        p = platform(hardware) or "a3"
        return DeepepTiling(shape, options["quant"], options["long_seq_round"],
                            options["per_round_tokens"], hardware.chip.aiv_cores,
                            options["context"], buffsize_mb(shape, options, p), timing_only, p,
                            options["combine_enable_long_seq"])

    def run_fields(self, tiling: Any, runs: Any) -> list[dict[str, Any]]:
        return buffer_dispatch_fields(runs)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        """Every mode's checks, then the normal calls' and DeepEP's HCCL_BUFFSIZE check."""
        bad = self.normal_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        rounds, per_round = options["long_seq_round"], options["per_round_tokens"]
        if rounds * per_round > MAX_TOTAL_TOKENS:
            return Misfit("workload.long_seq_round", f"DEEPEP_NORMAL_LONG_SEQ_ROUND ({rounds}) * "
                          f"DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS ({per_round}) must not "
                          f"exceed MAX_TOTAL_TOKENS ({MAX_TOTAL_TOKENS})")
        if shape.BS > rounds * per_round:
            return Misfit("workload.bs", f"num_tokens ({shape.BS}) must not exceed the "
                          f"configured capacity ({rounds * per_round}), calculated as round "
                          f"({rounds}) * per_round_tokens ({per_round})")
        p = platform(hardware)
        mb = buffsize_mb(shape, options, p)
        try:
            check_buffsize(min(shape.BS, per_round), shape.H, shape.K, rounds, mb, p)
        except WindowTooSmall as exc:
            return Misfit("workload.hccl_buffsize", str(exc))
        return None

    def normal_misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any
                      ) -> Misfit | None:
        """Every mode's checks, then the options only the low-latency calls take."""
        bad = self.shared_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        if options["comm_alg"] != "fullmesh":
            return Misfit("workload.comm_alg", f"{options['comm_alg']}: picks the A2's "
                          "low-latency kernels; allowed with mode normal: fullmesh")
        top = options["num_max_dispatch_tokens_per_rank"]
        if top:
            return Misfit("workload.num_max_dispatch_tokens_per_rank", f"{top}: an argument of "
                          "the low-latency calls; allowed with mode normal: 0")
        return None

    def tiling_misfit(self, tiling: DeepepTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        p = platform(hardware)
        if NOTIFY.name in self.runs[op] and t.cores < len(BUILD_CORES):
            return Misfit("hardware.chip.aiv_cores", f"{t.cores}: notify_dispatch builds its "
                          f"{len(BUILD_CORES)} outputs ({', '.join(BUILD_CORES)}) each on its "
                          f"own fixed core 0..{len(BUILD_CORES) - 1} (notify_dispatch.h); "
                          f"allowed: at least {len(BUILD_CORES)}")
        mb = buffsize_mb(shape, options, p)
        if p == "a5":
            bad = a5_window_misfit(t, mb)
            if bad is not None:
                return bad
        if t.window.end > hardware.window.bytes:
            status = {"a2": "with its status inside", "a5": "with its 4 MiB state zone inside"
                      }.get(p, "plus the 1 MiB status window")
            return Misfit("hardware.window.bytes", f"{hardware.window.bytes} B: HCCL_BUFFSIZE "
                          f"{mb} MB {status} needs {t.window.end} B; "
                          f"allowed: at least {t.window.end}")
        return None

    def pair_bytes(self, tiling: DeepepTiling, op: str, timing_only: bool, workers: int) -> int:
        """Dispatch: the record's window slot and its recv_x row with scale and triple;
        combine: its window slot and, functional, its input row. With one worker dispatch's
        machine is freed before combine's; with two the forked combine runs beside the
        dispatch on the reference dispatch's rows (`ahead`), so both at once."""
        t, kernels = tiling, self.runs[op]
        kept = t.payload_bytes + t.scale_bytes + 12
        dispatch = t.window.disp + kept if DISPATCH.name in kernels else 0
        combine = 0
        if COMBINE.name in kernels:
            combine = t.window.combine_row + (0 if timing_only else 2 * t.H)
        if not dispatch or not combine:
            return dispatch + combine
        if workers >= 2:
            return dispatch + kept + combine
        return max(dispatch, kept + combine)

    # ---- the chain: every kernel's inputs from the run's inputs and earlier outputs
    def __init__(self) -> None:
        self._run: tuple[list[Arrays] | None, dict[str, list[Arrays]]] = (None, {})

    def _kept(self, inputs: list[Arrays]) -> dict[str, list[Arrays]]:
        """The outputs kept of the run whose inputs these are: the very list, held (an id
        alone could be a freed run's); one run at a time."""
        run, chain = self._run
        if run is not inputs:
            chain = {}
            self._run = (inputs, chain)
        return chain

    def _sizes(self, t: DeepepTiling) -> ref.Sizes:
        return ref.Sizes(t.W, t.E, t.K, t.round, t.per_round_tokens)

    def _layout(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        got = self._kept(inputs).get("dispatch_layout")
        return got if got is not None else [ref.layout(a["topk_idx"], self._sizes(t))
                                            for a in inputs]

    def _notify(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        got = self._kept(inputs).get("notify_dispatch")
        if got is not None:
            return got
        lay = self._layout(t, inputs)
        return ref.notify([a["num_tokens_per_expert"] for a in lay], [t.BS] * t.W,
                          self._sizes(t))

    def _record(self, kernel: str, inputs: list[Arrays], previous: list[Arrays] | None
                ) -> None:
        """Keep the previous kernel's outputs in the run's chain; the layout starts a run."""
        chain = self._kept(inputs)
        before = self.runs["dispatch_combine"]
        if previous is not None and kernel in before[1:]:
            chain[before[before.index(kernel) - 1]] = previous

    def _first_inputs(self, kernel: str, t: DeepepTiling, inputs: list[Arrays],
                      previous: list[Arrays] | None) -> list[Arrays] | None:
        """The chain kept; the inputs of dispatch_layout (topk_idx) and of the notify kernel
        after it (the layout's counts); None for a later kernel."""
        self._record(kernel, inputs, previous)
        if kernel == LAYOUT.name:
            return [{"topk_idx": a["topk_idx"]} for a in inputs]
        if kernel == self.runs["dispatch"][1]:
            return [{"num_tokens_per_expert": o["num_tokens_per_expert"]}
                    for o in self._layout(t, inputs)]
        return None

    def op_inputs(self, kernel: str, tiling: DeepepTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        t = tiling
        first = self._first_inputs(kernel, t, inputs, previous)
        if first is not None:
            return first
        lay = self._layout(t, inputs)
        note = self._notify(t, inputs)
        if kernel == self.runs["dispatch"][2]:
            return [{"x": a["x"], "expert_ids": a["topk_idx"].astype(I32),
                     "send_token_idx_small": lo["send_token_idx_small"],
                     **self._dispatch_counts(n)}
                    for a, lo, n in zip(inputs, lay, note, strict=True)]
        return self._combine_inputs(t, inputs, lay, note, previous)

    def _dispatch_counts(self, note: Arrays) -> Arrays:
        """What the dispatch reads of the notify kernel's outputs: all of them."""
        return note

    def _combine_inputs(self, t: DeepepTiling, inputs: list[Arrays], lay: list[Arrays],
                        note: list[Arrays], previous: list[Arrays] | None) -> list[Arrays]:
        disp = previous if previous is not None else self._assumed_dispatch(t, inputs)
        if t.timing_only:  # the simulated records carry no triple (dispatch.fill_triple)
            triples = self._expand_idx(t, inputs)
        else:
            triples = [d["expand_idx"] for d in disp]
        res = []
        for a, n, d, idx in zip(inputs, note, disp, triples, strict=True):
            rows = d["recv_x"]
            if t.quant != "bf16" and t.timing_only:  # zeros whatever the records held
                rows = RowTable.zeros(t.rows_capacity, t.H * t.shape.np_dtype.itemsize)
            elif t.quant != "bf16":  # per_token_cast_back: fp32(q) * scale, to bf16
                full = np.zeros((t.rows_capacity, t.H), t.shape.np_dtype)
                m = int(n["total_recv_token"][0])
                full[:m] = ref_a5.cast_back(t.quant, rows[:m],
                                            d["dynamic_scales"][:m * t.scales_per_row])
                rows = full
            res.append({"x": rows, "expand_idx": idx,
                        "ep_recv_count": n["recv_count"].sum(axis=0).astype(I32),
                        "topk_idx": a["topk_idx"].astype(I32), "topk_weights": a["topk_weights"]})
        return res

    def _x_rows_read(self, arrays: Arrays) -> int | None:
        """The rows of x the combine reads: selfSendCnt = ep_recv_count[E - 1], the rows this
        rank received (combine.py, combine_rounds.py); None: all of them."""
        counts = arrays["ep_recv_count"]
        return int(counts[-1]) if counts.size else 0

    def _assumed_dispatch(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        """The dispatch's outputs a combine without a simulated dispatch reads (timing-only:
        zero rows, as a dispatch that moves no payload leaves them)."""
        if t.timing_only:
            return [{"recv_x": np.zeros((t.rows_capacity, t.recv_cols), t.out_dtype)}
                    for _ in inputs]
        return self._reference_dispatch(t, inputs)

    def _reference_dispatch(self, t: DeepepTiling, inputs: list[Arrays]) -> list[Arrays]:
        mod = ref_a5 if t.platform == "a5" else ref
        got = mod.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs],
                           self._sizes(t), t.quant)
        cap = t.rows_capacity
        return [{"recv_x": _padded(o["recv_x"], cap),
                 "dynamic_scales": _padded(o["dynamic_scales"], cap * t.scales_per_row),
                 "expand_idx": _padded(o["expand_idx"], 3 * cap)} for o in got]

    def _expand_idx(self, t: DeepepTiling, inputs: list[Arrays]) -> list[np.ndarray]:
        """Every rank's expand_idx from the routing alone: what a timing-only combine reads."""
        got = ref.source_triples([a["topk_idx"] for a in inputs], self._sizes(t))
        return [_padded(tr.reshape(-1), 3 * t.rows_capacity) for tr in got]

    def ahead(self, kernels: Sequence[str]) -> int:
        """The combine when the op runs one after its dispatch: it is the longest leg the
        main process would otherwise run after layout, notify and dispatch."""
        combine = self.runs["dispatch_combine"][3]
        return kernels.index(combine) if combine in kernels[1:] else 1

    def reference_outputs(self, kernel: str, tiling: DeepepTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        if kernel == LAYOUT.name:
            return [ref.layout(a["topk_idx"], self._sizes(tiling)) for a in inputs]
        if kernel == self.runs["dispatch_combine"][2]:
            return self._assumed_dispatch(tiling, inputs)
        return None

    def next_reads(self, kernel: str, tiling: DeepepTiling, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        """The layout's: what notify and dispatch read of it. The dispatch's: every input
        array of the combine, built as op_inputs builds them (the notify's outputs are
        those of the run's chain: simulated in the run, the reference in a forked
        combine), so an equal digest means an identical combine."""
        h = hashlib.sha256()
        if kernel != LAYOUT.name:
            t = tiling
            for arrays in self._combine_inputs(t, inputs, self._layout(t, inputs),
                                               self._notify(t, inputs), outputs):
                read = self._x_rows_read(arrays)
                for name, a in sorted(arrays.items()):
                    h.update(name.encode())
                    digest_rows(h, a, read if name == "x" else None)
            return h.digest()
        for o in outputs:
            for name in ("num_tokens_per_expert", "send_token_idx_small"):
                h.update(np.ascontiguousarray(o[name], I32).tobytes())
        return h.digest()


def _padded(a: np.ndarray, rows: int) -> np.ndarray:
    """`a` in the first rows of a zero tensor of `rows` rows (a GM output's capacity)."""
    out = np.zeros((rows, *a.shape[1:]), a.dtype)
    out[:a.shape[0]] = a
    return out



NORMAL = Normal()
