"""What combine reads of dispatch: the identity experts between them, the routing's
assist info and counts, the reference dispatch outputs and a digest of what combine reads.

Between dispatch and combine the hardware runs the experts; npusim's are identities
(shared ones too), so combine's expand_x is dispatch's rows dequantised to the token
dtype. A standalone combine (or a case directory's) reads the inputs' expand_x instead.
"""

from __future__ import annotations

import numpy as np

from npusim.hw.memory import RowTable
from npusim.kernels.cann_sample.reference import dispatch_plan, reference_dispatch
from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.chain import next_reads_digest
from npusim.kernels.quant import int8_token_dequantize, mxfp8_dequantize, token_dtype


def expert_rows(t: MoeTiling, dispatch_out: list[dict[str, np.ndarray]]
                ) -> list[np.ndarray | RowTable]:
    """Combine's expand_x: the identity experts' outputs of dispatch's rows (zero rows in
    a timing-only run, which moves no payload)."""
    if t.timing_only:
        row_bytes = t.H * token_dtype(t.dtype).itemsize
        return [RowTable.zeros(t.shape.rows_of(r), row_bytes) for r in range(t.world)]
    return expert_outputs(dispatch_out, t)


def reference_dispatch_outputs(t: MoeTiling, inputs: list[dict[str, np.ndarray]]
                               ) -> list[dict[str, np.ndarray]]:
    """What a correct dispatch writes (the family's reference), as the kernel writes it;
    in a timing-only run only what combine reads of it (assist info and counts)."""
    if t.timing_only:
        return routing_meta(t, inputs)
    return reference_dispatch(
        [r["x"] for r in inputs], [r["expert_ids"] for r in inputs], t.L,
        t.dispatch_quant, t.expert_token_nums_type, saturate=t.mxfp8_saturate,
        shared_experts=t.S, shared_expert_ranks=t.shape.S_r)


def dispatch_digest(dispatch_out: list[dict[str, np.ndarray]] | None, t: MoeTiling) -> bytes:
    """A hash of everything combine reads of dispatch's outputs: every rank's counts and
    its first ep_recv_count[-1] rows of assist info (and of expand_x and scales, unless
    the run is timing-only). The combine kernel reads no row beyond the count."""
    rows = ["assist_info_for_combine"]
    if not t.timing_only:
        rows += ["expand_x", "dynamic_scales"]
    return next_reads_digest(dispatch_out or [], "ep_recv_count", rows)


def expert_outputs(dispatch_out: list[dict[str, np.ndarray]], t: MoeTiling
                   ) -> list[np.ndarray | RowTable]:
    """Identity experts (shared ones too): every rank's dispatched rows dequantised to the
    token dtype. A token reaches several ranks as the same bytes; dequantisation is a pure
    function of them, so each distinct (row, scales) is dequantised once, bit-identically,
    and the ranks' expand_x tensors share those rows (RowTable) instead of a copy each."""
    dt = token_dtype(t.dtype)
    if t.dispatch_quant == "none":  # the rows as they are (combine only reads them)
        return [d["expand_x"].view(dt) for d in dispatch_out]
    row_view = np.int8 if t.dispatch_quant == "int8" else np.uint8
    where: dict[bytes, int] = {}  # (row, scales) bytes -> index among the distinct rows
    picks, firsts = [], []
    for r, d in enumerate(dispatch_out):
        n = int(d["ep_recv_count"][-1])
        if not n:
            picks.append(np.empty(0, np.intp))
            continue
        rows = d["expand_x"][:n].view(np.uint8)
        scales = d["dynamic_scales"][:n].reshape(n, -1).view(np.uint8)
        pick = np.empty(n, np.intp)
        for i in range(n):
            key = rows[i].tobytes() + scales[i].tobytes()
            j = where.get(key)
            if j is None:
                j = where[key] = len(firsts)
                firsts.append((r, i))
            pick[i] = j
        picks.append(pick)
    if firsts:
        data = np.stack([dispatch_out[r]["expand_x"][i] for r, i in firsts]).view(row_view)
        scales = np.stack([dispatch_out[r]["dynamic_scales"][i] for r, i in firsts])
        if t.dispatch_quant == "mxfp8":
            distinct = mxfp8_dequantize(data, scales, out_dtype=dt)
        else:
            distinct = int8_token_dequantize(data, scales, out_dtype=dt)
    else:
        distinct = np.zeros((0, t.H), dtype=dt)
    table = np.ascontiguousarray(distinct).view(np.uint8).reshape(len(firsts), t.H * dt.itemsize)
    return [RowTable(table, pick, t.shape.rows_of(r)) for r, pick in enumerate(picks)]


def routing_meta(t: MoeTiling, inputs: list[dict[str, np.ndarray]]
                 ) -> list[dict[str, np.ndarray]]:
    """Dispatch's assist info and receive counts as the routing determines them."""
    plans = dispatch_plan([inp["expert_ids"] for inp in inputs], t.L, t.S, t.shape.S_r)
    meta = []
    for r, plan in enumerate(plans):
        assist = np.zeros((t.shape.rows_of(r), 3), np.int32)
        assist[:plan.n] = plan.triples()
        meta.append({"assist_info_for_combine": assist, "ep_recv_count": plan.running()})
    return meta
