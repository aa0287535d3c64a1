"""The dispatch half of DispatchAndCombine on the AIVs (dispatch_ffn_combine_kernel.hpp):

- CrossRankSyncAndlocalTokenPerExpertAllGatherAndGetSumPreRankV2 (581-660): AIV c puts
  this rank's token-per-expert row, each count + 0x800000, into rank c's segment at the
  same place (a count of 0 must read as arrived); then waits for rank c's row in its own
  segment (first int of every 512 B line non-zero), takes the marker off and keeps the
  prefix sums of rank c's counts before this rank's experts (preSumBeforeRank);
- GetCumsumForMMAIV (331-359) on AIV 0: per local expert, the rows received from ranks
  0..i (cumsumMM), then expert_token_nums = its last row (CopyGMToGM, 769-772);
- CrossCoreSetFlag<2>(0) lets the AIC read the cumsums (773-775);
- per local expert g (781-815): AIV c pulls (remote MTE2) its rows from rank c's segment,
  H + 512 B each, and stores the int8 row into gmA and the scale into perTokenScale1 at
  the expert-major row (CopyGMToGMPerToken 292-329, two UB buffers); SyncAll, then
  CrossCoreSetFlag<2>(id (g + 1) / 15) tells the AIC expert g is in (GMM1 overlaps the
  next expert's pulls).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import FLAG_MAX_SET_COUNT, DfcTiling
from npusim.runtime.conditions import AtLeast, Wait
from npusim.runtime.context import KernelContext, Strided

I32 = np.int32
MARK = 0x800000
CACHE_LINE = 512
SYNC_MODE2 = 2


def count_all_gather(ctx: KernelContext, t: DfcTiling, core: int, note: Any) -> Wait:
    """The count all-gather and preSumBeforeRank; `note(op)` records a remote transfer."""
    seg, row = t.segment, t.segment.count_row
    win, me = ctx.window(), ctx.rank_id
    buf = ctx.alloc("token_per_expert", row * 4)
    pre = ctx.alloc("prev_sum", max(t.L * 4, 32))
    own = seg.count_at(me, 0, 0)
    for dst in range(core, t.W, t.aiv):
        if dst == me:
            continue
        yield from ctx.wait(ctx.copy_in(buf, win, own, row * 4, name="copy_gm_to_ub"))

        def mark() -> None:
            v = buf.view(I32, row)
            v[:] = v + I32(MARK)

        yield from ctx.wait(ctx.vector("adds_mark", row, I32, reads=[buf], writes=[buf],
                                       fn=mark))
        yield from ctx.wait(note(ctx.put(dst, own, buf, row * 4, name="put_token_per_expert")))
    presum = ctx.tensor("pre_sum_before_rank")
    for src in range(core, t.W, t.aiv):
        at = seg.count_at(src, 0, 0)
        if src != me:
            for line in range(0, row * 4, CACHE_LINE):
                yield from ctx.spin_until(win, at + line, AtLeast(I32, MARK), 4,
                                          name="gm_signal_wait_until_ne")
            yield from ctx.wait(ctx.copy_in(buf, win, at, row * 4, name="data_copy"))

            def unmark() -> None:
                v = buf.view(I32, row)
                v[:] = v - I32(MARK)

            yield from ctx.wait(ctx.vector("adds_unmark", row, I32, reads=[buf],
                                           writes=[buf], fn=unmark))
            yield from ctx.wait(ctx.copy_out(win, at, buf, row * 4, name="data_copy"))
        else:
            yield from ctx.wait(ctx.copy_in(buf, win, at, row * 4, name="data_copy"))
        counts = ctx.ub_read(buf, I32, t.W * t.L, ops=0)
        ctx.loop((me + 1) * t.L)
        before = np.cumsum(counts, dtype=np.int64) - counts
        ctx.ub_write(pre, 0, before[me * t.L:(me + 1) * t.L].astype(I32), ops=t.L)
        yield from ctx.wait(ctx.copy_out(presum, src * t.L * 4, pre, t.L * 4,
                                         name="data_copy_pad"))
    yield from ctx.sync_all()


def cumsum_for_mm(ctx: KernelContext, t: DfcTiling) -> Wait:
    """GetCumsumForMMAIV and the expert_token_nums copy (AIV 0 only)."""
    W, L, row = t.W, t.L, t.segment.count_row
    la = -(-L // 8) * 8  # expertPerRankAligned
    buf = ctx.alloc("cumsum_in", max(W * la * 4, 32))
    ld = ctx.copy_in(buf, ctx.window(), t.segment.count_at(0, ctx.rank_id, 0), W * L * 4,
                     name="data_copy_pad", strided=Strided(W, L * 4, (row - L) * 4,
                                                           (la - L) * 4))
    yield from ctx.wait(ld)

    def prefix() -> None:
        v = buf.view(I32, W * la).reshape(W, la)
        v[:, :L] = np.cumsum(v[:, :L], axis=0, dtype=np.int64).astype(I32)

    op = None
    for i in range(1, W):
        op = ctx.vector("add", L, I32, reads=[buf], writes=[buf],
                        fn=prefix if i == W - 1 else None)
    if op is not None:
        yield from ctx.wait(op)
    cum = ctx.tensor("cumsum_mm")
    yield from ctx.wait(ctx.copy_out(cum, 0, buf, W * L * 4, name="data_copy_pad",
                                     strided=Strided(W, L * 4, (la - L) * 4, 0)))
    yield from ctx.sync_all()
    out = ctx.alloc("expert_token_nums_ub", max(L * 4, 32))
    yield from ctx.wait(ctx.copy_in(out, cum, (W - 1) * L * 4, L * 4, name="copy_gm_to_ub"))
    yield from ctx.wait(ctx.copy_out(ctx.tensor("expert_token_nums"), 0, out, L * 4,
                                     name="copy_ub_to_gm"))


def current_m(ctx: KernelContext, t: DfcTiling, g: int) -> int:
    """cumsumMM((EP - 1) * expertPerRank + g): rows of local expert g (a scalar load)."""
    return int(ctx.gm_read_scalar(ctx.tensor("cumsum_mm"), ((t.W - 1) * t.L + g) * 4, I32))


def pulls(ctx: KernelContext, t: DfcTiling, core: int, note: Any) -> Wait:
    """The per-expert pulls; AIV `core` pulls from ranks core, core + aiv, ..."""
    seg, me = t.segment, ctx.rank_id
    cum, pre = ctx.tensor("cumsum_mm"), ctx.tensor("pre_sum_before_rank")
    bufs = [ctx.alloc(f"pull{i}", t.row_bytes) for i in range(2)]
    busy: list[Any] = [None, None]
    prev = {src: int(ctx.gm_read_scalar(pre, src * t.L * 4, I32))
            for src in range(core, t.W, t.aiv)}
    group_sum, idx = 0, 1
    for g in range(t.L):
        m = current_m(ctx, t, g)
        for src in range(core, t.W, t.aiv):
            start = (0 if src == 0 else int(ctx.gm_read_scalar(
                cum, ((src - 1) * t.L + g) * 4, I32))) + group_sum
            rows = int(ctx.gm_read_scalar(ctx.window(), seg.count_at(src, me, g), I32))
            row_src, prev[src] = prev[src], prev[src] + rows
            yield from _copy_rows(ctx, t, src, row_src, start, rows, bufs, busy, note)
        for b in busy:
            if b is not None:
                yield from ctx.wait(*b)
        yield from ctx.sync_all()
        ctx.cross_core_set_flag(SYNC_MODE2, idx // FLAG_MAX_SET_COUNT, "mte3")
        idx += 1
        group_sum += m


def _copy_rows(ctx: KernelContext, t: DfcTiling, src: int, row_src: int, start: int,
               rows: int, bufs: list[Any], busy: list[Any], note: Any) -> Wait:
    """CopyGMToGMPerToken: rows row_src.. of rank src's routed rows into gmA / the scales
    from row `start`; the next row's GET is queued before this one is waited on, a buffer
    is reloaded once its two stores are done (MTE3_MTE2 events 0 / 1)."""
    gm_a, gm_s = ctx.tensor("gm_a"), ctx.tensor("per_token_scale1")
    loads: list[Any] = [None, None]

    def load(i: int) -> Wait:
        p = i % 2
        if busy[p] is not None:
            yield from ctx.wait(*busy[p])
            busy[p] = None
        loads[p] = note(ctx.copy_in(bufs[p], ctx.window(src), t.segment.offset_a
                                    + (row_src + i) * t.row_bytes, t.row_bytes,
                                    name="pull_token"))

    if rows:
        yield from load(0)
    for i in range(rows):
        p = i % 2
        if i + 1 < rows:
            yield from load(i + 1)
        yield from ctx.wait(loads[p])  # WaitFlag<MTE2_MTE3>
        busy[p] = (ctx.copy_out(gm_a, (start + i) * t.H, bufs[p], t.H, name="copy_row"),
                   ctx.copy_out(gm_s, (start + i) * 4, bufs[p], 4, src_offset=t.H,
                                name="copy_scale"))
