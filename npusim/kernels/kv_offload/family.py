"""Family ``kv_offload``: GatherSelectionKvCache (hicann/cann-recipes-infer) at a decode step,
with DeepSeek-V3.2's full MLA cache in device HBM or in host memory (`memory`: SHMEM's
HOST_SIDE heap in the article, mapped in huge pages; torch_npu's swapped memory in the
public model code, pinned in the OS's base pages: both host DRAM reached over the NPU ->
host path npusim.hw.host models, the second with many more pages for the die's SMMU to
translate), and prefill's per-layer offload of the cache into host memory.

Op `gather`: one layer's call on one card for its B sequences of S = 1 + next_n queries;
the report gives the bytes gathered from the full cache, the reuse rate, the gather time,
the effective GB/s, the same per decode step (x layers), its share of DeepSeek-V3.2's
published TPOT band, the host pages the die's SMMU walked, and the card's KV footprint
with and without offload. Op `offload`: one prefill layer's copy of the layer's cache into
host memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.hw.host import capacity_problem
from npusim.kernels.family import Misfit, Option, Variant
from npusim.kernels.kernel import Arrays, Call, Phase, TensorSpec, const
from npusim.kernels.kv_offload.inputs import full_rows, step_inputs
from npusim.kernels.kv_offload.offload import offload_program
from npusim.kernels.kv_offload.program import gather_program
from npusim.kernels.kv_offload.reference import gather, plan
from npusim.kernels.kv_offload.tiling import KvTiling
from npusim.kernels.vector_sample import TaskKernel, Unwindowed

U8, I32 = const(np.uint8), const(np.int32)
# DeepSeek-V3.2-Exp's published TPOT without offload on 64 Atlas A3 chips, W8A8C8, MTP3
# (docs/models/deepseek_v3_2_exp/deepseek_v3.2_exp_inference_guide.md, Benchmark, the
# W8A8C8 table): 18.85 ms (global batch 128, 128K) to 25.8 ms (global batch 512, 128K);
# the 64K rows are 19.84 ms (batch 256) and 22.78 ms (batch 512)
TPOT_LOW_MS = 18.85
TPOT_HIGH_MS = 25.8
# what the host pages cost (npusim.hw.host): the keys the memory option's answer rests on
PAGE_KEYS = ("host.page_bytes", "host.huge_page_bytes", "host.tlb_entries",
             "host.page_walk_ns", "host.walkers", "host.latency_ns")
TOPK_SPLIT_NUM = 32  # the tiling's split: topk up to 32 runs the other kernel variant
MAX_Q_SEQ_LEN = 8  # the tiling refuses S >= 8


def _rows(n: str) -> Any:
    def shape(t: KvTiling, r: int) -> tuple[int, ...]:
        rows = t.f_blocks * t.block if n.startswith(("full", "layer")) else t.s_blocks * t.block
        width = t.rope_bytes if n.endswith("rope") else t.kv_bytes
        return (rows, width)
    return shape


def _flat(n: str) -> Any:
    rows = _rows(n)
    return lambda t, r: (int(np.prod(rows(t, r))),)


def _full_specs(what: str, shared: bool) -> tuple[TensorSpec, TensorSpec]:
    return (TensorSpec("full_kv_cache", U8, _rows("full_kv"), "[F_BLOCK_NUM * BLOCK, kv "
                       f"bytes] {what} (bf16 as bytes, or the c8 row)", shared_rows=shared),
            TensorSpec("full_k_rope", U8, _rows("full_rope"), "[F_BLOCK_NUM * BLOCK, rope "
                       "bytes] (empty for c8)", shared_rows=shared))


INPUTS = (
    *_full_specs("the latent rows", True),
    TensorSpec("full_kv_block_table", I32, lambda t, r: (t.batch, t.f_max), "[B, F_MAX]"),
    TensorSpec("selection_kv_block_table", I32, lambda t, r: (t.rows, t.s_max),
               "[B * S, S_MAX]"),
    TensorSpec("selection_kv_block_status_prev", I32, lambda t, r: (t.rows, t.topk + 1),
               "[B * S, TOPK + 1] the status the previous step left"),
    TensorSpec("selection_topk_indices", I32, lambda t, r: (t.rows, t.topk),
               "[B * S, TOPK] this step's topk (unsorted)"),
    TensorSpec("selection_kv_cache_prev", U8, _flat("sel_kv"), "the rows the previous step left"),
    TensorSpec("selection_k_rope_prev", U8, _flat("sel_rope"), "(empty for c8)"),
    TensorSpec("full_kv_actual_seq", I32, lambda t, r: (t.batch,), "[B]"),
    TensorSpec("full_q_actual_seq", I32, lambda t, r: (t.batch,),
               "[B] the cumulative query counts (TND; the vec kernel does not read it)"),
)
OUTPUTS = (
    TensorSpec("selection_kv_cache", U8, _rows("sel_kv"), "[S_BLOCK_NUM * BLOCK, kv bytes]"),
    TensorSpec("selection_k_rope", U8, _rows("sel_rope"), "[S_BLOCK_NUM * BLOCK, rope bytes]"),
    TensorSpec("selection_kv_block_status", I32, lambda t, r: (t.rows, t.topk + 1),
               "[B * S, TOPK + 1] the slots' token ids, -1 past the count, the count last"),
    TensorSpec("selection_kv_actual_seq", I32, lambda t, r: (t.rows,), "[B * S] valid tokens"),
)


def footprint(t: KvTiling) -> dict[str, Any]:
    """The card's KV bytes for its B sequences of seq_len tokens over all layers: without
    offload every row and the indexer keys on the device; with it the full rows in host
    memory and, on the device, the indexer keys and one selection pool of TOPK rows per
    query row and layer (offload_cache.py: B * S rows)."""
    rows = t.batch * t.seq_len * t.layers
    key = t.indexer_key_bytes
    device_full = rows * (t.row_bytes + key)
    device_offload = rows * key + t.rows * t.topk * t.layers * t.row_bytes
    return {"kv_bytes_per_card_no_offload": device_full,
            "kv_bytes_per_card_offload": device_offload,
            "host_bytes_per_card_offload": rows * t.row_bytes,
            "row_bytes": t.row_bytes, "indexer_key_bytes": key}


def step_share(step_us: float) -> dict[str, Any]:
    """A decode step's gathers as a share of the published TPOT band's two ends."""
    ms = step_us / 1000.0
    return {"step_tpot_ms": [TPOT_LOW_MS, TPOT_HIGH_MS],
            "step_share": [ms / TPOT_LOW_MS, ms / TPOT_HIGH_MS]}


def _moved(run: Any, prefix: str) -> tuple[int, int]:
    """(transfers, bytes) of the run's transfers whose name starts with `prefix`."""
    count = nbytes = 0
    for row in run.core_transfers:
        for transfers in row:
            for x in transfers:
                if x.name.startswith(prefix):
                    count += x.count
                    nbytes += x.bytes
    return count, nbytes


