"""GatherSelectionKvCache's kernel for one card, step by step (hicann/cann-recipes-infer
ops/ascendc/src/gather_selection_kv_cache, op_kernel gather_selection_kv_cache_split_bs_
reuse_vec.h: the topk > 32 variant DeepSeek-V3.2 runs, topk block size 1).

AIV only; the B * S sequences are split over the cores (tiling DoOpTiling), core c taking
sequences c, c + cores, ... Per sequence:

1. CopyIn: the topk row, the status row (TOPK + 1), the selection and full block-table rows
   (MTE2 from GM), the two sequence lengths (scalar loads).
2. GatherValidTopk, SortTopk (ascending) and the status sorted likewise, then FindTopkHit
   (two pointers over the sorted lists): the sorts as vector work of ceil(log2 n) passes
   over the n int32 values, the two-pointer walk as scalar work, one slot per element.
3. Per written slot in topk order: a miss looks its token's block up in the full block
   table (in UB) and copies the kv row and the rope row full cache -> UB (DataCopyPad on
   MTE2: from host memory when the cache is there) -> selection cache (MTE3); a hit moved
   down copies selection -> UB -> selection (CopyFromSelKv). Two UB buffer sets, ping-pong.
4. The status row and the sequence's valid count back to GM.

The tail swap (PostHandleTopk) only runs for topk blocks of more than one token, so not
here. Which slot a row goes to, and the counts, come from reference.plan (the golden's
rule), which the program also follows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.kv_offload.reference import Move, plan
from npusim.kernels.kv_offload.tiling import KvTiling
from npusim.runtime import hostmem

I32 = 4


def _load(ctx: Any, t: KvTiling, name: str, b: int, count: int, buf: Any) -> Any:
    return ctx.copy_in(buf, ctx.tensor(name), b * count * I32, count * I32, name=f"copy_in {name}")


def gather_program(t: KvTiling) -> Callable[[Any], Any]:
    passes = max(1, math.ceil(math.log2(max(2, t.topk))))

    def program(ctx: Any) -> Any:
        batches = t.batches_of(ctx.core_id)
        if not batches:
            return
        full_kv, full_rope = ctx.tensor("full_kv_cache"), ctx.tensor("full_k_rope")
        if t.location == "host":
            full_kv = hostmem.host_tensor(ctx, "full_kv_cache")
            full_rope = hostmem.host_tensor(ctx, "full_k_rope")
        sel_kv, sel_rope = ctx.tensor("selection_kv_cache"), ctx.tensor("selection_k_rope")
        _carry_in(ctx, t, batches)
        topk_buf = ctx.alloc("topk", t.topk * I32)
        status_buf = ctx.alloc("status", (t.topk + 1) * I32)
        sorted_buf = ctx.alloc("sorted", 2 * t.topk * I32)
        sbt_buf = ctx.alloc("sel_table", t.s_max * I32)
        fbt_buf = ctx.alloc("full_table", t.f_max * I32)
        rows = [(ctx.alloc(f"kv{p}", t.kv_bytes),
                 ctx.alloc(f"rope{p}", t.rope_bytes) if t.rope_bytes else None) for p in (0, 1)]
        last: list[list[Any]] = [[], []]
        for b in batches:
            with ctx.phase("copy_in"):
                loads = [_load(ctx, t, "selection_topk_indices", b, t.topk, topk_buf),
                         _load(ctx, t, "selection_kv_block_status", b, t.topk + 1, status_buf),
                         _load(ctx, t, "selection_kv_block_table", b, t.s_max, sbt_buf),
                         _load(ctx, t, "full_kv_block_table", b, t.f_max, fbt_buf)]
                kv_len = int(ctx.gm_read_scalar(ctx.tensor("full_kv_actual_seq"), b * I32,
                                                np.int32))
                ctx.gm_read_scalar(ctx.tensor("full_q_actual_seq"), b * I32, np.int32)
                yield from ctx.wait(*loads)
            with ctx.phase("find_hits"):
                ctx.vector("sort_topk", t.topk, np.int32, reads=[topk_buf], writes=[sorted_buf],
                           passes=passes)
                ctx.vector("sort_status", t.topk, np.int32, reads=[status_buf],
                           writes=[sorted_buf], passes=passes)
                yield from ctx.pipe_barrier("vector")
                topk = ctx.ub_read(topk_buf, np.int32, t.topk, ops=0)
                status = ctx.ub_read(status_buf, np.int32, t.topk + 1, ops=0)
                sbt = ctx.ub_read(sbt_buf, np.int32, t.s_max, ops=0)
                fbt = ctx.ub_read(fbt_buf, np.int32, t.f_max, ops=0)
                moves, new_status, valid, _ = plan(topk, status, kv_len)
                ctx.scalar(2 * t.topk)  # FindTopkHit's two pointers over both sorted lists
            with ctx.phase("gather"):
                for i, m in enumerate(moves):
                    p = i % 2
                    yield from ctx.wait(*last[p])  # the buffer's previous rows have left
                    last[p] = yield from _row(ctx, t, m, rows[p], sbt, fbt, full_kv,
                                              full_rope, sel_kv, sel_rope)
            with ctx.phase("write_back"):
                ctx.ub_write(status_buf, 0, new_status.astype(np.int32), ops=valid + 1)
                yield from ctx.wait(ctx.copy_out(ctx.tensor("selection_kv_block_status"),
                                                 b * (t.topk + 1) * I32, status_buf,
                                                 (t.topk + 1) * I32))
                ctx.gm_write_scalar(ctx.tensor("selection_kv_actual_seq"), b * I32, valid,
                                    np.int32)
        yield from ctx.drain()
    return program


def _row(ctx: Any, t: KvTiling, m: Move, bufs: tuple[Any, Any], sbt: np.ndarray,
         fbt: np.ndarray, full_kv: Any, full_rope: Any, sel_kv: Any, sel_rope: Any) -> Any:
    """One slot's kv and rope rows into place; returns the copy-outs in flight."""
    ctx.scalar(2)  # the block-table lookups (in UB)
    dst = int(sbt[m.slot // t.block]) * t.block + m.slot % t.block
    parts = [(bufs[0], t.kv_bytes, full_kv, sel_kv), (bufs[1], t.rope_bytes, full_rope, sel_rope)]
    if m.from_slot >= 0:
        yield from ctx.pipe_barrier("mte3")  # CopyFromSelKv reads what earlier rows wrote
        src = int(sbt[m.from_slot // t.block]) * t.block + m.from_slot % t.block
        loads = [ctx.copy_in(buf, sel, src * n, n, name="CopyFromSelKv")
                 for buf, n, _, sel in parts if n]
    else:
        blk = int(fbt[m.token // t.block])
        if not 0 <= blk < t.f_blocks:
            raise ctx.error(f"full_kv_block_table entry {blk} for token {m.token} is past the "
                            f"cache's {t.f_blocks} blocks")
        src = blk * t.block + m.token % t.block
        loads = [_read(ctx, t, buf, full, src * n, n) for buf, n, full, _ in parts if n]
    yield from ctx.wait(*loads)
    return [ctx.copy_out(sel, dst * n, buf, n, name="copy_out selection")
            for buf, n, _, sel in parts if n]


def _read(ctx: Any, t: KvTiling, buf: Any, full: Any, offset: int, n: int) -> Any:
    """CopyFromFullKv's DataCopyPad of one row from the full cache (HBM or host)."""
    if t.location == "host":
        return hostmem.copy_in_host(ctx, buf, full, offset, n, name="CopyFromFullKv")
    return ctx.copy_in(buf, full, offset, n, name="CopyFromFullKv")


def _carry_in(ctx: Any, t: KvTiling, batches: range) -> None:
    """The in-place tensors start as the previous decode step left them: this core's
    sequences' selection rows and status, written before the launch (untimed)."""
    rows = t.s_max * t.block
    for name, n in (("selection_kv_cache", t.kv_bytes), ("selection_k_rope", t.rope_bytes),
                    ("selection_kv_block_status", (t.topk + 1) * I32)):
        if not n:
            continue
        span = n if name.endswith("status") else rows * n
        dst, src = ctx.tensor(name), ctx.tensor(f"{name}_prev")
        for b in batches:
            at = b * span
            dst.write(at, src.read(at, span))
