"""GatherSelectionKvCache's kernel for one card, step by step (hicann/cann-recipes-infer
ops/ascendc/src/gather_selection_kv_cache, op_kernel gather_selection_kv_cache_split_bs_
reuse_vec.h: the topk > 32 variant DeepSeek-V3.2 runs, topk block size 1).

AIV only; the B * S query rows (S = 1 + next_n queries per sequence) are split over the
cores in contiguous runs (tiling DoOpTiling, KvTiling.rows_of). Per row r (sequence
b = r // S, query q = r % S):

1. The sequence's length, a scalar GM load (fullKvActualSeqGm_.GetValue); CopyIn: the
   topk row (waited: DeQue), then, once the previous row's stores have left (the
   MTE3_MTE2 flag), the row's status (TOPK + 1) and selection block-table row (MTE2).
2. GatherValidTopk, SortTopk (descending) and the status sorted likewise, then FindTopkHit
   (two pointers over the sorted lists): the sorts as vector work of ceil(log2 n) passes
   over the n int32 values, the walk and the slot bookkeeping as scalar work.
3. Per written slot in topk order: a miss reads its token's block number from the full
   block table in GM with a scalar load (fullKvBlockTableGm_.GetValue, through the data
   cache: a line fill on a miss) and copies the kv row and the rope row full cache -> UB
   (DataCopyPad on MTE2: from host memory when the cache is there) -> selection pool
   (MTE3); a hit moved down copies selection -> UB -> selection (CopyFromSelKv). Two UB
   buffer sets, ping-pong (AllocTensor waits for the set's previous stores).
4. The valid count and the status row back to GM (MTE3, waited by the next row's flag).

Which slot a row goes to, and the counts, come from reference.plan (the kernel's rules),
which the program also follows. PostHandleTopk returns at once for a topk block of one
token, so it has no step here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.kv_offload.reference import Move, plan
from npusim.kernels.kv_offload.tiling import (
    I32,
    SORT_ALIGN,
    TOPK_NUMS,
    UB_BLOCK,
    KvTiling,
)
from npusim.runtime import hostmem
from npusim.units import align_up


def _load(ctx: Any, name: str, row: int, count: int, buf: Any) -> Any:
    return ctx.copy_in(buf, ctx.tensor(name), row * count * I32, count * I32,
                       name=f"copy_in {name}")


def _full(ctx: Any, t: KvTiling) -> tuple[Any, Any]:
    """The full cache's two tensors: device GM, or host memory mapped into the device (in
    huge pages or base pages, as `memory` allocated it)."""
    if t.location == "host":
        return (hostmem.host_tensor(ctx, "full_kv_cache", huge_pages=t.huge_pages),
                hostmem.host_tensor(ctx, "full_k_rope", huge_pages=t.huge_pages))
    return ctx.tensor("full_kv_cache"), ctx.tensor("full_k_rope")


def _buffers(ctx: Any, t: KvTiling) -> dict[str, Any]:
    """Init's UB: sized for S rows of a sequence as the kernel sizes them (one row used)."""
    sort_align = align_up(t.topk, SORT_ALIGN)
    one_align = max(sort_align, align_up(t.topk + 1, UB_BLOCK // I32))
    s = t.queries
    bufs = {"topk": ctx.alloc("topk", s * sort_align * I32),
            "sel_table": ctx.alloc("sel_table", align_up(s * t.s_max * I32, UB_BLOCK)),
            "sel_seq": ctx.alloc("sel_seq", align_up(s * I32, UB_BLOCK)),
            "status": ctx.alloc("status", s * one_align * I32),
            "sorted": ctx.alloc("sorted", sort_align * I32 * TOPK_NUMS)}
    bufs["rows"] = [(ctx.alloc(f"kv{p}", align_up(t.kv_bytes, UB_BLOCK)),
                     ctx.alloc(f"rope{p}", align_up(t.rope_bytes, UB_BLOCK))
                     if t.rope_bytes else None) for p in (0, 1)]
    return bufs


def gather_program(t: KvTiling) -> Callable[[Any], Any]:
    passes = max(1, math.ceil(math.log2(max(2, t.topk))))

    def program(ctx: Any) -> Any:
        rows = t.rows_of(ctx.core_id)
        if not rows:
            return
        full = _full(ctx, t)
        sel = ctx.tensor("selection_kv_cache"), ctx.tensor("selection_k_rope")
        _carry_in(ctx, t, rows)
        bufs = _buffers(ctx, t)
        last: list[list[Any]] = [[], []]
        pending: list[Any] = []
        for r in rows:
            b, q = divmod(r, t.queries)
            kv_len = int(ctx.gm_read_scalar(ctx.tensor("full_kv_actual_seq"), b * I32,
                                            np.int32))
            with ctx.phase("copy_in"):
                yield from ctx.wait(_load(ctx, "selection_topk_indices", r, t.topk,
                                          bufs["topk"]))
                yield from ctx.wait(*pending, *last[0], *last[1])  # MTE3_MTE2
                yield from ctx.wait(
                    _load(ctx, "selection_kv_block_status", r, t.topk + 1, bufs["status"]),
                    _load(ctx, "selection_kv_block_table", r, t.s_max, bufs["sel_table"]))
            with ctx.phase("find_hits"):
                moves, status, valid = yield from _find_hits(ctx, t, bufs, kv_len, q, passes)
                sbt = ctx.ub_read(bufs["sel_table"], np.int32, t.s_max, ops=0)
            with ctx.phase("gather"):
                for i, m in enumerate(moves):
                    p = i % 2
                    last[p] = yield from _row(ctx, t, m, bufs["rows"][p], last[p], sbt, b, q,
                                              full, sel)
            with ctx.phase("write_back"):
                pending = _write_back(ctx, t, bufs, r, status, valid)
        yield from ctx.drain()
    return program


def _find_hits(ctx: Any, t: KvTiling, bufs: dict[str, Any], kv_len: int, q: int,
               passes: int) -> Any:
    """GatherInfoGen: the sorts (vector), the walk and the slot bookkeeping (scalar);
    returns (moves, new status row, valid count)."""
    ctx.vector("sort_topk", t.topk, np.int32, reads=[bufs["topk"]], writes=[bufs["sorted"]],
               passes=passes)
    ctx.vector("sort_status", t.topk, np.int32, reads=[bufs["status"]],
               writes=[bufs["sorted"]], passes=passes)
    yield from ctx.pipe_barrier("vector")
    topk = ctx.ub_read(bufs["topk"], np.int32, t.topk, ops=0)
    status = ctx.ub_read(bufs["status"], np.int32, t.topk + 1, ops=0)
    moves, new_status, valid, _ = plan(topk, status, kv_len - (t.queries - 1 - q), q)
    # FindTopkHit's two pointers over both sorted lists; per valid id its two UB loads
    # (the id, its hit flag); per written slot the free-slot scan, the selection table
    # lookup and the status store
    scans = moves[-1].slot + 1 if moves else 0
    ctx.scalar(2 * t.topk + 2 * valid + scans + 2 * len(moves))
    return moves, new_status, valid


def _row(ctx: Any, t: KvTiling, m: Move, bufs: tuple[Any, Any], previous: list[Any],
         sbt: np.ndarray, b: int, q: int, full: tuple[Any, Any], sel: tuple[Any, Any]) -> Any:
    """One slot's kv and rope rows into place; returns the stores in flight."""
    dst = int(sbt[m.slot // t.block]) * t.block + m.slot % t.block
    widths = (t.kv_bytes, t.rope_bytes)
    if m.from_slot >= 0:
        if q:
            raise ctx.error(f"CopyFromSelKv for query {q} of a sequence: the kernel looks "
                            f"the source slot up in row {q} of its UB selection block table, "
                            "where only this row's table was copied in (row 0); the source "
                            "it reads is undefined")
        src = int(sbt[m.from_slot // t.block]) * t.block + m.from_slot % t.block
        yield from ctx.wait(*previous)  # AllocTensor
        yield from ctx.pipe_barrier("mte3")  # reads what earlier rows wrote
        loads = [ctx.copy_in(buf, s, src * n, n, name="CopyFromSelKv")
                 for buf, n, s in zip(bufs, widths, sel, strict=True) if n]
    else:
        blk = int(ctx.gm_read_scalar(ctx.tensor("full_kv_block_table"),
                                     (b * t.f_max + m.token // t.block) * I32, np.int32))
        if not 0 <= blk < t.f_blocks:
            raise ctx.error(f"full_kv_block_table entry {blk} for token {m.token} is past the "
                            f"cache's {t.f_blocks} blocks")
        src = blk * t.block + m.token % t.block
        yield from ctx.wait(*previous)  # AllocTensor
        loads = [_read(ctx, t, buf, f, src * n, n)
                 for buf, n, f in zip(bufs, widths, full, strict=True) if n]
    yield from ctx.wait(*loads)  # EnQue / DeQue
    return [ctx.copy_out(s, dst * n, buf, n, name="copy_out selection")
            for buf, n, s in zip(bufs, widths, sel, strict=True) if n]


def _read(ctx: Any, t: KvTiling, buf: Any, full: Any, offset: int, n: int) -> Any:
    """CopyFromFullKv's DataCopyPad of one row from the full cache (HBM or host)."""
    if t.location == "host":
        return hostmem.copy_in_host(ctx, buf, full, offset, n, name="CopyFromFullKv")
    return ctx.copy_in(buf, full, offset, n, name="CopyFromFullKv")


def _write_back(ctx: Any, t: KvTiling, bufs: dict[str, Any], r: int, status: np.ndarray,
                valid: int) -> list[Any]:
    """CopyOutSelKvBlockTableAndSeqLen: the valid count and the status row (MTE3)."""
    ctx.ub_write(bufs["status"], 0, status.astype(np.int32), ops=0)  # set as it went
    ctx.ub_write(bufs["sel_seq"], 0, np.array([valid], np.int32))
    return [ctx.copy_out(ctx.tensor("selection_kv_actual_seq"), r * I32, bufs["sel_seq"], I32),
            ctx.copy_out(ctx.tensor("selection_kv_block_status"), r * (t.topk + 1) * I32,
                         bufs["status"], (t.topk + 1) * I32)]


def _carry_in(ctx: Any, t: KvTiling, rows: range) -> None:
    """The in-place tensors start as the previous decode step left them: this core's
    rows' selection pools and status, written before the launch (untimed)."""
    span_rows = t.s_max * t.block
    for name, n in (("selection_kv_cache", t.kv_bytes), ("selection_k_rope", t.rope_bytes),
                    ("selection_kv_block_status", (t.topk + 1) * I32)):
        if not n:
            continue
        span = n if name.endswith("status") else span_rows * n
        dst, src = ctx.tensor(name), ctx.tensor(f"{name}_prev")
        for r in rows:
            at = r * span
            dst.write(at, src.read(at, span))
