"""A1, the send cores (sub-block 1 of every block; sendCoreIdx = block, GMM1K:1361-1378):
SendCoreFunc (GMM1K:989-1028).

- CalAndSendTokenCount (674-743): the experts split over the send cores; per expert the
  count of its (token, k) pairs (CalExpandxIdx over all BS * K ids, 648-672), one 32 B
  count entry (word 0 fp32 1.0, word 1 the count) put into the expert's rank's status
  area 0 at (source rank + local expert * W) * 512 B;
- SendToMoeExprt (886-987): the BS * K pairs split over the send cores; per local expert
  slot in turn (the pairs of every rank's expert 0 first), per pair: its index in the
  (source, expert) slot (CalExpandxIdx over the pairs before it, the flattened (token, k)
  order), the bf16 row in, QuantToken (745-785), the int8 row put into the slot and, after
  a PIPE_MTE3 barrier, the 512 B tail with the fp32 scale and the token flag; then the
  pairs' slot indices (expandIdx) out to GM for the combine.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from npusim.kernels.common.overlap import note_remote
from npusim.kernels.common.split import split_to_core
from npusim.kernels.moe_layer.fused_deep_moe.roles import (
    DISPATCH_STATE,
    LaunchTiling,
)
from npusim.kernels.moe_layer.fused_deep_moe.window import FLAG_AT
from npusim.kernels.moe_layer.fused_deep_moe_base.window import STATUS_ONE, TOKEN_FLAG_1
from npusim.kernels.moe_layer.reference import to_int8
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

F32, I32 = np.float32, np.int32
ENTRY_WORDS = 8  # INT32_COUNT_PER_BLOCK: one count entry


def count_before(ctx: KernelContext, ids_buf: Any, ids: np.ndarray, expert: int, n: int,
                 scratch: Any) -> tuple[int, Any]:
    """CalExpandxIdx: how many of the first n ids are `expert` (Duplicate, Sub, Abs, Mins 1,
    ReduceSum over n int32, read back by the scalar unit)."""
    op = ctx.vector_seq("cal_expandx_idx", [("duplicate", n, I32), ("sub", n, I32),
                                            ("abs", n, F32), ("mins", n, I32),
                                            ("reduce_sum", n, F32)],
                        reads=[ids_buf], writes=[scratch])
    return int(np.count_nonzero(ids[:n] == expert)), op


def dispatch_send(ctx: KernelContext, lt: LaunchTiling, core: int) -> Wait:
    t, win = lt.t, lt.window
    me, n_pairs = ctx.rank_id, t.BS * t.K
    ids_buf = ctx.alloc("expert_ids", n_pairs * 4)
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, n_pairs * 4,
                                    name="copy_expert_ids"))
    ids = ctx.ub_read(ids_buf, I32, n_pairs)
    scratch = ctx.alloc("cal_expandx_tmp", n_pairs * 4)
    yield from _send_counts(ctx, lt, core, ids_buf, ids, scratch)
    yield from ctx.drain()
    lo, hi = split_to_core(n_pairs, t.aic, core)
    if lo >= n_pairs:
        return
    counts = ctx.alloc("expert_count", max(hi - lo, 1) * 4)
    x_in = [ctx.alloc(f"x_in{i}", t.H * 2) for i in range(2)]
    y = [ctx.alloc(f"y_int8_{i}", t.record_bytes) for i in range(2)]
    tmp = ctx.alloc("x_fp32", t.H * 4)
    x = ctx.tensor("x")
    cnt = np.zeros(hi - lo, I32)
    used: list[Any] = [None, None]
    sent = 0
    for group in range(t.L):
        for i in range(lo, hi):
            e = int(ids[i])
            ctx.loop(1)  # the pair's id and group test on the scalar unit
            if e < 0 or e % t.L != group:
                continue
            b = 0 if sent & 1 else 1  # (sendValidTokenIndex & 1) ? 0 : 1
            sent += 1
            c, cal = count_before(ctx, ids_buf, ids, e, i, scratch)
            cnt[i - lo] = c
            if used[b] is not None:
                yield from ctx.wait(used[b])
            yield from ctx.wait(cal)
            ld = ctx.copy_in(x_in[b], x, (i // t.K) * t.H * 2, t.H * 2, name="copy_token")
            yield from ctx.wait(ld)
            yield from quant_token(ctx, t.H, x_in[b], tmp, y[b])
            at = win.record(e // t.L, DISPATCH_STATE, me, e % t.L, c)
            dst = e // t.L
            note_remote(ctx, ctx.put(dst, at, y[b], t.H, name="put_token"), "dispatch")
            yield from ctx.pipe_barrier("mte3")
            tail = note_remote(ctx, ctx.put(dst, at + t.H, y[b], t.record_bytes - t.H,
                                            src_offset=t.H, name="put_scale_flag"), "dispatch")
            used[b] = tail
    yield from ctx.wait(*[u for u in used if u is not None])
    ctx.ub_write(counts, 0, cnt, ops=hi - lo)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("expand_idx"), lo * 4, counts, (hi - lo) * 4,
                                     name="copy_expand_idx"))


def _send_counts(ctx: KernelContext, lt: LaunchTiling, core: int, ids_buf: Any,
                 ids: np.ndarray, scratch: Any) -> Wait:
    """CalAndSendTokenCount: this core's experts' count entries to their ranks."""
    t, win = lt.t, lt.window
    lo, hi = split_to_core(t.W * t.L, t.aic, core)
    if lo >= t.W * t.L:
        return
    status = ctx.alloc("status", (hi - lo) * ENTRY_WORDS * 4)
    ctx.vector("duplicate", (hi - lo) * ENTRY_WORDS, I32, writes=[status])
    words = np.zeros((hi - lo, ENTRY_WORDS), I32)
    words[:, 0] = STATUS_ONE
    last = None
    for e in range(lo, hi):
        c, op = count_before(ctx, ids_buf, ids, e, t.BS * t.K, scratch)
        yield from ctx.wait(op)
        words[e - lo, 1] = c
    yield from ctx.pipe_barrier("vector")
    ctx.ub_write(status, 0, words, ops=hi - lo)
    for e in range(lo, hi):
        entry = win.status_entry(DISPATCH_STATE, ctx.rank_id + (e % t.L) * t.W)
        last = note_remote(ctx, ctx.put(e // t.L, entry, status, ENTRY_WORDS * 4,
                                        src_offset=(e - lo) * ENTRY_WORDS * 4,
                                        name="put_token_count"), "dispatch")
    if last is not None:
        yield from ctx.wait(last)


def quant_token(ctx: KernelContext, h: int, x_in: Any, tmp: Any, y: Any) -> Wait:
    """QuantToken: Cast, Abs, ReduceMax; the scalar 127 / amax and the scale 1 / that with
    the token flag into the row's tail; Muls, then casts RINT to int32, ROUND to half,
    TRUNC to int8."""
    first = ctx.vector_seq("quant_token_amax", [("cast_f32", h, ml_dtypes.bfloat16),
                                                ("abs", h, F32), ("reduce_max", h, F32)],
                           reads=[x_in], writes=[tmp])
    yield from ctx.wait(first)
    xf = x_in.view(ml_dtypes.bfloat16, h).astype(F32)
    amax = F32(np.abs(xf).max()) if h else F32(0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = F32(F32(127.0) / amax)
        tail = np.zeros(2, I32)
        tail[0] = np.array([F32(1.0) / s], F32).view(I32)[0]
        tail[1] = TOKEN_FLAG_1
    ctx.ub_write(y, h + FLAG_AT - 4, tail, ops=2)

    def effect() -> None:
        with np.errstate(invalid="ignore", over="ignore"):
            y.view(np.int8, h)[:] = to_int8((xf * s).astype(F32))
    op = ctx.vector_seq("quant_token", [("muls", h, F32), ("cast_s32", h, F32),
                                        ("cast_f16", h, I32), ("cast_s8", h, np.float16)],
                        reads=[tmp], writes=[y], fn=effect)
    yield from ctx.wait(op)
