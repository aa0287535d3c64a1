"""CombineV2 (dispatch_ffn_combine_kernel.hpp 929-990) with epilogue 2
(utils/block_epilogue_pertoken_v2.hpp 100-191): per local expert, the AIVs of block b walk
the same GMM2 blocks as AIC b; each block's rows in 16-row chunks, the first half of the
chunks to sub-block 0, the rest to sub-block 1. Before a block of expert g an AIV takes
the AIC's flag (g / 15) for every expert up to g. Per chunk: MTE2 the fp16 C2 rows, Cast to
fp32, the chunk's token scales, Muls per row, Cast to bf16 (RINT), then one PUT per source
rank whose rows the chunk holds, into that rank's combine rows (offsetD) at the route's
sorted position (preSumBeforeRank + offset in the expert), H apart.

Then the cross-rank sync (utils/hccl_shmem.hpp 201-323): every AIV toggles its state word
(InitStatusTargetSum); sub-block 0 sets SEND_SYNC (9) and RECV_SYNC (10) in mode 0, waits
9, writes its 1.0f state into ranks b, b + blocks, ... (CrossRankSyncV2Set), waits 10;
sub-block 1 sets 9, spins until the states of its share of ranks sum to the target,
sets and waits 10, then waits 9 (CrossRankSyncV2Wait).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.moe_layer.dispatch_ffn_combine.gmm import walk
from npusim.kernels.moe_layer.dispatch_ffn_combine.pulls import current_m
from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import FLAG_MAX_SET_COUNT, DfcTiling
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import AllEqual, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import MiB, ceil_div

F32, F16, I32 = np.float32, np.float16, np.int32
M0 = 16  # rows per chunk
SEND_SYNC, RECV_SYNC = 9, 10
STATE_OFFSET = 512
SELF_STATE_OFFSET = 256 * 1024
ONE_F32 = 0x3F800000


def combine_v2(ctx: KernelContext, t: DfcTiling, note: Any) -> Wait:
    """This AIV's chunks of every GMM2 block of its block index."""
    H, me, seg, W, L = t.H, ctx.rank_id, t.segment, t.W, t.L
    b, sub = ctx.block_idx, ctx.sub_block_idx
    c_ub = [ctx.alloc(f"ub_c2_{i}", M0 * 256 * 2) for i in range(2)]
    f_ub = ctx.alloc("ub_c2_fp32", M0 * 256 * 4)
    d_ub = [ctx.alloc(f"ub_d2_{i}", M0 * 256 * 2) for i in range(2)]
    s_ub = ctx.alloc("ub_token_scale2", M0 * 4 + 32)
    gm_c2, ts2 = ctx.tensor("gm_c2"), ctx.tensor("per_token_scale2")
    presum = ctx.tensor("pre_sum_before_rank")
    counts = [[int(ctx.gm_read_scalar(ctx.window(), seg.count_at(src, me, g), I32))
               for src in range(W)] for g in range(L)]
    starts = [[int(ctx.gm_read_scalar(presum, (src * L + g) * 4, I32)) for src in range(W)]
              for g in range(L)]
    sent: list[list[Any]] = [[], []]
    synced, start, before, ping = 0, 0, 0, 0
    for g in range(L):
        m = current_m(ctx, t, g)
        blocks, nxt = walk(m, H, b, t.aic, start)
        for _, r0, rows, n0, cols in blocks:
            chunks = ceil_div(rows, M0)
            mine = chunks // 2 + (chunks % 2 if sub == 1 else 0)
            off = r0 + (chunks // 2) * M0 if sub == 1 else r0
            while synced <= g:
                yield from ctx.cross_core_wait_flag(synced // FLAG_MAX_SET_COUNT)
                synced += 1
            for c in range(mine):
                am = min(M0, r0 + rows - off)
                p = ping
                ping ^= 1
                yield from ctx.wait(*sent[p])
                sent[p] = []
                ld = ctx.copy_in(c_ub[p], gm_c2, ((before + off) * H + n0) * 2, am * cols * 2,
                                 name="copy_gm_to_ub_c", strided=Strided(am, cols * 2,
                                                                         (H - cols) * 2, 0))
                sl = ctx.copy_in(s_ub, ts2, (before + off) * 4, am * 4,
                                 name="copy_scale_gm_to_ub")
                yield from ctx.wait(ld, sl)
                n = am * cols

                def effect(p: int = p, am: int = am, cols: int = cols, n: int = n) -> None:
                    c = c_ub[p].view(F16, n).reshape(am, cols).astype(F32)
                    y = (c * s_ub.view(F32, am)[:, None]).astype(F32)
                    d_ub[p].view(BF16, n)[:] = y.reshape(-1).astype(BF16)

                op = ctx.vector_seq("dequant_per_token", [
                    ("cast_f32", n, F16), *[("muls", cols, F32)] * am, ("cast_bf16", n, F32)],
                    reads=[c_ub[p], s_ub], writes=[f_ub, d_ub[p]],
                    fn=None if t.timing_only else effect)
                yield from ctx.wait(op)
                sent[p] = list(_send(ctx, t, d_ub[p], off, am, n0, cols, counts[g],
                                     starts[g], note))
                off += am
        before += m
        start = nxt
    yield from ctx.wait(*sent[0], *sent[1])


def _send(ctx: KernelContext, t: DfcTiling, buf: Any, st: int, am: int, n0: int, cols: int,
          counts: list[int], starts: list[int], note: Any) -> Any:
    """The chunk's rows st..st + am of the expert, by source rank, PUT to each source."""
    lo = 0
    ed = st + am
    for src in range(t.W):
        hi = lo + counts[src]
        if lo >= ed:
            break
        a, z = max(lo, st), min(hi, ed)
        if z > a:
            dst_row = starts[src] + (a - lo)
            op = ctx.put(src, t.segment.offset_d + (dst_row * t.H + n0) * 2, buf,
                         (z - a) * cols * 2, src_offset=(a - st) * cols * 2,
                         name="put_combine_rows",
                         strided=Strided(z - a, cols * 2, 0, (t.H - cols) * 2))
            yield note(op) if src != ctx.rank_id else op
        lo = hi


def cross_rank_sync(ctx: KernelContext, t: DfcTiling, note: Any) -> Wait:
    """InitStatusTargetSum, then CrossRankSyncV2Set (sub-block 0) or ...Wait (1)."""
    win, seg = ctx.window(), t.segment
    base = seg.size - MiB
    core = 2 * ctx.block_idx + ctx.sub_block_idx
    at = base + SELF_STATE_OFFSET + core * 32 * 4
    state = int(ctx.gm_read_scalar(win, at, I32))
    value = ONE_F32 if state == 0 else 0
    ctx.gm_write_scalar(win, at, value, I32)
    if ctx.sub_block_idx == 0:
        ctx.cross_core_set_flag(0, RECV_SYNC, "mte3")
        ctx.cross_core_set_flag(0, SEND_SYNC, "mte3")
        yield from ctx.cross_core_wait_flag(SEND_SYNC)
        buf = ctx.alloc("ctr_buffer", 32)
        ctx.ub_write(buf, 0, np.full(8, value, I32))
        ops = [ctx.put(dst, base + ctx.rank_id * STATE_OFFSET, buf, 32, name="put_state")
               for dst in range(ctx.block_idx, t.W, t.aic)]
        for dst, op in zip(range(ctx.block_idx, t.W, t.aic), ops, strict=True):
            if dst != ctx.rank_id:
                note(op)
        yield from ctx.wait(*ops)
        yield from ctx.cross_core_wait_flag(RECV_SYNC)
        return
    per, rem = divmod(t.W, t.aic)
    b = ctx.block_idx
    first = per * b + min(b, rem)
    mine = per + (1 if b < rem else 0)
    ctx.cross_core_set_flag(0, SEND_SYNC, "mte3")
    for r in range(first, first + mine):
        yield from ctx.spin_until(win, base + r * STATE_OFFSET, AllEqual(I32, value), 4,
                                  name="wait_status")
    ctx.cross_core_set_flag(0, RECV_SYNC, "mte3")
    yield from ctx.cross_core_wait_flag(RECV_SYNC)
    yield from ctx.cross_core_wait_flag(SEND_SYNC)
