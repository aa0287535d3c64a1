"""DispatchLayout (csrc/deepep/ops/op_kernel/dispatch_layout.h, Process) as a per-core program.

Per round, the round's tokens are split over min(tokens, cores) AIVs (the first rest cores
take one more). Each core loads its tokens' top-k ids, clears its workspace row
(notify_send_data[core], E ints) and SyncAll; scans the ids on the scalar unit (per token a
Duplicate of seen-rank flags, per k a count per expert and, once per rank, is_token_in_rank
and a count per rank); writes is_token_in_rank; with SetAtomicAdd adds its expert counts
into the workspace rows of every later core (so row c ends as the exclusive prefix over
cores before c), into num_tokens_per_rank and into num_tokens_per_expert[round]; SyncAll;
reads its row back and numbers its (token, k) pairs per expert: send_token_idx_small.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I32, I64 = np.int32, np.int64


def dispatch_layout_program(t: DeepepTiling):
    def program(ctx: KernelContext) -> Wait:
        with ctx.phase("count"):
            for r in range(t.real_round):
                yield from one_round(ctx, t, r)

    return program


def one_round(ctx: KernelContext, t: DeepepTiling, r: int) -> Wait:
    W, E, K = t.W, t.E, t.K
    tokens = t.round_tokens(r)
    aiv = min(tokens, ctx.num_cores)
    c = ctx.core_id
    if c >= aiv:  # idle core: still meets both SyncAlls
        yield from ctx.sync_all()
        yield from ctx.sync_all()
        return
    ctx.ub.reset()
    t0, t1 = split_to_core(tokens, aiv, c)
    n = t1 - t0
    first = r * t.per_round_tokens + t0
    ids_buf = ctx.alloc("topk_idx", align_up(8 * n * K, 32))
    per_rank = ctx.alloc("num_tokens_per_rank", align_up(4 * W, 32))
    per_expert = ctx.alloc("num_tokens_per_expert", align_up(4 * E, 32))
    in_rank = ctx.alloc("is_token_in_rank", align_up(4 * n * W, 32))
    ctx.alloc("seen_rank", align_up(4 * W, 32))
    slots = ctx.alloc("send_token_idx_small", align_up(8 * n * K, 32))
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("topk_idx"), 8 * first * K, 8 * n * K))
    ids = ctx.ub_read(ids_buf, I64, n * K, ops=0).reshape(n, K)
    for name, buf, count in (("dup_rank", per_rank, W), ("dup_in_rank", in_rank, n * W),
                             ("dup_expert", per_expert, E)):
        ctx.vector(name, count, I32, writes=[buf],
                   fn=lambda b=buf: b.bytes_at(0, b.nbytes).fill(0))
    yield from ctx.pipe_barrier("vector")
    work = ctx.tensor("notify_send_data")
    yield from ctx.wait(ctx.copy_out(work, 4 * c * E, per_expert, 4 * E, name="clear_row"))
    yield from ctx.sync_all()
    cnt_e, cnt_r, flags = _scan(ctx, ids, E, W)
    ctx.ub_write(per_expert, 0, cnt_e, ops=0)
    ctx.ub_write(per_rank, 0, cnt_r, ops=0)
    ctx.ub_write(in_rank, 0, flags.reshape(-1), ops=0)
    ctx.copy_out(ctx.tensor("is_token_in_rank"), 4 * first * W, in_rank, 4 * n * W)
    ctx.set_atomic_add(I32)
    for later in range(c + 1, aiv):
        ctx.copy_out(work, 4 * later * E, per_expert, 4 * E, name="prefix_add")
    ctx.copy_out(ctx.tensor("num_tokens_per_rank"), 0, per_rank, 4 * W, name="rank_add")
    ctx.copy_out(ctx.tensor("num_tokens_per_expert"), 4 * r * E, per_expert, 4 * E,
                 name="expert_add")
    ctx.set_atomic_none()
    yield from ctx.pipe_barrier("mte3")
    yield from ctx.sync_all()
    yield from ctx.wait(ctx.copy_in(per_expert, work, 4 * c * E, 4 * E, name="read_prefix"))
    base = ctx.ub_read(per_expert, I32, E, ops=0).copy()
    out = _number(ctx, ids, base, E)
    ctx.ub_write(slots, 0, out.reshape(-1), ops=0)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("send_token_idx_small"), 4 * first * K, slots,
                                     4 * n * K))


def _scan(ctx: KernelContext, ids: np.ndarray, E: int, W: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scalar scan of a core's ids: GetValue / SetValue per (token, k), once per new
    rank; (count per expert, count per rank, is_token_in_rank rows)."""
    n, K = ids.shape
    cnt_e = np.zeros(E, I32)
    cnt_r = np.zeros(W, I32)
    flags = np.zeros((n, W), I32)
    L = E // W
    for i in range(n):
        ctx.vector("dup_seen", W, I32)
        ctx.loop(K)
        for k in range(K):
            e = int(ids[i, k])
            ctx.scalar(2)  # GetValue, the range test
            if e < 0 or e >= E:
                continue
            cnt_e[e] += 1
            ctx.scalar(3)  # GetValue + 1, SetValue, rank_id
            rank = e // L
            if not flags[i, rank]:
                flags[i, rank] = 1
                cnt_r[rank] += 1
                ctx.scalar(5)  # per_rank + 1, three SetValue
    return cnt_e, cnt_r, flags


def _number(ctx: KernelContext, ids: np.ndarray, base: np.ndarray, E: int) -> np.ndarray:
    """send_token_idx_small of a core's pairs: each (token, k)'s place among its expert's
    sends, from the core's prefix row `base` (counted up in place)."""
    n, K = ids.shape
    out = np.zeros((n, K), I32)
    for i in range(n):
        ctx.loop(K)
        for k in range(K):
            e = int(ids[i, k])
            ctx.scalar(2)
            if 0 <= e < E:
                out[i, k] = base[e]
                base[e] += 1
                ctx.scalar(3)  # read, write the slot, count + 1
    return out
