"""Family ``kv_offload``: GatherSelectionKvCache (hicann/cann-recipes-infer) at a decode step,
with DeepSeek-V3.2's full MLA cache in device HBM or in host memory (SHMEM's HOST_SIDE heap
in the article; torch_npu's swapped memory in the public model code: both are host DRAM
mapped into the device and reached over the same NPU -> host path, so one model serves
both). Op `gather`, one layer's call on one card; the report gives the step's bytes
gathered from the full cache, the reuse rate, the gather time, the effective GB/s, the
same per decode step (x layers) and the card's KV footprint with and without offload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npusim.hw.host import capacity_problem
from npusim.kernels.family import (
    Arrays,
    CoreTiming,
    Family,
    Misfit,
    Option,
    Phase,
    TensorSpec,
    const,
)
from npusim.kernels.kv_offload.inputs import step_inputs
from npusim.kernels.kv_offload.program import gather_program
from npusim.kernels.kv_offload.reference import gather, plan
from npusim.kernels.kv_offload.tiling import INDEXER_KEY, KvTiling
from npusim.kernels.shape import MoeShape
from npusim.kernels.vector_sample import NoWindow, TaskKernel

U8, I32 = const(np.uint8), const(np.int32)


def _rows(n: str) -> Any:
    def shape(t: KvTiling, r: int) -> tuple[int, ...]:
        rows = t.f_blocks * t.block if n.startswith("full") else t.s_blocks * t.block
        width = t.rope_bytes if n.endswith("rope") else t.kv_bytes
        return (rows, width)
    return shape


def _flat(n: str) -> Any:
    rows = _rows(n)
    return lambda t, r: (int(np.prod(rows(t, r))),)


INPUTS = (
    TensorSpec("full_kv_cache", U8, _rows("full_kv"), "[F_BLOCK_NUM * BLOCK, kv bytes] "
               "the latent rows (bf16 as bytes, or the c8 row)", shared_rows=True),
    TensorSpec("full_k_rope", U8, _rows("full_rope"), "[F_BLOCK_NUM * BLOCK, rope bytes] "
               "(empty for c8)", shared_rows=True),
    TensorSpec("full_kv_block_table", I32, lambda t, r: (t.batch, t.f_max), "[B, F_MAX]"),
    TensorSpec("selection_kv_block_table", I32, lambda t, r: (t.batch, t.s_max), "[B, S_MAX]"),
    TensorSpec("selection_kv_block_status_prev", I32, lambda t, r: (t.batch, t.topk + 1),
               "[B, TOPK + 1] the status the previous step left"),
    TensorSpec("selection_topk_indices", I32, lambda t, r: (t.batch, t.topk),
               "[B, TOPK] this step's topk (unsorted)"),
    TensorSpec("selection_kv_cache_prev", U8, _flat("sel_kv"), "the rows the previous step left"),
    TensorSpec("selection_k_rope_prev", U8, _flat("sel_rope"), "(empty for c8)"),
    TensorSpec("full_kv_actual_seq", I32, lambda t, r: (t.batch,), "[B]"),
    TensorSpec("full_q_actual_seq", I32, lambda t, r: (t.batch,), "[B] (1 at decode)"),
)
OUTPUTS = (
    TensorSpec("selection_kv_cache", U8, _rows("sel_kv"), "[S_BLOCK_NUM * BLOCK, kv bytes]"),
    TensorSpec("selection_k_rope", U8, _rows("sel_rope"), "[S_BLOCK_NUM * BLOCK, rope bytes]"),
    TensorSpec("selection_kv_block_status", I32, lambda t, r: (t.batch, t.topk + 1),
               "[B, TOPK + 1] the slots' token ids, -1 past the count, the count last"),
    TensorSpec("selection_kv_actual_seq", I32, lambda t, r: (t.batch,), "[B] valid tokens"),
)


def footprint(t: KvTiling) -> dict[str, Any]:
    """The card's KV bytes for its B sequences of seq_len tokens over all layers: without
    offload every row and the indexer keys on the device; with it the full rows in host
    memory and, on the device, the indexer keys and one selection cache per layer."""
    rows = t.batch * t.seq_len * t.layers
    device_full = rows * (t.row_bytes + INDEXER_KEY)
    device_offload = rows * INDEXER_KEY + t.batch * t.topk * t.layers * t.row_bytes
    return {"kv_bytes_per_card_no_offload": device_full,
            "kv_bytes_per_card_offload": device_offload,
            "host_bytes_per_card_offload": rows * t.row_bytes,
            "row_bytes": t.row_bytes, "indexer_key_bytes": INDEXER_KEY}


class Gather(TaskKernel):
    name = "gather"
    phases = (Phase("copy_in", "every core, per sequence: topk, status and block-table rows"),
              Phase("find_hits", "sort topk and status (vector), two-pointer hit search"),
              Phase("gather", "per written slot: kv and rope rows full (or selection) -> UB "
                    "-> selection cache, two buffers"),
              Phase("write_back", "status row and valid count to GM"))
    inputs = INPUTS
    outputs = OUTPUTS

    def program(self, tiling: KvTiling) -> Any:
        return gather_program(tiling)

    def timing_fields(self, tiling: KvTiling, run: Any,
                      cores: Sequence[Sequence[CoreTiming]]) -> dict[str, Any]:
        rows = nbytes = 0
        for row in run.core_transfers:
            for transfers in row:
                for x in transfers:
                    if x.name.startswith("CopyFromFullKv"):
                        rows += x.count
                        nbytes += x.bytes
        rows //= 2 if tiling.rope_bytes else 1
        valid = tiling.batch * min(tiling.topk, tiling.seq_len)
        span = run.end_ns - run.start_ns - tiling.launch_ns
        return {"kv_location": tiling.location, "rows_gathered": rows,
                "bytes_gathered": nbytes, "reuse_rate": 1 - rows / valid if valid else 0.0,
                "gather_us": span / 1000.0, "effective_gbps": nbytes / span if span else 0.0,
                "per_step_us": span * tiling.layers / 1000.0,
                "per_step_bytes": nbytes * tiling.layers, **footprint(tiling)}


class KvOffload(Family):
    name = "kv_offload"
    uses_moe_shape = False
    help = ("GatherSelectionKvCache at a DeepSeek-V3.2 decode step: the indexer's topk rows "
            "gathered from the full MLA cache (HBM or host memory) into the device-side "
            "selection cache, reusing the rows the previous step left there")
    ops = (Gather(),)
    references = True  # reference_outputs
    runs = {"gather": ("gather",)}
    options = (
        Option("batch", "int", 16, "B: sequences on the card", lo=1, hi=1024),
        Option("seq_len", "int", 65536, "tokens of every sequence's full cache", lo=1,
               hi=1 << 20),
        Option("topk", "int", 2048, "TOPK (DeepSeek-V3.2 index_topk 2048; the op allows "
               "up to 2048)", lo=1, hi=2048),
        Option("block", "int", 128, "BLOCK_SIZE tokens per cache block", lo=1, hi=1024),
        Option("c8", "bool", False, "the int8 cache: 656 B rows and no rope tensor"),
        Option("kv_location", "choice", "host", "where the full cache lives",
               choices=("host", "hbm")),
        Option("reuse", "float", 0.6, "share of this step's topk the selection cache holds "
               "from the previous step (the guide's 60%)", lo=0.0, hi=1.0),
        Option("cache_blocks", "int", 0, "F_BLOCK_NUM of the full cache (0: exactly B * "
               "ceil(seq_len / block))", lo=0, hi=1 << 30),
        Option("layers", "int", 61, "calls per decode step (DeepSeek-V3.2: 61 layers)",
               lo=1, hi=1024),
    )

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> KvTiling:
        o = options
        t = KvTiling(o["batch"], o["seq_len"], o["topk"], o["block"], o["c8"],
                     o["kv_location"], o["reuse"], o["cache_blocks"], o["layers"],
                     min(o["batch"], hardware.chip.aiv_cores), hardware.kernel.task_launch_ns)
        return t

    def window(self, tiling: KvTiling) -> NoWindow:
        return NoWindow()

    def tiling_misfit(self, tiling: KvTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        if t.topk > t.seq_len:
            return Misfit("workload.topk", f"{t.topk} is above the sequence length "
                          f"{t.seq_len}: the indexer selects topk distinct tokens of it; "
                          f"allowed: at most {t.seq_len}")
        if t.cache_blocks and t.cache_blocks < t.batch * t.f_max:
            return Misfit("workload.cache_blocks", f"{t.cache_blocks}: the block table of "
                          f"{t.batch} sequences of {t.f_max} blocks points past the cache; "
                          f"allowed: 0 or at least {t.batch * t.f_max}")
        ub = 4 * (t.topk + t.topk + 1 + 2 * t.topk + t.s_max + t.f_max) + 2 * t.row_bytes
        if ub > hardware.ub.bytes:
            return Misfit("workload.seq_len", f"{t.seq_len}: the UB buffers need {ub} B, more "
                          f"than {hardware.ub.bytes}")
        if t.location == "host":
            if hardware.host is None:
                return Misfit("hardware", f"{hardware.name} has no host memory (no host "
                              "section); allowed: kv_location hbm, or atlas_a3 / ascend950")
            full = t.f_blocks * t.block * t.row_bytes
            problem = capacity_problem(hardware, 1, full)
            if problem:
                return Misfit("workload.seq_len", f"a full cache of {full} B in host "
                              f"memory: {problem}")
        return None

    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Any, payload: bool) -> list[Arrays]:
        return [{"seed": np.array([routing.get("seed", 0)]),
                 "payload": np.array([payload])}]

    def op_inputs(self, kernel: str, tiling: KvTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        got = step_inputs(tiling, int(inputs[0]["seed"][0]), bool(inputs[0]["payload"][0]))
        return [got]  # type: ignore[list-item]

    def reference_outputs(self, kernel: str, tiling: KvTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        return [reference(tiling, self.op_inputs(kernel, tiling, inputs, None)[0])]


def reference(t: KvTiling, ins: Mapping[str, Any]) -> Arrays:
    """The step's outputs in numpy from its inputs (reference.plan per sequence)."""
    full_kv = ins["full_kv_cache"]
    full_rope = ins["full_k_rope"]
    sel_kv = np.array(ins["selection_kv_cache_prev"]).reshape(-1, t.kv_bytes)
    sel_rope = np.array(ins["selection_k_rope_prev"]).reshape(-1, t.rope_bytes)
    fbt, sbt = ins["full_kv_block_table"], ins["selection_kv_block_table"]
    status = np.array(ins["selection_kv_block_status_prev"])
    seqs = np.zeros(t.batch, np.int32)
    kv_rows = full_kv.table[full_kv.pick] if full_kv.pick.size else None
    rope_rows = full_rope.table[full_rope.pick] if t.rope_bytes and full_rope.pick.size else None
    for b in range(t.batch):
        moves, status[b], seqs[b], _ = plan(ins["selection_topk_indices"][b], status[b],
                                            int(ins["full_kv_actual_seq"][b]))

        def sel_row(j: int, b: int = b) -> int:
            return int(sbt[b, j // t.block]) * t.block + j % t.block

        def full_row(g: int, b: int = b) -> int:
            return int(fbt[b, g // t.block]) * t.block + g % t.block

        if kv_rows is not None:
            gather(sel_kv, kv_rows, moves, sel_row, full_row)
        if rope_rows is not None:
            gather(sel_rope, rope_rows, moves, sel_row, full_row)
    return {"selection_kv_cache": sel_kv, "selection_k_rope": sel_rope,
            "selection_kv_block_status": status, "selection_kv_actual_seq": seqs}


FAMILY = KvOffload()