class Gather(TaskKernel):
    name = "gather"
    phases = (Phase("copy_in", "every core, per query row: topk, status and selection "
                    "block-table rows"),
              Phase("find_hits", "sort topk and status (vector), two-pointer hit search"),
              Phase("gather", "per written slot: the block number (scalar GM load), kv and "
                    "rope rows full (or selection) -> UB -> selection pool, two buffers"),
              Phase("write_back", "valid count and status row to GM"))
    inputs = INPUTS
    outputs = OUTPUTS

    def program(self, tiling: KvTiling) -> Any:
        return gather_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        t, run = call.tiling, call.run
        rows, nbytes = _moved(run, "CopyFromFullKv")
        rows //= 2 if t.rope_bytes else 1
        valid = t.rows * t.topk
        span = run.end_ns - run.start_ns - t.launch_ns
        step_us = span * t.layers / 1000.0
        return {"kv_location": t.location, "memory": t.memory, "host_page_bytes": t.page_bytes,
                "queries": t.queries,
                "query_rows": t.rows, "cores_used": t.cores, "rows_gathered": rows,
                "bytes_gathered": nbytes, "reuse_rate": 1 - rows / valid if valid else 0.0,
                "gather_us": span / 1000.0, "effective_gbps": nbytes / span if span else 0.0,
                "per_step_us": step_us, "per_step_bytes": nbytes * t.layers,
                "translation_misses": sum(run.translation_misses),
                **step_share(step_us), **footprint(t)}


class Offload(TaskKernel):
    name = "offload"
    phases = (Phase("offload", "the host thread: the layer's cache (kv, then rope) as "
                    "aclrtMemcpyAsync on the d2h stream into host memory, then "
                    "aclrtSynchronizeStream"),)
    inputs = (TensorSpec("layer_kv_cache", U8, _rows("layer_kv"), "[F_BLOCK_NUM * BLOCK, kv "
                         "bytes] the layer's device-side temp cache", shared_rows=True),
              TensorSpec("layer_k_rope", U8, _rows("layer_rope"), "(empty for c8)",
                         shared_rows=True))
    outputs = _full_specs("the layer's full cache in host memory", False)
    engines = ("sdma",)

    def program(self, tiling: KvTiling) -> Any:
        return offload_program(tiling)

    def cores(self, tiling: KvTiling) -> int:
        return 1

    def fields(self, call: Call) -> dict[str, Any]:
        t, run = call.tiling, call.run
        _, nbytes = _moved(run, "copy_ D2H")
        span = run.end_ns - run.start_ns - t.launch_ns
        return {"memory": t.memory, "host_page_bytes": t.page_bytes, "bytes_offloaded": nbytes,
                "offload_us": span / 1000.0,
                "offload_gbps": nbytes / span if span else 0.0,
                "per_prefill_us": span * t.layers / 1000.0,
                "per_prefill_bytes": nbytes * t.layers,
                "translation_misses": sum(run.translation_misses)}


