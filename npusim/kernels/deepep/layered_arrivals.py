"""GetSelfServerTokenInfo / GetArrivedTokenInfo: the tokens of one source server as they
arrive, for CreateInnerReduceInfo and Win2Ipc."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.deepep.layered_layout import (
    END_OF_WRITE_FLAG_VALUE,
    FLAG_SIZE,
    SERVER_RANK_SIZE,
    SHOULD_SEND_FLAG_VALUE,
)
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.runtime.conditions import AllEqual, Wait
from npusim.runtime.context import KernelContext
from npusim.runtime.poll import Poll

U64 = np.uint64


class Arrivals:
    """GetSelfServerTokenInfo / GetArrivedTokenInfo: the tokens of one source server in
    their order, each as its struct's bytes (or only its expert ids)."""

    def __init__(self, ctx: KernelContext, t: LayeredTiling, buf_id: int, server: int) -> None:
        self.ctx, self.t, self.server = ctx, t, server
        self.own = server == ctx.rank_id // SERVER_RANK_SIZE
        self.base = t.window.rdma_tokens(buf_id, server)
        self.end_at = t.window.rdma_status(buf_id, server)
        self.flag = ctx.alloc("status", FLAG_SIZE)
        self.end_flag = ctx.alloc("end_status", FLAG_SIZE)
        self.self_idx = 0

    def next(self, token: int, just_exp: bool, into: Any) -> Wait:
        """The next token's bytes in `into` and True, or False when the server is done."""
        ctx, t = self.ctx, self.t
        rec = t.struct_len
        if self.own:
            flags = ctx.tensor("token_addr_flag_struct")
            while self.self_idx < t.shape.BS:
                i = self.self_idx
                self.self_idx += 1
                yield from ctx.wait(ctx.copy_in(self.flag, flags, i * FLAG_SIZE, FLAG_SIZE,
                                                name="send_token_info"))
                yield from ctx.drain()
                ctx.scalar(2)
                if int(ctx.ub_read(self.flag, U64, 1, ops=0)[0]) >> self.server & 1:
                    yield from self._copy(ctx.tensor("windows_out"), i * rec, just_exp, into)
                    return True
            return False
        win = ctx.window()
        at = self.base + token * rec
        polls = [Poll(win, at + rec, AllEqual(U64, SHOULD_SEND_FLAG_VALUE), self.flag, 8),
                 Poll(win, self.end_at, AllEqual(U64, END_OF_WRITE_FLAG_VALUE),
                      self.end_flag, 8)]
        which = yield from ctx.poll_round_robin(polls, 0, name="get_arrived_token_info")
        ctx.scalar(3)
        if which == 1:  # the end flag: this token is there if its own flag is
            yield from ctx.wait(ctx.copy_in(self.flag, win, at, FLAG_SIZE, name="token_flag"))
            yield from ctx.drain()
            if int(ctx.ub_read(self.flag, U64, 1, ops=1)[0]) != SHOULD_SEND_FLAG_VALUE:
                return False
        yield from self._copy(win, at, just_exp, into)
        return True

    def _copy(self, region: Any, at: int, just_exp: bool, into: Any) -> Wait:
        t = self.t
        if just_exp:
            op = self.ctx.copy_in(into, region, at + t.exp_offset, t.exp_len, name="token_exp")
        else:
            op = self.ctx.copy_in(into, region, at, t.struct_len, name="token_struct")
        yield from self.ctx.wait(op)
        yield from self.ctx.drain()
