"""Family ``mc2``: ops-transformer MoeDistributeDispatchV3 / CombineV3 with
``comm_alg: fullmesh_v1`` (the operators' default, ``dispatch.py``) or ``fullmesh_v2``
(``full_mesh.py``; the combine is the same kernel), declared for the registry.

Tensor names are the operators' (aclnnMoeDistributeDispatchV4 / CombineV4 parameters,
snake case). Optional inputs the workload does not use are declared with zero rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from npusim.kernels.common.limits import DISPATCH_V3_LIMITS as _V3
from npusim.kernels.common.moe_distribute import MOE_DISTRIBUTE_CHAIN, MoeDistributeFamily
from npusim.kernels.family import Misfit, Variant
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2 import reference as ref
from npusim.kernels.mc2.combine import combine_program
from npusim.kernels.mc2.dispatch import dispatch_program
from npusim.kernels.mc2.full_mesh import full_mesh_dispatch_program
from npusim.kernels.mc2.limits import full_mesh_misfit, full_mesh_ub_misfit
from npusim.kernels.mc2.options import OPTIONS, Mc2Options
from npusim.kernels.mc2.tiling import ARCH_OF_CHIP, Mc2Tiling, workspace_ints
from npusim.kernels.mc2.window import CclBufferTooSmall, MiB, default_ccl_buffer_mb, mc2_window
from npusim.kernels.options import fields_of, option_values
from npusim.kernels.quant import fp8_format, token_dtype
from npusim.workload.inputs import uniform_tokens
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape


def _tok(t: Mc2Tiling) -> np.dtype:
    return token_dtype(t.shape.dtype)


def _a(t: Mc2Tiling, r: int) -> int:
    return t.shape.rows_capacity(r)


def _bs(t: Mc2Tiling, r: int) -> int:
    return t.bs(r)


def _mask_shape(t: Mc2Tiling, r: int) -> tuple[int, ...]:
    return {"none": (0,), "1d": (_bs(t, r),), "2d": (_bs(t, r), t.K)}[t.x_active_mask]


def _scales_shape(t: Mc2Tiling, r: int) -> tuple[int, ...]:
    if not t.smooth_scales:
        return (0,)
    if t.dispatch_quant == "static_int8" and t.static_scales != "per_expert":
        return (1,) if t.static_scales == "scalar" else (t.H,)
    return (t.shape.scale_rows(), t.H)


def _expand_x_dtype(t: Mc2Tiling) -> np.dtype:
    """The token dtype, int8, FP8 / FP4 pairs as bytes; DeepEP's per-token FP8 as e4m3fn
    (deep_ep.cpp allocates kFloat8_e4m3fn)."""
    if t.dispatch_quant == "none":
        return _tok(t)
    if t.dispatch_quant == qm.PERTOKEN_FP8:
        return fp8_format("e4m3")[0]
    return np.dtype(np.uint8) if qm.vf_mode(t.dispatch_quant) else np.dtype(np.int8)


def _expand_x_cols(t: Mc2Tiling) -> int:
    """H, or ceil(H/2) bytes of E2M1 pairs (hOutSize_)."""
    return qm.out_bytes(t.H, t.dispatch_quant) if t.dispatch_quant == qm.MXFP4 else t.H


def _scales_dtype(t: Mc2Tiling) -> np.dtype:
    return qm.scale_dtype(t.dispatch_quant) if qm.vf_mode(t.dispatch_quant) else np.dtype(
        np.float32)


def _dyn_scales_shape(t: Mc2Tiling, r: int) -> tuple[int, ...]:
    if qm.vf_mode(t.dispatch_quant):
        return (_a(t, r), qm.scale_count(t.H, t.dispatch_quant))
    return (_a(t, r) if t.dispatch_quant in qm.PER_TOKEN_MODES else 0,)


def _n_const(t: Mc2Tiling) -> int:
    return t.shape.const_experts


def _special(t: Mc2Tiling) -> bool:
    return t.shape.special_experts > 0


X = TensorSpec("x", _tok, lambda t, r: (_bs(t, r), t.H), "[BS, H] tokens")
IDS = TensorSpec("expert_ids", const(np.int32), lambda t, r: (_bs(t, r), t.K),
                 "[BS, K] routing; ids >= E are zero / copy / const experts")
SCALES_W = TensorSpec("expert_scales", const(np.float32), lambda t, r: (_bs(t, r), t.K),
                      "[BS, K] routing weights")
MASK = TensorSpec("x_active_mask", const(np.uint8), _mask_shape,
                  "(0,) none, (BS,) active prefix, (BS, K) active pairs")
ASSIST = TensorSpec("assist_info_for_combine", const(np.int32), lambda t, r: (_a(t, r), 3),
                    "[A, 3] (source rank, token, k) of every received row")
RECV = TensorSpec("ep_recv_count", const(np.int32), lambda t, r: (t.W * t.L,),
                  "[W*L] inclusive cumsum of rows per (local expert, source)")


def _performance_fields(t: Mc2Tiling, outputs: Sequence[Arrays]) -> dict[str, Any]:
    """performance_info as the report's `performance_info_us`: per rank, the longest wait
    (whole us, the operator's GetSystemCycle() / CYCLES_PER_US) for each source rank."""
    if not t.performance_info:
        return {}
    rows = []
    for o in outputs:
        p = o.get("performance_info")
        if p is None:  # combine: the cores' rows, maxed as the operator's AtomicMax does
            p = o["performance_info_cores"].reshape(t.cores, t.W).max(axis=0)
        rows.append([int(v) for v in p])
    return {"performance_info_us": rows}


class Dispatch(Kernel):
    name = "dispatch"
    phases = (
        Phase("send", "every core: the last max(1, C*S/(K+S)) to shared experts, the rest "
              "their share of the (token, k) pairs (fullmesh_v2: AllToAllDispatch on the "
              "first C - n_cs cores)"),
        Phase("set_status", "every core: S_r + E counts, SyncAll, one 32 B put each "
              "(fullmesh_v2: CalAndSendCntByExp / ByRank on the n_cs count cores)"),
        Phase("wait_dispatch", "every core: its W*L/C entries; A3 SyncCntOnCore; SyncAll "
              "(fullmesh_v2, count cores: WaitDispatch, CalRecvAndSetFlag)"),
        Phase("local_copy", "the cores with entries (fullmesh_v2: every core, WaitCumSumFlag "
              "first, rows as their block flags arrive)"),
        Phase("token_nums", "core 0 (fullmesh_v2 on A3: the first count core; on the 950 "
              "inside core 0's local_copy)"),
    )
    inputs = (X, IDS, SCALES_W, MASK,
              TensorSpec("scales", const(np.float32), _scales_shape,
                         "static_int8 scales (1,), (H,) or (E', H); int8 smooth scales"))
    variant = "dispatch_quant"
    outputs = (
        TensorSpec("expand_x", _expand_x_dtype,
                   lambda t, r: (_a(t, r), _expand_x_cols(t)), "[A, H] rows by local "
                   "expert, source (FP8 modes: the fp8 bytes)"),
        TensorSpec("dynamic_scales", _scales_dtype, _dyn_scales_shape,
                   "[A] per-token INT8 scales (int8); [A, ceil(H/128)] fp32 (pergroup); "
                   "[A, Align2(ceil(H/32))] E8M0 bytes (mxfp8, mxfp8_clip)"),
        ASSIST,
        TensorSpec("expert_token_nums", const(np.int64), lambda t, r: (t.L,),
                   "[L] rows per local expert (type 1) or their cumsum (type 0)"),
        RECV,
        TensorSpec("expand_scales", const(np.float32),
                   lambda t, r: (_a(t, r) if t.window.dispatch.expert_scale_offset is not None
                                 else 0,), "[A] expert_scales of each row"),
        TensorSpec("performance_info", const(np.int64),
                   lambda t, r: (t.W if t.performance_info else 0,),
                   "[W] longest wait for each source rank's counts, us"),
    )
    scratch = (TensorSpec("workspace", const(np.int32), lambda t, r: (workspace_ints(t),),
                          "A3 SyncCntOnCore: C rows of C x 512 B; fullmesh_v2: the prefix "
                          "table, one W*L row per core"),
               TensorSpec("performance_info_cores", const(np.int64),
                          lambda t, r: (t.cores * t.W if t.performance_info else 0,),
                          "per-core rows of performance_info (npusim's AtomicMax)"))

    def program(self, tiling: Mc2Tiling) -> Any:
        if tiling.comm_alg == "fullmesh_v2":
            return full_mesh_dispatch_program(tiling)
        return dispatch_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return _performance_fields(call.tiling, call.outputs)


class Combine(Kernel):
    name = "combine"
    phases = (Phase("send", "every core: its share of ep_recv_count[-1] rows"),
              Phase("receive", "every core: its share of the tokens, round robin"))
    inputs = (
        TensorSpec("expand_x", _tok, lambda t, r: (_a(t, r), t.H), "[A, H] expert outputs"),
        ASSIST, RECV, IDS, SCALES_W, MASK,
        TensorSpec("shared_expert_x", _tok,
                   lambda t, r: (_bs(t, r) if t.shared_expert_x else 0, t.H),
                   "[BS, H] added after the shared rows"),
        TensorSpec("ori_x", _tok, lambda t, r: (_bs(t, r) if _special(t) else 0, t.H),
                   "[BS, H] tokens for copy / const experts"),
        TensorSpec("const_expert_alpha_1", _tok, lambda t, r: (_n_const(t), t.H), "[N, H]"),
        TensorSpec("const_expert_alpha_2", _tok, lambda t, r: (_n_const(t), t.H), "[N, H]"),
        TensorSpec("const_expert_v", _tok, lambda t, r: (_n_const(t), t.H), "[N, H]"),
    )
    variant = "combine_quant"
    outputs = (TensorSpec("x", _tok, lambda t, r: (_bs(t, r), t.H), "[BS, H] combined"),
               TensorSpec("performance_info_cores", const(np.int64),
                          lambda t, r: (t.cores * t.W if t.performance_info else 0,),
                          "[C*W] per core, the longest wait for each source rank's rows, us "
                          "(their max: performance_info, the operator's AtomicMax)"))

    def program(self, tiling: Mc2Tiling) -> Any:
        return combine_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        return _performance_fields(call.tiling, call.outputs)


DISPATCH, COMBINE = Dispatch(), Combine()


def _arch(hardware: Any, o: Mc2Options) -> str | None:
    if o.arch != "auto":
        return o.arch
    return ARCH_OF_CHIP.get(hardware.chip.arch)


def _bs_list(shape: MoeShape, o: Mc2Options) -> tuple[int, ...]:
    return tuple(o.bs_per_rank) or (shape.BS,) * shape.W


def _shape(shape: MoeShape, o: Mc2Options) -> MoeShape:
    """The scenario's shape with what the V3 operators take beyond it (BS per rank,
    globalBs, the special experts)."""
    bs = _bs_list(shape, o)
    gbs = o.global_bs or (shape.W * max(bs) if len(set(bs)) > 1 else 0)
    return replace(shape, bs_per_rank=bs, global_bs=gbs, zero_experts=o.zero_experts,
                   copy_experts=o.copy_experts, const_experts=o.const_experts)


def _quant_misfit(o: Mc2Options, arch: str, hardware: Any, dtype: str) -> Misfit | None:
    """Where the operators refuse a quant mode: A3's tiling takes quant_mode 0 or 2
    (npusim also runs static_int8 there); MX takes no scales. Not modelled: FP4 E1M2,
    FP4 E2M1 of float16 tokens."""
    quant = o.dispatch_quant
    mode = qm.QUANT_MODE[quant]
    cq = o.combine_quant
    if arch == "arch22" and cq in qm.COMBINE_MX:
        return Misfit("workload.combine_quant", f"{cq} (comm_quant_mode "
                      f"{qm.COMBINE_MODE[cq]}) is the 950's (arch35); allowed on A3 (arch22): "
                      "none, int8")
    if cq in qm.COMBINE_MX and hardware.vector.model != "regbase":
        return Misfit("hardware.vector.model", f"combine_quant {cq} runs the 950's vector "
                      f"functions; the preset has {hardware.vector.model!r}, allowed: regbase")
    if arch == "arch22" and (qm.fp8_mode(quant) or quant in qm.FP4_MODES):
        return Misfit("workload.dispatch_quant", f"{quant} (quant_mode {mode}) is the 950's "
                      "(arch35); the A3 operator (arch22) allows quant_mode 0 or 2: none, "
                      "int8 (npusim also runs static_int8)")
    if quant in qm.FP4_MODES and quant != qm.MXFP4:
        return Misfit("workload.dispatch_quant", f"{quant}: {qm.NOT_MODELLED}; allowed: "
                      "none, static_int8, int8, pergroup, mxfp8, mxfp8_clip, mxfp4_e2m1")
    if quant == qm.MXFP4 and dtype != "bfloat16":
        return Misfit("workload.dtype", f"{dtype}: {quant} {qm.FP16_FP4}; allowed: bfloat16")
    if (quant in qm.MX_MODES or quant == qm.MXFP4) and o.smooth_scales:
        return Misfit("workload.smooth_scales", "scales must be nullptr when quantMode is "
                      f"MX_QUANT ({quant}); allowed: false")
    if qm.vf_mode(quant) and hardware.vector.model != "regbase":
        return Misfit("hardware.vector.model", f"{quant} runs the 950's vector functions; "
                      f"the preset has {hardware.vector.model!r}, allowed: regbase")
    return None


class Mc2(MoeDistributeFamily):
    name = "mc2"
    help = ("ops-transformer MoeDistributeDispatchV3 / CombineV3, comm_alg fullmesh_v1 "
            "(the default of vllm-ascend, DeepEP-Ascend, cann-recipes-infer) or fullmesh_v2")
    ops = (DISPATCH, COMBINE)
    chain = replace(MOE_DISTRIBUTE_CHAIN, also=("dynamic_scales",))
    runs = {"dispatch": ("dispatch",), "dispatch_combine": ("dispatch", "combine")}
    shape_limits = _V3
    variants = tuple(Variant(a, {"comm_alg": a}) for a in ("fullmesh_v1", "fullmesh_v2"))
    options = OPTIONS

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> Mc2Tiling:
        o = self.typed(options)
        s = _shape(shape, o)
        arch = _arch(hardware, o)
        quant = o.dispatch_quant
        alg = o.comm_alg
        mb = o.ccl_buffer_size or default_ccl_buffer_mb(s.max_bs, s.H, s.W, s.L, s.K, s.S,
                                                        arch, alg)
        win = mc2_window(s.max_bs, s.H, s.W, s.L, s.K, s.S, quant, arch, mb,
                         hardware.chip.aiv_cores, expert_scales=o.expand_scales,
                         combine_quant=o.combine_quant, comm_alg=alg,
                         default=not o.ccl_buffer_size)
        smooth = quant == "static_int8" or (quant in ("int8", "pergroup")
                                            and o.smooth_scales)
        return Mc2Tiling(**{**fields_of(Mc2Tiling, o), "arch": arch, "smooth_scales": smooth},
                         shape=s, cores=hardware.chip.aiv_cores, ub_bytes=hardware.ub.bytes,
                         window=win, timing_only=timing_only, expert_scales=True)

    def typed(self, options: Mapping[str, Any]) -> Mc2Options:
        """The options as a Mc2Options (keys left out: their declared defaults)."""
        return Mc2Options(**option_values(OPTIONS, options))

    def window(self, tiling: Mc2Tiling) -> Any:
        return tiling.window

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        o = self.typed(options)
        arch = _arch(hardware, o)
        if arch is None:
            return Misfit("workload.arch", f"auto: chip.arch {hardware.chip.arch} of preset "
                          f"{hardware.name!r} is neither ascend910_93 (A3) nor ascend950; "
                          "allowed: arch22 (A3) or arch35 (950)")
        refused = _quant_misfit(o, arch, hardware, shape.dtype)
        if refused is not None:
            return refused
        bs = o.bs_per_rank
        if bs and (len(bs) != shape.W or max(bs) != shape.BS):
            return Misfit("workload.bs_per_rank", f"{len(bs)} entries with largest "
                          f"{max(bs)}; allowed: ep_world_size = {shape.W} entries, the largest "
                          f"equal to bs = {shape.BS}")
        try:
            s = _shape(shape, o)
        except ValueError as exc:
            return Misfit("workload.global_bs", str(exc))
        alg = o.comm_alg
        if alg == "fullmesh_v2":
            bad = full_mesh_misfit(shape, o, arch)
            if bad:
                return Misfit(*bad)
        mb = o.ccl_buffer_size or default_ccl_buffer_mb(s.max_bs, s.H, s.W, s.L, s.K, s.S,
                                                        arch, alg)
        try:
            win = mc2_window(s.max_bs, s.H, s.W, s.L, s.K, s.S, o.dispatch_quant, arch,
                             mb, hardware.chip.aiv_cores, o.expand_scales,
                             o.combine_quant, alg, default=not o.ccl_buffer_size)
        except CclBufferTooSmall as exc:
            return Misfit("workload.ccl_buffer_size", str(exc))
        if alg == "fullmesh_v2":
            bad = full_mesh_ub_misfit(self.tiling(shape, options, hardware, True))
            if bad:
                return Misfit(*bad)
        if win.ccl_bytes > hardware.window.bytes:
            return Misfit("hardware.window.bytes", f"the {win.ccl_bytes // MiB} MiB CCL buffer "
                          f"(2 x ccl_buffer_size {win.ccl_bytes // (2 * MiB)} MB) exceeds the "
                          "preset's "
                          f"{hardware.window.bytes // MiB} MiB window")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        o = self.typed(options)
        s = _shape(shape, o)
        dt = token_dtype(s.dtype)
        seeds = np.random.SeedSequence(routing.seed).spawn(4)
        rx, rr, rw, rm = (np.random.default_rng(c) for c in seeds)
        ids = routing.expert_ids(s.W, shape.BS, s.K, s.E + s.special_experts, rr)
        frac = o.active_fraction
        n_const = s.const_experts
        const = {n: (uniform_tokens(rw, (n_const, s.H), dt) / 16).astype(dt) if payload
                 else np.zeros((n_const, s.H), dt)
                 for n in ("const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v")}
        out = []
        for r in range(s.W):
            bs = s.bs[r]
            x = uniform_tokens(rx, (bs, s.H), dt) if payload else np.zeros((bs, s.H), dt)
            mask = np.zeros(0, np.uint8)
            if o.x_active_mask == "1d":
                mask = (np.arange(bs) < max(1, round(frac * bs))).astype(np.uint8)
            elif o.x_active_mask == "2d":
                mask = (rm.random((bs, s.K)) < frac).astype(np.uint8)
            arrays = {"x": x, "expert_ids": np.ascontiguousarray(ids[r][:bs]),
                      "expert_scales": rw.uniform(0, 1, (bs, s.K)).astype(np.float32),
                      "x_active_mask": mask,
                      "scales": self._scales(s, o, rw),
                      "shared_expert_x": (uniform_tokens(rx, (bs, s.H), dt)
                                          if o.shared_expert_x else
                                          np.zeros((0, s.H), dt)),
                      "ori_x": x if s.special_experts else np.zeros((0, s.H), dt)}
            arrays.update(const)
            out.append(arrays)
        return out

    @staticmethod
    def _scales(s: MoeShape, o: Mc2Options, rng: np.random.Generator
                ) -> np.ndarray:
        q = o.dispatch_quant
        if q == "static_int8":
            shape = {"scalar": (1,), "per_channel": (s.H,),
                     "per_expert": (s.scale_rows(), s.H)}[o.static_scales]
            return rng.uniform(4.0, 12.0, shape).astype(np.float32)
        if q in ("int8", "pergroup") and o.smooth_scales:
            return rng.uniform(0.5, 2.0, (s.scale_rows(), s.H)).astype(np.float32)
        return np.zeros(0, np.float32)

    # ---- chaining dispatch -> combine (identity experts)
    @staticmethod
    def _dispatch_inputs(t: Mc2Tiling, inputs: list[Arrays]) -> list[ref.DispatchInputs]:
        out = []
        for a in inputs:
            m = a["x_active_mask"]
            out.append(ref.DispatchInputs(a["x"], a["expert_ids"], a["expert_scales"],
                                          m.astype(bool) if m.size else None,
                                          a["scales"] if a["scales"].size else None))
        return out

    def chained(self, tiling: Mc2Tiling, outputs: list[Arrays]) -> list[Arrays]:
        """Combine's expand_x is the identity experts' output: dispatch's first
        received_rows rows dequantised to the token dtype."""
        t = tiling
        scaled = t.window.dispatch.scale_offset is not None
        res = []
        for r, (o, linked) in enumerate(zip(outputs, super().chained(t, outputs), strict=True)):
            ep = o["ep_recv_count"]
            d = ref.DispatchOutputs(o["expand_x"], o["dynamic_scales"] if scaled else None,
                                    o["assist_info_for_combine"], o["expert_token_nums"], ep,
                                    None, self.received_rows(t, r, ep))
            res.append({**linked, "expand_x": ref.dequantized_rows(
                d, t.dispatch_quant, t.shape.dtype, t.quant_dtype, t.H)})
        return res

    def received_rows(self, tiling: Mc2Tiling, rank: int, counts: np.ndarray) -> int:
        """A shared rank's count is entry W - 1 of ep_recv_count, a MoE rank's W*L - 1."""
        return int(counts[tiling.status_count(rank) - 1])

    def reference_dispatch(self, tiling: Mc2Tiling, inputs: list[Arrays]) -> list[Arrays]:
        outs = ref.reference_dispatch(tiling.shape, self._dispatch_inputs(tiling, inputs),
                                      tiling.dispatch_quant, tiling.expert_token_nums_type,
                                      tiling.quant_dtype)
        expand_scales = tiling.window.dispatch.expert_scale_offset is not None
        none = np.zeros(0, np.float32)
        return [{"expand_x": o.expand_x,
                 "dynamic_scales": o.dynamic_scales if o.dynamic_scales is not None else none,
                 "assist_info_for_combine": o.assist_info_for_combine,
                 "expert_token_nums": o.expert_token_nums,
                 "ep_recv_count": o.ep_recv_count,
                 "expand_scales": (o.expand_scales if o.expand_scales is not None
                                   and expand_scales else none),
                 "performance_info": np.zeros(tiling.W if tiling.performance_info else 0,
                                              np.int64)}
                for o in outs]


FAMILY = Mc2()