class KvOffload(Unwindowed):
    name = "kv_offload"
    uses_moe_shape = False
    help = ("GatherSelectionKvCache at a DeepSeek-V3.2 decode step: the indexer's topk rows "
            "gathered from the full MLA cache (HBM or host memory) into the device-side "
            "selection pool, reusing the rows the previous step left there; and prefill's "
            "per-layer offload of the cache into host memory")
    ops = (Gather(), Offload())
    references = True  # reference_outputs
    # `npusim advise SHAPE` compares the two host allocations at a shape of this family;
    # they differ only in the pages the die's SMMU translates
    variants = tuple(Variant(m, {"memory": m}, PAGE_KEYS) for m in ("shmem_host", "swapped"))
    dispatch_quants = combine_quants = {"none": {}}  # nothing is quantised in transit
    runs = {"gather": ("gather",), "offload": ("offload",)}
    options = (
        Option("batch", "int", 16, "B: sequences on the card (die)", lo=1, hi=1024),
        Option("seq_len", "int", 65536, "tokens of every sequence's full cache", lo=1,
               hi=1 << 20),
        Option("topk", "int", 2048, "TOPK (DeepSeek-V3.2 index_topk 2048; the vec kernel "
               "runs 33 to 2048)", lo=1, hi=2048),
        Option("next_n", "int", 0, "MTP depth: S = 1 + next_n queries per sequence per "
               "step (the benchmark's MTP3: 3)", lo=0, hi=MAX_Q_SEQ_LEN - 2),
        Option("block", "int", 128, "BLOCK_SIZE tokens per cache block", lo=1, hi=1024),
        Option("c8", "bool", False, "the int8 cache: 656 B rows and no rope tensor"),
        Option("kv_location", "choice", "host", "where the full cache lives",
               choices=("host", "hbm")),
        Option("memory", "choice", "shmem_host", "how the host cache was allocated: SHMEM's "
               "HOST_SIDE heap (the article: huge pages, host.huge_page_bytes) or "
               "torch_npu's swapped memory (the model code: pinned base pages, "
               "host.page_bytes); the die's SMMU walks the pages it does not hold",
               choices=("shmem_host", "swapped")),
        Option("reuse", "float", 0.6, "share of this step's topk the selection pool holds "
               "from the previous step (the guide's 60%)", lo=0.0, hi=1.0),
        Option("cache_blocks", "int", 0, "F_BLOCK_NUM of the full cache (0: exactly B * "
               "ceil(seq_len / block))", lo=0, hi=1 << 30),
        Option("layers", "int", 61, "calls per decode step or prefill (DeepSeek-V3.2: 61 "
               "layers)", lo=1, hi=1024),
    )

    def tiling(self, shape: None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> KvTiling:
        o = options
        return KvTiling(o["batch"], o["seq_len"], o["topk"], o["block"], o["c8"],
                        o["kv_location"], o["reuse"], o["cache_blocks"], o["layers"],
                        hardware.chip.aiv_cores, hardware.kernel.task_launch_ns,
                        queries=1 + o["next_n"], memory=o["memory"],
                        page_bytes=_page_bytes(hardware, o["memory"]))

    def tiling_misfit(self, tiling: KvTiling, shape: None, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        t = tiling
        if t.cache_blocks and t.cache_blocks < t.batch * t.f_max:
            return Misfit("workload.cache_blocks", f"{t.cache_blocks}: the block table of "
                          f"{t.batch} sequences of {t.f_max} blocks points past the cache; "
                          f"allowed: 0 or at least {t.batch * t.f_max}")
        problem = (_gather_misfit(t, hardware) if op == "gather"
                   else _offload_misfit(t, hardware))
        if problem is None and t.location == "host":
            problem = _host_misfit(t, hardware)
        return problem

    def make_inputs(self, shape: None, options: Mapping[str, Any], op: str,
                    routing: Any, payload: bool) -> list[Arrays]:
        return [{"seed": np.array([routing.get("seed", 0)]),
                 "payload": np.array([payload])}]

    def op_inputs(self, kernel: str, tiling: KvTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        seed, payload = int(inputs[0]["seed"][0]), bool(inputs[0]["payload"][0])
        if kernel == "offload":
            return [layer_inputs(tiling, seed, payload)]  # type: ignore[list-item]
        return [step_inputs(tiling, seed, payload)]  # type: ignore[list-item]

    def reference_outputs(self, kernel: str, tiling: KvTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        if kernel != "gather":
            return None
        return [reference(tiling, self.op_inputs(kernel, tiling, inputs, None)[0])]


def _page_bytes(hardware: Any, memory: str) -> int:
    """The host cache's page: SHMEM's huge page, or the OS's base page (swapped memory)."""
    host = hardware.host
    if host is None:
        return 0
    return host.huge_page_bytes if memory == "shmem_host" else host.page_bytes


def _gather_misfit(t: KvTiling, hardware: Any) -> Misfit | None:
    """The vec kernel's limits (the tiling's checks) and the inputs' needs."""
    if t.topk <= TOPK_SPLIT_NUM:
        return Misfit("workload.topk", f"{t.topk}: a topk of at most {TOPK_SPLIT_NUM} runs "
                      "the operator's other kernel variant (split_bs_reuse), not modelled; "
                      f"allowed: {TOPK_SPLIT_NUM + 1} to 2048")
    if t.topk > t.seq_len - t.queries:
        return Misfit("workload.topk", f"{t.topk} is above the {t.seq_len - t.queries} tokens "
                      f"before this step's {t.queries} queries: the previous step's selection "
                      f"holds topk distinct tokens of them; allowed: at most "
                      f"{max(t.seq_len - t.queries, 0)}")
    ub = t.ub_bytes()
    if ub > hardware.ub.bytes:
        return Misfit("workload.topk", f"{t.topk}: the kernel's UB buffers need {ub} B, more "
                      f"than {hardware.ub.bytes}")
    return None


def _offload_misfit(t: KvTiling, hardware: Any) -> Misfit | None:
    if t.location != "host":
        return Misfit("workload.kv_location", f"{t.location}: op offload copies the layer's "
                      "cache into host memory; allowed: host")
    return None if hardware.sdma is not None else Misfit(
        "hardware", f"{hardware.name} has no SDMA engine (no sdma section), which op "
        "offload's copy runs on")


def _host_misfit(t: KvTiling, hardware: Any) -> Misfit | None:
    if hardware.host is None:
        return Misfit("hardware", f"{hardware.name} has no host memory (no host section); "
                      "allowed: kv_location hbm, or atlas_a3 / ascend950")
    full = t.f_blocks * t.block * t.row_bytes
    problem = capacity_problem(hardware, 1, full)
    if problem:
        return Misfit("workload.seq_len", f"a full cache of {full} B in host memory: "
                      f"{problem}")
    return None


def layer_inputs(t: KvTiling, seed: int, payload: bool) -> dict[str, object]:
    """One prefill layer's device-side cache (random rows; zeros when timing only)."""
    rng = np.random.default_rng(seed)
    rows = t.f_blocks * t.block
    return {"layer_kv_cache": full_rows(rng, rows, t.kv_bytes, payload),
            "layer_k_rope": full_rows(rng, rows, t.rope_bytes, payload)}


def reference(t: KvTiling, ins: Mapping[str, Any]) -> Arrays:
    """The step's outputs in numpy from its inputs (reference.plan per query row)."""
    full_kv = ins["full_kv_cache"]
    full_rope = ins["full_k_rope"]
    sel_kv = np.array(ins["selection_kv_cache_prev"]).reshape(-1, t.kv_bytes)
    sel_rope = np.array(ins["selection_k_rope_prev"]).reshape(-1, t.rope_bytes)
    fbt, sbt = ins["full_kv_block_table"], ins["selection_kv_block_table"]
    status = np.array(ins["selection_kv_block_status_prev"])
    seqs = np.zeros(t.rows, np.int32)
    kv_rows = full_kv.table[full_kv.pick] if full_kv.pick.size else None
    rope_rows = full_rope.table[full_rope.pick] if t.rope_bytes and full_rope.pick.size else None
    for r in range(t.rows):
        b, q = divmod(r, t.queries)
        visible = int(ins["full_kv_actual_seq"][b]) - (t.queries - 1 - q)
        moves, status[r], seqs[r], _ = plan(ins["selection_topk_indices"][r], status[r],
                                            visible, q)

        def sel_row(j: int, r: int = r) -> int:
            return int(sbt[r, j // t.block]) * t.block + j % t.block

        def full_row(g: int, b: int = b) -> int:
            return int(fbt[b, g // t.block]) * t.block + g % t.block

        if kv_rows is not None:
            gather(sel_kv, kv_rows, moves, sel_row, full_row)
        if rope_rows is not None:
            gather(sel_rope, rope_rows, moves, sel_row, full_row)
    return {"selection_kv_cache": sel_kv, "selection_k_rope": sel_rope,
            "selection_kv_block_status": status, "selection_kv_actual_seq": seqs}


FAMILY = KvOffload()
