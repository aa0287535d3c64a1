"""MoeTokenUnpermute (unpermute/moe_token_unpermute.h, tiling moe_token_unpermute_tiling.h)
on the sub-block-1 AIVs after the cross-rank sync (dispatch_ffn_combine_kernel.hpp
896-925): the BS tokens split over the blocks (tokens_core_length, the remainder one more
each to the first blocks); per token, its K sorted positions (expandedRowIdx) and probs,
then per route an MTE2 of its bf16 combine row from the own segment, Cast to fp32, Muls by
the prob, Add into the first (Muls only for k = 0), and the Cast to bf16 (RINT) out.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.moe_layer.dispatch_ffn_combine.tiling import DfcTiling
from npusim.kernels.quant import BF16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

F32, I32 = np.float32, np.int32
BUFFER_NUM = 4  # tilingData.buffer_num


def unpermute(ctx: KernelContext, t: DfcTiling) -> Wait:
    b, cores, H, K = ctx.block_idx, t.aic, t.H, t.K
    per, rem = divmod(t.BS, cores)
    mine = per + (1 if b < rem else 0)
    first = per * b + min(b, rem)
    if mine == 0:
        return
    idx_ub = ctx.alloc("indices", max(mine * K * 4, 32))
    prob_ub = ctx.alloc("probs", max(mine * K * 4, 32))
    rows = [ctx.alloc(f"token_in{i}", H * 2) for i in range(BUFFER_NUM)]
    acc = ctx.alloc("token_tensor0", H * 4)
    tmp = ctx.alloc("token_tensor1", H * 4)
    out = ctx.alloc("out", H * 2)
    yield from ctx.wait(ctx.copy_in(idx_ub, ctx.tensor("expanded_row_idx"), first * K * 4,
                                    mine * K * 4, name="copy_in_indices"),
                        ctx.copy_in(prob_ub, ctx.tensor("probs"), first * K * 4, mine * K * 4,
                                    name="copy_in_probs"))
    idx = ctx.ub_read(idx_ub, I32, mine * K, ops=0)
    probs = ctx.ub_read(prob_ub, F32, mine * K, ops=0)
    win, y = ctx.window(), ctx.tensor("out")
    store = None
    for i in range(mine):
        loads = [ctx.copy_in(rows[k], win, t.segment.offset_d + int(idx[i * K + k]) * H * 2,
                             H * 2, name="copy_token_in") for k in range(min(K, BUFFER_NUM))]
        loads += [None] * (K - len(loads))
        ctx.scalar(2 * K)  # the indices' and probs' GetValue
        if store is not None:
            yield from ctx.wait(store)
        for k in range(K):
            yield from ctx.wait(loads[k])
            p = F32(probs[i * K + k])
            buf = rows[k % BUFFER_NUM]

            def effect(buf: object = buf, p: F32 = p, k: int = k) -> None:
                v = (buf.view(BF16, H).astype(F32) * p).astype(F32)
                if k == 0:
                    acc.view(F32, H)[:] = v
                else:
                    acc.view(F32, H)[:] = (acc.view(F32, H) + v).astype(F32)

            instrs = [("cast_f32", H, BF16), ("muls", H, F32)] + (
                [("add", H, F32)] if k else [])
            yield from ctx.wait(ctx.vector_seq("cal_token", instrs,
                                               reads=[buf, acc] if k else [buf],
                                               writes=[acc, tmp],
                                               fn=None if t.timing_only else effect))
            if k + BUFFER_NUM < K:  # the buffer is free for route k + BUFFER_NUM
                loads[k + BUFFER_NUM] = ctx.copy_in(
                    rows[k % BUFFER_NUM], win, t.segment.offset_d
                    + int(idx[i * K + k + BUFFER_NUM]) * H * 2, H * 2, name="copy_token_in")

        def cast(n: int = H) -> None:
            out.view(BF16, n)[:] = acc.view(F32, n).astype(BF16)

        yield from ctx.wait(ctx.vector("cast_bf16", H, F32, reads=[acc], writes=[out],
                                       fn=None if t.timing_only else cast))
        store = ctx.copy_out(y, (first + i) * H * 2, out, H * 2, name="copy_out")
    if store is not None:
        yield from ctx.wait(store)
