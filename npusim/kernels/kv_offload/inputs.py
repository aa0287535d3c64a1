"""One decode step's inputs: a full cache per sequence, the previous step's selection (status
and rows), and this step's topk with a given share already selected last step."""

from __future__ import annotations

import numpy as np

from npusim.hw.memory import RowTable
from npusim.kernels.kv_offload.tiling import KvTiling

DISTINCT = 8192  # distinct random rows the full cache is drawn from (shared rows)


def _full(rng: np.random.Generator, rows: int, row_bytes: int, payload: bool) -> RowTable:
    """The full cache [F_BLOCK_NUM * BLOCK rows]: random rows, each drawn from DISTINCT ones
    (so a 128K-token cache costs its index, not its bytes); zeros when timing only."""
    if not payload or row_bytes == 0:
        return RowTable.zeros(rows, row_bytes)
    table = rng.integers(0, 256, (min(rows, DISTINCT), row_bytes), dtype=np.uint8)
    return RowTable(table, rng.integers(0, table.shape[0], rows), rows)


def step_inputs(t: KvTiling, seed: int, payload: bool) -> dict[str, object]:
    """Every input tensor of the call (plain arrays and RowTables)."""
    rng = np.random.default_rng(seed)
    rows = t.f_blocks * t.block
    full_kv = _full(rng, rows, t.kv_bytes, payload)
    full_rope = _full(rng, rows, t.rope_bytes, payload)
    # each sequence's blocks, scattered over the cache (a paged allocator's table)
    order = rng.permutation(t.batch * t.f_max).astype(np.int32)
    fbt = order.reshape(t.batch, t.f_max)
    sbt = np.arange(t.s_blocks, dtype=np.int32).reshape(t.batch, t.s_max)
    status = np.full((t.batch, t.topk + 1), -1, np.int32)
    topk = np.empty((t.batch, t.topk), np.int32)
    keep = int(round(t.reuse * t.topk))
    for b in range(t.batch):
        prev = rng.choice(t.seq_len, t.topk, replace=False).astype(np.int32)
        status[b, :t.topk] = prev
        status[b, t.topk] = t.topk
        fresh = np.setdiff1d(np.arange(t.seq_len, dtype=np.int32), prev, assume_unique=True)
        new = np.concatenate([rng.choice(prev, keep, replace=False),
                              rng.choice(fresh, t.topk - keep, replace=False)])
        topk[b] = rng.permutation(new)  # the indexer's topk is unsorted
    sel_rows = t.s_blocks * t.block
    sel_kv = np.zeros((sel_rows, t.kv_bytes), np.uint8)
    sel_rope = np.zeros((sel_rows, t.rope_bytes), np.uint8)
    if payload:  # the previous step left the rows its status names
        for b in range(t.batch):
            j = np.arange(t.topk)
            g = status[b, :t.topk]
            dst = sbt[b, j // t.block] * t.block + j % t.block
            src = fbt[b, g // t.block] * t.block + g % t.block
            sel_kv[dst] = full_kv.table[full_kv.pick[src]]
            if t.rope_bytes:
                sel_rope[dst] = full_rope.table[full_rope.pick[src]]
    return {"full_kv_cache": full_kv, "full_k_rope": full_rope, "full_kv_block_table": fbt,
            "selection_kv_block_table": sbt, "selection_kv_block_status_prev": status,
            "selection_topk_indices": topk, "selection_kv_cache_prev": sel_kv.reshape(-1),
            "selection_k_rope_prev": sel_rope.reshape(-1),
            "full_kv_actual_seq": np.full(t.batch, t.seq_len, np.int32),
            "full_q_actual_seq": np.ones(t.batch, np.int32)}
