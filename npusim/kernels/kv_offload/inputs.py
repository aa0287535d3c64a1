"""One decode step's inputs: a full cache per sequence, the previous step's selection per
query row (status and rows), and this step's topk per query row with a given share
already selected last step."""

from __future__ import annotations

import numpy as np

from npusim.hw.memory import RowTable
from npusim.kernels.kv_offload.tiling import KvTiling

DISTINCT = 8192  # distinct random rows the full cache is drawn from (shared rows)


def full_rows(rng: np.random.Generator, rows: int, row_bytes: int, payload: bool) -> RowTable:
    """A cache of `rows` rows: random rows, each drawn from DISTINCT ones (so a 128K-token
    cache costs its index, not its bytes); zeros when timing only."""
    if not payload or row_bytes == 0:
        return RowTable.zeros(rows, row_bytes)
    table = rng.integers(0, 256, (min(rows, DISTINCT), row_bytes), dtype=np.uint8)
    return RowTable(table, rng.integers(0, table.shape[0], rows), rows)


def _step_topk(rng: np.random.Generator, t: KvTiling, prev: np.ndarray, q: int) -> np.ndarray:
    """This step's topk of query q: `reuse` of the previous ids kept, the rest new tokens
    the query sees, shuffled (the indexer's topk is unsorted)."""
    fresh = np.setdiff1d(np.arange(t.visible(q), dtype=np.int32), prev, assume_unique=True)
    new = min(t.topk - int(round(t.reuse * t.topk)), fresh.size)
    picked = np.concatenate([rng.choice(prev, t.topk - new, replace=False),
                             rng.choice(fresh, new, replace=False)])
    return rng.permutation(picked).astype(np.int32)


def step_inputs(t: KvTiling, seed: int, payload: bool) -> dict[str, object]:
    """Every input tensor of the call (plain arrays and RowTables)."""
    rng = np.random.default_rng(seed)
    rows = t.f_blocks * t.block
    full_kv = full_rows(rng, rows, t.kv_bytes, payload)
    full_rope = full_rows(rng, rows, t.rope_bytes, payload)
    # each sequence's blocks, scattered over the cache (a paged allocator's table)
    fbt = rng.permutation(t.batch * t.f_max).astype(np.int32).reshape(t.batch, t.f_max)
    # offload_cache.py: row r's selection blocks are r * S_MAX ... (r + 1) * S_MAX - 1
    sbt = np.arange(t.s_blocks, dtype=np.int32).reshape(t.rows, t.s_max)
    status = np.full((t.rows, t.topk + 1), -1, np.int32)
    topk = np.empty((t.rows, t.topk), np.int32)
    before = t.seq_len - t.queries  # tokens before this step's queries
    for r in range(t.rows):
        prev = rng.choice(before, t.topk, replace=False).astype(np.int32)
        status[r, :t.topk] = prev
        status[r, t.topk] = t.topk
        topk[r] = _step_topk(rng, t, prev, r % t.queries)
    sel_rows = t.s_blocks * t.block
    sel_kv = np.zeros((sel_rows, t.kv_bytes), np.uint8)
    sel_rope = np.zeros((sel_rows, t.rope_bytes), np.uint8)
    if payload:  # the previous step left the rows its status names
        j = np.arange(t.topk)
        for r in range(t.rows):
            g = status[r, :t.topk]
            dst = sbt[r, j // t.block] * t.block + j % t.block
            src = fbt[r // t.queries, g // t.block] * t.block + g % t.block
            sel_kv[dst] = full_kv.table[full_kv.pick[src]]
            if t.rope_bytes:
                sel_rope[dst] = full_rope.table[full_rope.pick[src]]
    return {"full_kv_cache": full_kv, "full_k_rope": full_rope, "full_kv_block_table": fbt,
            "selection_kv_block_table": sbt, "selection_kv_block_status_prev": status,
            "selection_topk_indices": topk, "selection_kv_cache_prev": sel_kv.reshape(-1),
            "selection_k_rope_prev": sel_rope.reshape(-1),
            "full_kv_actual_seq": np.full(t.batch, t.seq_len, np.int32),
            # the model's actual_seq_qlen (TND: cumulative); the vec kernel does not read it
            "full_q_actual_seq": (np.arange(1, t.batch + 1) * t.queries).astype(np.int32)}
