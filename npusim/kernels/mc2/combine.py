"""MoeDistributeCombineV2 (A3, arch22) and MoeDistributeCombineV2A5Mte (950, arch35) as
per-core programs (docs/kernels/mc2.md): the send (combine_send), then the receive
(combine_receive, summing each token in combine_expert).

A3: rows split evenly over the cores, two rows per MTE3 barrier, then their two 32 B flags;
each core sweeps its pending tokens round robin, one (K + S) * 32 B flag probe each.
950: one row per step in a permuted order, packed 480 B data + 32 B of 1.0 per 512 B block
(data as flag, no flag put); a token is complete when all its blocks' flags read 1.0.

GM tensors per rank: expand_x (the experts' rows), assist_info_for_combine, ep_recv_count,
expert_ids, [expert_scales], [shared_expert_x], [ori_x, const_*] in; x out.
"""

from __future__ import annotations

from npusim.kernels.mc2.combine_receive import receive
from npusim.kernels.mc2.combine_send import send
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext

PHASES = ("send", "receive")


def combine_program(t: Mc2Tiling):
    from npusim.kernels.mc2.dispatch import init_win_state

    def program(ctx: KernelContext) -> Wait:
        state = yield from init_win_state(ctx, t.window.combine_state_word(ctx.core_id))
        with ctx.phase("send"):
            yield from send(ctx, t, state)
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL> before the pipe reset
        ctx.ub.reset()
        with ctx.phase("receive"):
            yield from receive(ctx, t, state)

    return program
