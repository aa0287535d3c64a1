"""MoeDistributeDispatchV2FullMesh (``comm_alg: fullmesh_v2``) as a per-core program.

Steps as in ``moe_distribute_dispatch_v2_full_mesh.h`` (docs/kernels/mc2.md, "fullmesh_v2"):
the first C - n_cs cores run AllToAllDispatch, the last n_cs (the count cores) CalCumSum
(CalAndSendCntByExp on A3, CalAndSendCntByRank on the 950; WaitDispatch; CalRecvAndSetFlag;
A3: SetExpertTokenNums), then every core LocalWindowCopy. No SyncAll: the data carries its
arrival flag in every 512 B block (480 B of data + 32 B of float 1.0), the counts go out in
parallel with the data, and the count cores hand the prefix table to the copying cores
through the workspace and a soft flag.

AllToAllDispatch has three MoE send paths:
* A3, expert split (SendToMoeExpert): each core owns E / moe experts (the remainder shared
  round robin), sends every pair of an owned expert, experts staggered by the rank, 2 slots;
* A3, BS mode (SendToMoeExpertByBS, under canUseBSMode): each core takes activeBS / moe
  consecutive tokens (or, with fewer active tokens than cores, a share of one token's K),
  reads and quantises each token once and copies it to its K destinations, k staggered by
  the token, with up to 8 slots in flight;
* 950, token split: item index = core, core + moe, ..., up to 8 slots, destination block
  rotated to ((src + dst) % W) * L + e % L.
Quantisation is the fullmesh_v1 step (:func:`npusim.kernels.mc2.dispatch_send._quantise`).
The steps: full_mesh_send, full_mesh_count, full_mesh_local_copy.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.dispatch import init_win_state
from npusim.kernels.mc2.full_mesh_count import cal_cum_sum
from npusim.kernels.mc2.full_mesh_local_copy import local_window_copy
from npusim.kernels.mc2.full_mesh_send import all_to_all_dispatch
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext


def full_mesh_dispatch_program(t: Mc2Tiling):
    memo: dict[tuple[int, int, int], np.ndarray] = {}  # (rank, token, scale row) -> record

    def program(ctx: KernelContext) -> Wait:
        rank, core = ctx.rank_id, ctx.core_id
        state = yield from init_win_state(ctx, t.window.dispatch_state_word(core))
        a2a = tl.all_to_all_cores(t, rank)
        if core < a2a:
            with ctx.phase("send"):
                yield from all_to_all_dispatch(ctx, t, state, memo)
        else:
            yield from cal_cum_sum(ctx, t, state, core - a2a)
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>: LocalWindowCopy resets the pipe
        with ctx.phase("local_copy"):
            yield from local_window_copy(ctx, t, state)

    return program
