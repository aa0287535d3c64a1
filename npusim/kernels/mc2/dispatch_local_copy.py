"""The dispatch's LocalWindowCopy (the received rows window -> outputs, ep_recv_count)
and its expert_token_nums (UpdateTokenNumsOut of DeepEP's fork, SetExpertTokenNums)."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32

F32, I32 = np.float32, np.int32


def local_window_copy(ctx: KernelContext, t: Mc2Tiling, state: int, counts) -> Wait:
    """LocalWindowCopy: my prefix, then the rows of my entries window -> UB -> outputs.
    Returns the prefix after my entries (totalCnt_), None for a core without entries."""
    rank, core = ctx.rank_id, ctx.core_id
    dfx = ctx.alloc("run_pos", 32)
    ctx.ub_write(dfx, 0, np.array([2], np.uint32))
    ctx.copy_out(ctx.window(), t.window.dispatch_state_word(core) + 4, dfx, 4, name="run_pos")
    if counts is None:
        return
    s0, s1 = split_to_core(t.status_count(rank), t.cores, core)
    prefix_buf = ctx.alloc("prefix", max(align32(4 * (s1 - s0)), align32(4 * t.W * t.L)))
    begin = yield from get_cum_sum(ctx, t, state, s0)
    copy = _TokenCopy(ctx, t, state)
    prefix = []
    for i, index in enumerate(range(s0, s1)):
        cnt = int(counts[i])
        ctx.scalar(3)
        if t.is_shared_rank(rank) or t.L == 1:
            block = index
        else:
            block = (index % t.W) * t.L + index // t.W
        yield from copy.copy_entry(t.window.dispatch_block(state, block), begin, cnt)
        begin += cnt
        prefix.append(begin)
    ctx.ub_write(prefix_buf, 0, np.array(prefix, I32), ops=len(prefix))
    ctx.copy_out(
        ctx.tensor("ep_recv_count"), 4 * s0, prefix_buf, 4 * len(prefix), name="write_ep_recv_count"
    )
    yield from ctx.drain()
    return begin


def get_cum_sum(ctx: KernelContext, t: Mc2Tiling, state: int, s0: int) -> Wait:
    """The output row of my first entry (0 on core 0). A3, GetCumSum: my column of the
    workspace (the earlier cores' sums); the 950, GetCumSumA5: the counts of the entries
    before mine, summed."""
    core, C = ctx.core_id, t.cores
    if not core:
        return 0
    if t.arch == "arch22":
        col = ctx.alloc("sum_local", 32 * C)
        yield from ctx.wait(
            ctx.copy_in(
                col,
                ctx.tensor("workspace"),
                512 * core,
                0,
                strided=Strided(core, 32, src_gap=(16 * C - 1) * 32),
                name="read_workspace",
            )
        )
        ctx.vector("gather_sums", repeats=core, reads=[col])
        ctx.vector("sum_sums", core, F32)
        yield from ctx.pipe_barrier("vector")
        return int(ctx.ub_read(col, I32, 8 * core).reshape(core, 8)[:, 0].sum())
    before = ctx.alloc("status_before", 32 * s0)
    yield from ctx.wait(
        ctx.copy_in(
            before,
            ctx.window(),
            t.window.dispatch_status(state, 0),
            32 * s0,
            name="read_status_before",
        )
    )
    ctx.vector("reduce_sum", 2 * s0, F32, reads=[before])
    yield from ctx.pipe_barrier("vector")
    return int(ctx.ub_read(before, I32, 8 * s0).reshape(s0, 8)[:, 1].sum())


class RowOutputs:
    """The output tensors the received rows go to from UB: expand_x, [dynamic_scales],
    assist_info_for_combine, [expand_scales] (LocalWindowCopy, fullmesh_v2's
    CopyInAndOut)."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling) -> None:
        slot = t.window.dispatch
        self.x = ctx.tensor("expand_x")
        self.assist = ctx.tensor("assist_info_for_combine")
        self.scales = ctx.tensor("dynamic_scales") if slot.scale_offset is not None else None
        self.es = ctx.tensor("expand_scales") if slot.expert_scale_offset is not None else None

    def write(self, ctx: KernelContext, slot: Any, buf: Any, row: int, n: int, stride: int,
              scales_first: bool) -> list[Any]:
        """n rows in UB, one every `stride` bytes, out from output row `row` by strided
        copies: the rows, their scales (first in fullmesh_v2's CopyInAndOut), triplets."""
        ob, sb = slot.out_bytes, slot.scale_bytes

        def rows() -> Any:
            return ctx.copy_out(self.x, row * ob, buf, 0,
                                strided=Strided(n, ob, src_gap=stride - ob),
                                name="write_expand_x")

        ops = [] if scales_first else [rows()]
        if self.scales is not None:
            ops.append(ctx.copy_out(self.scales, row * sb, buf, 0, src_offset=slot.scale_offset,
                                    strided=Strided(n, sb, src_gap=stride - sb),
                                    name="write_scales"))
        if scales_first:
            ops.append(rows())
        ops.append(ctx.copy_out(self.assist, row * 12, buf, 0, src_offset=slot.triplet_offset,
                                strided=Strided(n, 12, src_gap=stride - 12),
                                name="write_assist_info"))
        return ops

    def expert_scales(self, ctx: KernelContext, ops: list[Any], src: int, buf: Any, row: int,
                      n: int, slot_bytes: int) -> Wait:
        """SyncFunc<MTE3_MTE2> (the rows are out), then n expert scales from window offset
        `src` (one a slot) through `buf` to expand_scales; returns that copy."""
        yield from ctx.wait(*ops)
        yield from ctx.wait(ctx.copy_in(buf, ctx.window(), src, 0,
                                        strided=Strided(n, 4, src_gap=slot_bytes - 4),
                                        name="copy_expert_scales"))
        return ctx.copy_out(self.es, row * 4, buf, 4 * n, name="write_expand_scales")


class _TokenCopy:
    """The rows of one entry window -> UB -> expand_x, [dynamic_scales],
    assist_info_for_combine, [expand_scales], up to `per` rows a copy through two buffers
    (a buffer is reused once its copies out are done)."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling, state: int) -> None:
        self.ctx, self.t = ctx, t
        size, self.per = t.local_copy_rows(ctx.rank_id)
        self.bufs = [ctx.alloc(f"triple{p}", size) for p in range(2)]
        self.busy: list[list[Any]] = [[], []]
        self.b = 0
        self.out = RowOutputs(ctx, t)

    def copy_entry(self, base: int, begin: int, cnt: int) -> Wait:
        """The entry's cnt rows from window offset `base` to output rows begin onwards."""
        done = 0
        while done < cnt:
            m = min(self.per, cnt - done)
            yield from self.copy_rows(base + done * self.t.window.dispatch.slot, begin + done, m)
            done += m

    def copy_rows(self, src: int, r0: int, m: int) -> Wait:
        """m rows from window offset `src` into the next buffer, then out from row r0."""
        ctx, slot = self.ctx, self.t.window.dispatch
        win = ctx.window()
        row = slot.ub_row
        p = self.b % 2
        buf = self.bufs[p]
        yield from ctx.wait(*self.busy[p])  # AllocTensor: its copies out are done
        yield from ctx.wait(
            ctx.copy_in(
                buf,
                win,
                src,
                0,
                strided=Strided(m, row, src_gap=slot.slot - row),
                name="copy_tokens",
            )
        )
        ops = self.out.write(ctx, slot, buf, r0, m, row, scales_first=False)
        if self.out.es is not None:
            ops.append((yield from self.out.expert_scales(
                ctx, ops, src + slot.expert_scale_offset, buf, r0, m, slot.slot)))
        self.busy[p] = ops
        self.b += 1


def update_token_nums_out(ctx: KernelContext, t: Mc2Tiling, total: int | None) -> Wait:
    """UpdateTokenNumsOut (DeepEP's fork): with more than one local expert every core
    SyncAlls; the last core with entries writes its totalCnt_, then per local expert
    re-reads two ep_recv_count entries through the data cache (DataCacheCleanAndInvalid,
    GetValue) and writes their difference (type 1; type 0 accumulates) with SetValue."""
    rank = ctx.rank_id
    le, W = t.local_experts(rank), t.W
    if le > 1:
        yield from ctx.sync_all()
    if ctx.core_id != min(t.status_count(rank), t.cores) - 1 or total is None:
        return
    recv, out = ctx.tensor("ep_recv_count"), ctx.tensor("expert_token_nums")
    cache = ctx.dcache

    def put(i: int, value: int) -> None:
        ctx.gm_write_scalar(out, 8 * i, value, np.int64)
        cache.dcci_line(out, 8 * i)

    put(0, total)
    if le == 1:
        return
    cache.dcci_line(recv, 4 * (W - 1))
    acc = int(ctx.gm_read_scalar(recv, 4 * (W - 1), I32))
    put(0, acc)
    for i in range(1, le):
        pre, cur = 4 * (W * (i - 1) + W - 1), 4 * (W * i + W - 1)
        cache.dcci_line(recv, pre)
        cache.dcci_line(recv, cur)
        step = int(ctx.gm_read_scalar(recv, cur, I32)) - int(ctx.gm_read_scalar(recv, pre, I32))
        acc = (acc if t.expert_token_nums_type == 0 else 0) + step
        put(i, acc)


def set_expert_token_nums(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """SetExpertTokenNums (core 0): re-read the counts, reduce over sources, write int64."""
    rank = ctx.rank_id
    le, W = t.local_experts(rank), t.W
    win = ctx.window()
    base = t.window.dispatch_status(state, 0)
    nums_buf = ctx.alloc("token_nums", align32(8 * t.L))
    if t.arch == "arch35":  # compact count read, one [L, W] reduce, a cast
        cnt = ctx.alloc("counts", align32(4 * le * W))
        yield from ctx.wait(
            ctx.copy_in(
                cnt, win, base + 4, 0, strided=Strided(le * W, 4, src_gap=28), name="read_counts"
            )
        )
        ctx.vector("reduce_sum_ar", le * W, F32, reads=[cnt])
        ctx.vector("cast_i64", le, np.int64)
        yield from ctx.pipe_barrier("vector")
        c = ctx.ub_read(cnt, I32, le * W).reshape(le, W).sum(axis=1)
    else:
        allst = ctx.alloc("all_status", 32 * le * W)
        yield from ctx.wait(ctx.copy_in(allst, win, base, 32 * le * W, name="read_status"))
        for _ in range(le):
            ctx.vector("reduce_sum", 2 * W, F32, reads=[allst])
            yield from ctx.pipe_barrier("vector")
            ctx.scalar(3)
        c = ctx.ub_read(allst, I32, 8 * le * W).reshape(le, W, 8)[:, :, 1].sum(axis=1)
    nums = np.cumsum(c) if t.expert_token_nums_type == 0 else c
    ctx.ub_write(nums_buf, 0, nums.astype(np.int64), ops=le)
    ctx.copy_out(
        ctx.tensor("expert_token_nums"), 0, nums_buf, 8 * le, name="write_expert_token_nums"
    )
    if t.performance_info:  # the max over the cores' rows (the kernel's AtomicMax)
        rows = ctx.alloc("perf_rows", align32(8 * t.W * t.cores))
        yield from ctx.wait(
            ctx.copy_in(
                rows,
                ctx.tensor("performance_info_cores"),
                0,
                8 * t.W * t.cores,
                name="read_performance_info",
            )
        )
        ctx.vector("max_rows", t.W * t.cores, np.int64, reads=[rows])
        yield from ctx.pipe_barrier("vector")
        best = ctx.ub_read(rows, np.int64, t.W * t.cores).reshape(t.cores, t.W).max(axis=0)
        out = ctx.alloc("perf_out", align32(8 * t.W))
        ctx.ub_write(out, 0, best, ops=1)
        ctx.copy_out(ctx.tensor("performance_info"), 0, out, 8 * t.W, name="write_performance_info")
    yield from ctx.drain()
