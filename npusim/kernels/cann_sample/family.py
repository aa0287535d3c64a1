"""The CANN sample's family: moe_dispatch_and_combine_story's dispatch and combine
(with ops-transformer V2's shared experts), declared for the registry.

Tensor names are the sample's file names (gen_data.py, verify_result.py), so a case
directory and a `--tensors` dump use the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npusim.kernels.cann_sample import casedir, chain, fit
from npusim.kernels.cann_sample.combine import combine_program
from npusim.kernels.cann_sample.dispatch import dispatch_program
from npusim.kernels.cann_sample.layout import WindowLayout
from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.limits import DISPATCH_V3_LIMITS
from npusim.kernels.common.moe_distribute import MoeDistributeFamily
from npusim.kernels.family import Misfit, Option, Variant
from npusim.kernels.kernel import Arrays, Kernel, Phase, TensorSpec, const
from npusim.kernels.options import option_values
from npusim.kernels.quant import token_dtype
from npusim.workload.shape import MoeShape


def _token(t: MoeTiling) -> np.dtype:
    return token_dtype(t.dtype)


def _rows(t: MoeTiling, r: int) -> int:
    return t.shape.rows_of(r)


def _expand_dtype(t: MoeTiling) -> Any:
    """Dispatch's rows: e5m2 bytes (mxfp8), int8 (int8) or the token dtype (none)."""
    return {"mxfp8": np.uint8, "int8": np.int8}.get(t.dispatch_quant) or _token(t)


def _scales_dtype(t: MoeTiling) -> Any:
    return np.uint8 if t.dispatch_quant == "mxfp8" else np.float32


def _scales_shape(t: MoeTiling, r: int) -> tuple[int, ...]:
    """[A, Align2(ceil(H/32))] E8M0 bytes (mxfp8), [A] fp32 (int8), [A, 0] (none)."""
    a = _rows(t, r)
    if t.dispatch_quant == "mxfp8":
        return (a, t.record.scale_bytes)
    return (a,) if t.dispatch_quant == "int8" else (a, 0)


X_IN = TensorSpec("x", _token, lambda t, r: (t.BS, t.H), "[BS, H] tokens")
IDS = TensorSpec("expert_ids", const(np.int32), lambda t, r: (t.BS, t.K), "[BS, K] routing")
ASSIST = TensorSpec("assist_info_for_combine", const(np.int32), lambda t, r: (_rows(t, r), 3),
                    "[A, 3] (source rank, token, k) of every received row")
RECV = TensorSpec("ep_recv_count", const(np.int32), lambda t, r: (t.status_count(r),),
                  "[W*L] inclusive prefix sums of the rows received per (expert, source)")


class Dispatch(Kernel):
    name = "dispatch"
    phases = (
        Phase("send_data", "the all-to-all cores [0, n_a2a) and the shared-send cores"),
        Phase("send_status", "the cum-sum cores"),
        Phase("wait_status", "the cum-sum cores"),
        Phase("local_copy", "every core"),
    )
    inputs = (X_IN, IDS)
    variant = "dispatch_quant"
    outputs = (
        TensorSpec("expand_x", _expand_dtype, lambda t, r: (_rows(t, r), t.H),
                   "[A, H] received rows, grouped by local expert"),
        TensorSpec("dynamic_scales", _scales_dtype, _scales_shape, "per-row scales"),
        ASSIST,
        TensorSpec("expert_token_nums", const(np.int64), lambda t, r: (t.local_experts(r),),
                   "[L] rows per local expert (or their cumsum)"),
        RECV,
    )
    scratch = (TensorSpec("workspace", const(np.int32),
                          lambda t, r: (t.cores, t.status_count(r)),
                          "per-core copies of the prefix table"),)

    def program(self, tiling: MoeTiling) -> Any:
        return dispatch_program(tiling)


class Combine(Kernel):
    name = "combine"
    phases = (
        Phase("send_data", "every core"),
        Phase("wait_status", "every core"),
        Phase("combine", "every core"),
    )
    inputs = (
        TensorSpec("expand_x", _token, lambda t, r: (_rows(t, r), t.H),
                   "[A, H] expert outputs of the received rows"),
        ASSIST, RECV, IDS,
        TensorSpec("expert_scales", const(np.float32), lambda t, r: (t.BS, t.K),
                   "[BS, K] routing weights"),
    )
    variant = "combine_quant"
    outputs = (TensorSpec("x", _token, lambda t, r: (t.BS, t.H), "[BS, H] combined tokens"),)

    def program(self, tiling: MoeTiling) -> Any:
        return combine_program(tiling)


DISPATCH, COMBINE = Dispatch(), Combine()
DISPATCH_OUTPUTS = tuple(s.name for s in DISPATCH.outputs)

OPTIONS = (
    Option("dispatch_quant", "choice", "none",
           "quantisation before dispatch: none, per-token dynamic INT8 (ops-transformer "
           "quant_mode 2), MXFP8 E5M2 blocks of 32 (quant_mode 4, the sample)",
           choices=("none", "int8", "mxfp8")),
    Option("combine_quant", "choice", "none",
           "combine's INT8 block quantisation (blocks of 8 fp32, the sample)",
           choices=("none", "int8")),
    Option("mxfp8_saturate", "bool", False,
           "clamp MXFP8 values to +-57344 (newer ops-transformer) instead of overflowing "
           "to inf (the sample)"),
    Option("combine_recip", "bool", True,
           "INT8 scale as max * (1/127) like the kernel (`true`) or max / 127 like the "
           "sample's golden script (`false`)"),
    Option("expert_token_nums_type", "choice", "count",
           "`expert_token_nums` output as per-expert counts (sample default, type 1) or "
           "their inclusive prefix sum (type 0)", choices=("count", "cumsum")),
)
"""The workload options, declared once: the tiling takes their defaults."""


