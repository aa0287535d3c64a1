"""MoeDistributeDispatchV2 (fullmesh_v1, the V3 default) as a per-core program.

Steps as in ``moe_distribute_dispatch_v2.h`` (docs/kernels/mc2.md, with line numbers):
AlltoAllDispatch (dispatch_send), SetStatus (SyncAll, then the count entries) and
WaitDispatch (A3: SyncCntOnCore; SyncAll) (dispatch_status), LocalWindowCopy and
SetExpertTokenNums (dispatch_local_copy). Vector work is charged per instruction as the
kernel issues it.

GM tensors per rank: x, expert_ids, [scales], [expert_scales] in; expand_x, dynamic_scales,
assist_info_for_combine, expert_token_nums, ep_recv_count, [expand_scales] out; workspace
(A3: C x C rows of 512 B for SyncCntOnCore).
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.mc2.dispatch_local_copy import (
    local_window_copy,
    set_expert_token_nums,
    update_token_nums_out,
)
from npusim.kernels.mc2.dispatch_send import all_to_all_dispatch
from npusim.kernels.mc2.dispatch_status import set_status, wait_dispatch
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

PHASES = ("send", "set_status", "wait_dispatch", "local_copy", "token_nums")


def dispatch_program(t: Mc2Tiling):
    memo: dict[tuple[int, int, int], np.ndarray] = {}  # (rank, token, scale row) -> record

    def program(ctx: KernelContext) -> Wait:
        state = yield from init_win_state(ctx, t.window.dispatch_state_word(ctx.core_id))
        with ctx.phase("send"):
            ids = yield from all_to_all_dispatch(ctx, t, state, memo)
        with ctx.phase("set_status"):
            yield from set_status(ctx, t, state, ids)
        ctx.ub.reset()  # BufferInit: tpipe_->Reset()
        with ctx.phase("wait_dispatch"):
            counts = yield from wait_dispatch(ctx, t, state)
        with ctx.phase("local_copy"):
            total = yield from local_window_copy(ctx, t, state, counts)
        if t.update_token_nums_out:
            with ctx.phase("token_nums"):
                yield from update_token_nums_out(ctx, t, total)
        elif ctx.core_id == 0:
            with ctx.phase("token_nums"):
                yield from set_expert_token_nums(ctx, t, state)

    return program


def init_win_state(ctx: KernelContext, offset: int) -> Wait:
    """InitWinState: read the core's state word, write back its flip (and the op counter)."""
    buf = ctx.alloc("data_state", 32)
    yield from ctx.wait(ctx.copy_in(buf, ctx.window(), offset, 32, name="read_state"))
    words = ctx.ub_read(buf, np.uint32, 8)
    state = int(words[0]) & 1
    words[0] = 1 - state
    words[1] = 1
    ctx.ub_write(buf, 0, words, ops=8)
    ctx.copy_out(ctx.window(), offset, buf, 32, name="flip_state")
    return state