class CannSample(MoeDistributeFamily):
    name = "cann_sample"
    help = ("the CANN sample moe_dispatch_and_combine_story (MXFP8/INT8 dispatch, INT8 "
            "combine), with ops-transformer V2's shared experts")
    ops = (DISPATCH, COMBINE)
    shape_limits = DISPATCH_V3_LIMITS  # the sample implements the V3 operators' algorithm
    options = OPTIONS
    variants = (Variant(""),)
    case_format = ("CANN sample case directory: input/, golden/, output/chip_<r>/"
                   "<name>_<r>.bin (gen_data.py, verify_result.py)")

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> MoeTiling:
        return MoeTiling(shape, hardware.chip.aiv_cores, timing_only=timing_only,
                         **option_values(OPTIONS, options))

    def window(self, tiling: MoeTiling) -> WindowLayout:
        return tiling.window

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        dispatching = DISPATCH.name in self.runs[op]
        return (fit.window_misfit(shape, options, hardware, dispatching)
                or fit.cores_misfit(shape, hardware))

    @staticmethod
    def _standalone(inputs: list[Arrays], previous: list[Arrays] | None) -> bool:
        """Combine reads the inputs' expand_x (its own run, a case directory's) if given."""
        return previous is None or COMBINE.inputs[0].name in inputs[0]

    def op_inputs(self, kernel: str, tiling: MoeTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        """A standalone combine reads the inputs' expand_x with the routing's assist info
        and counts; otherwise the chain's."""
        if kernel == COMBINE.name and self._standalone(inputs, previous):
            return [{**a, **m} for a, m in zip(inputs, chain.routing_meta(tiling, inputs),
                                               strict=True)]
        return super().op_inputs(kernel, tiling, inputs, previous)

    def chained(self, tiling: MoeTiling, outputs: list[Arrays]) -> list[Arrays]:
        """Combine's expand_x is the identity experts' output: dispatch's rows dequantised
        (zero rows in a timing-only run, whose reference writes no rows); the assist info
        and counts as the chain links them."""
        rows = chain.expert_rows(tiling, outputs)
        return [{**{into: o[out] for into, out in self.chain.links.items() if out in o},
                 "expand_x": ex} for o, ex in zip(outputs, rows, strict=True)]

    def reference_dispatch(self, tiling: MoeTiling, inputs: list[Arrays]) -> list[Arrays]:
        if self._standalone(inputs, []):  # combine reads nothing of dispatch
            return [{} for _ in inputs]
        return chain.reference_dispatch_outputs(tiling, inputs)

    def next_reads(self, kernel: str, tiling: MoeTiling, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        """Combine reads the rows with their scales (it dequantises them), none in a
        timing-only run; nothing of dispatch when it reads the inputs' expand_x."""
        if self._standalone(inputs, outputs):
            return b""
        return chain.dispatch_digest(outputs, tiling)

    def pair_bytes(self, tiling: MoeTiling, op: str, timing_only: bool, workers: int) -> int:
        """With workers >= 2 a dispatch_combine run holds both ops' machines at once (two
        processes, the child with the reference dispatch's rows); with 1, dispatch's outputs
        and combine's machine (or dispatch's machine, the larger)."""
        t, kernels = tiling, self.runs[op]
        rec = t.record
        scales = {"mxfp8": rec.scale_bytes, "int8": 4, "none": 0}[t.dispatch_quant]
        kept = rec.data_bytes + scales + 12  # an expand_x row with its scales and assist info
        dispatch = rec.slot_bytes + kept if DISPATCH.name in kernels else 0
        combine = 0
        if COMBINE.name in kernels:
            combine = t.combine_record.slot_bytes  # the combine slot in the source's window
            if not timing_only:
                combine += 2 * t.H  # combine's expand_x input row in the token dtype
        if not dispatch or not combine:
            return dispatch + combine
        if workers >= 2:  # the forked combine also holds the reference dispatch's rows
            return dispatch + kept + combine
        return max(dispatch, kept + combine)  # dispatch's machine is freed before combine's

    def case_misfit(self, case_dir: Path, shape: MoeShape, options: Mapping[str, Any],
                    op: str, timing_only: bool) -> str | None:
        if shape.S:
            return ("the CANN sample's case directories have no shared experts; allowed only "
                    "with workload.shared_experts: 0")
        if timing_only:
            return ("a case directory needs real payload bytes; "
                    "allowed only with workload.timing_only: false")
        return fit.case_misfit(case_dir, shape, self.runs[op])

    def read_case(self, case_dir: Path, shape: MoeShape, op: str) -> list[Arrays]:
        return casedir.read_case_inputs(case_dir, shape, op)

    def write_case(self, case_dir: Path, kernel: str, outputs: Sequence[Arrays]) -> None:
        names = {s.name for s in self.kernel(kernel).outputs}
        for r, outs in enumerate(outputs):
            casedir.write_outputs(case_dir, r, {k: v for k, v in outs.items()
                                                if k in names and v.size})


FAMILY = CannSample()
