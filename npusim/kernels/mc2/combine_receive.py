"""The combine's receive (LocalWindowCopy): each core sweeps its pending tokens round robin,
one flag probe each (A3: the (K + S) 32 B flags; 950: every 512 B block's 1.0 flags), and
sums a token once complete (docs/kernels/mc2.md)."""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.common.status import SPLIT_BLOCK_DATA_SIZE, WIN_ADDR_ALIGN
from npusim.kernels.mc2.active_mask import active_token_count, copy_mask_rows, row_sum_instrs
from npusim.kernels.mc2.combine_expert import process_expert
from npusim.kernels.mc2.combine_perf import PerfInfo
from npusim.kernels.mc2.combine_send import int8_send_bytes
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.quant import token_dtype
from npusim.runtime.conditions import AllEqual, Condition, SumEquals, Wait
from npusim.runtime.context import KernelContext, Poll, Strided
from npusim.units import align32, ceil_div

F32 = np.float32


class SlotFlags(Condition):
    """NeedWaitTokenSlot: every 1.0 flag of the 512 B blocks of the slots a token waits
    for (masked pairs and special experts send nothing); `wanted` per polled block."""

    def __init__(self, wanted: np.ndarray) -> None:
        self.wanted = wanted

    def _flags(self, data: np.ndarray) -> np.ndarray:
        return data.view(F32).reshape(-1, 8)[self.wanted]

    def __call__(self, data: np.ndarray) -> bool:
        return bool(np.all(self._flags(data) == 1.0))

    def describe(self, data: np.ndarray) -> str:
        f = self._flags(data)
        return f"expects {f.size} flags of the awaited slots == 1.0; {int((f != 1).sum())} differ"


def receive(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """LocalWindowCopy: round robin over my pending tokens; sum a token once complete."""
    bs = t.bs(ctx.rank_id)
    ids = ctx.tensor("expert_ids").as_array(np.int32).reshape(bs, t.K)
    live, tokens = yield from _active_tokens(ctx, t, bs)
    b0, b1 = split_to_core(tokens.size, t.cores, ctx.core_id)
    if b1 <= b0:
        return
    first, last = int(tokens[b0]), int(tokens[b1 - 1])
    es = yield from _expert_scale_copy(ctx, t, bs, first, last)
    rx = _Receive(ctx, t, state, ids, live, es, first)
    pending = [int(v) for v in tokens[b0:b1]]
    start = 0
    while pending:
        # WaitDispatch(tokenIndex) of DeepEP's fork: the tokens in order, each waited for
        waiting = pending[:1] if t.combine_tokens_in_order else pending
        j = yield from rx.wait_dispatch(waiting, start)
        tok = pending.pop(j)
        start = j
        yield from rx.combine_token(tok)
    if rx.perf is not None:
        yield from rx.perf.write()
    yield from ctx.drain()


def _expert_scale_copy(ctx: KernelContext, t: Mc2Tiling, bs: int, first: int, last: int) -> Wait:
    """ExpertScaleCopy: the scales of my first to last token (or of all), rows from `first`;
    None without expert_scales."""
    if not t.expert_scales:
        return None
    K = t.K
    lo = 0 if t.whole_expert_scales else first
    span = (bs if t.whole_expert_scales else last - first + 1) * K
    es_buf = ctx.alloc("expert_scales", align32(4 * span))
    yield from ctx.wait(
        ctx.copy_in(
            es_buf, ctx.tensor("expert_scales"), 4 * lo * K, 4 * span, name="copy_expert_scales"
        )
    )
    return ctx.ub_read(es_buf, F32, span, ops=0).reshape(-1, K)[first - lo :]


class _Receive:
    """The receive's buffers (BuffInit) and per-token steps: WaitDispatch over the pending
    tokens, then per complete token ProcessExpert and its output."""

    def __init__(
        self,
        ctx: KernelContext,
        t: Mc2Tiling,
        state: int,
        ids: np.ndarray,
        live: np.ndarray,
        es: np.ndarray | None,
        first: int,
    ) -> None:
        self.ctx, self.t, self.state = ctx, t, state
        self.ids, self.live, self.es, self.first = ids, live, es, first
        h, KS = t.H, t.K + t.S
        self.arch35 = arch35 = t.arch == "arch35"
        self.dt = token_dtype(t.shape.dtype)
        self.blocks = blocks = t.window.combine_step // WIN_ADDR_ALIGN
        flag_bytes = KS * blocks * 32 if arch35 else KS * 32
        self.flags = ctx.alloc("state", align32(flag_bytes))
        self.zeros = zeros = ctx.alloc("state_reset", align32(blocks * 32 if arch35 else KS * 32))
        ctx.vector(
            "dup_reset",
            zeros.nbytes // 4,
            F32,
            writes=[zeros],
            fn=lambda: zeros.view(np.uint8).fill(0),
        )
        row_bytes = (
            blocks * SPLIT_BLOCK_DATA_SIZE
            if arch35
            else (align32(int8_send_bytes(h)) if t.combine_quant == "int8" else align32(2 * h))
        )
        self.rows = [ctx.alloc(f"moe_sum{p}", row_bytes) for p in range(2)]
        self.acc = ctx.alloc("sum_f32", align32(4 * h))
        self.out = ctx.alloc("token_out", align32(2 * h))
        self.dfx = ctx.alloc("op_pos", 32)
        self.scratch = ctx.alloc("special_row", align32(2 * h)) if t.shape.special_experts else None
        if arch35:  # a GatherMask and a CompareScalar over the block flags, a scalar scan
            nflags = KS * blocks * 8
            self.check = ctx.check_ns(2 * ceil_div(nflags, 64), instrs=2, scalar=2 + nflags / 64)
        else:
            self.check = ctx.check_ns(ceil_div(KS * 8, 64))
        # the flags a token waits for: its live MoE pairs (special experts send none) and S
        self.valid = ((ids < t.shape.E) & live).sum(axis=1)
        self.pos = 1
        self.perf = PerfInfo(ctx, t, ids, live) if t.performance_info else None
        if self.perf is not None and not arch35:  # PerformanceInfoPerToken on every probe
            self.check += 6 * KS * ctx.issue_ns

    def wait_dispatch(self, waiting: list[int], start: int) -> Wait:
        """WaitDispatch: one flag probe per waiting token, round robin from `start`, until
        one is complete. Returns its index in `waiting`."""
        ctx, t, state = self.ctx, self.t, self.state
        win_r, lay = ctx.window(), t.window
        K, KS, blocks = t.K, t.K + t.S, self.blocks
        polls = []
        for tok in waiting:
            if self.arch35:
                skip = [
                    k < K and not (self.live[tok, k] and self.ids[tok, k] < t.shape.E)
                    for k in range(KS)
                ]
                cond = (
                    AllEqual(F32, 1.0)
                    if not any(skip)
                    else SlotFlags(np.repeat(~np.array(skip), blocks))
                )
                polls.append(
                    Poll(
                        win_r,
                        lay.combine_slot_offset(state, tok, 0) + 480,
                        cond,
                        self.flags,
                        strided=Strided(KS * blocks, 32, src_gap=480),
                        check_ns=self.check,
                    )
                )
            else:
                polls.append(
                    Poll(
                        win_r,
                        lay.combine_flag(state, tok, 0),
                        SumEquals(F32, 8.0 * (self.valid[tok] + t.S), tolerance=0.49),
                        self.flags,
                        nbytes=KS * 32,
                        check_ns=self.check,
                    )
                )
        perf = self.perf
        seen = perf.a3_observer(waiting, polls) if perf is not None and not self.arch35 else None
        j = yield from ctx.poll_round_robin(
            polls, start % len(waiting), name="wait_tokens", observe=seen
        )
        return j

    def combine_token(self, tok: int) -> Wait:
        """A complete token: its flags reset, the op position, ProcessExpert, (950)
        ClearPackedTokenFlags, then the fp32 sum cast and written to x."""
        ctx, t, state = self.ctx, self.t, self.state
        win_r, lay = ctx.window(), t.window
        h, KS, dt = t.H, t.K + t.S, self.dt
        if self.perf is not None:
            if self.arch35:
                yield from self.perf.a5_record(tok, state, self.blocks)
            else:
                self.perf.a3_settle()
        if not self.arch35:  # reset the flags
            ctx.copy_out(
                win_r, lay.combine_flag(state, tok, 0), self.zeros, KS * 32, name="reset_flags"
            )
        self.pos += 1
        yield from ctx.pipe_barrier("mte3")
        ctx.ub_write(self.dfx, 0, np.array([self.pos], np.uint32))
        ctx.copy_out(win_r, lay.combine_state_word(ctx.core_id) + 4, self.dfx, 4, name="op_pos")
        yield from process_expert(
            ctx,
            t,
            state,
            tok,
            np.where(self.live[tok], self.ids[tok], -1),
            None if self.es is None else self.es[tok - self.first],
            self.rows,
            self.acc,
            self.blocks,
            dt,
            self.scratch,
        )
        if self.arch35:  # ClearPackedTokenFlags: per slot, its blocks' flags
            for k in range(KS):
                ctx.copy_out(
                    win_r,
                    lay.combine_slot_offset(state, tok, k) + 480,
                    self.zeros,
                    0,
                    strided=Strided(self.blocks, 32, dst_gap=480),
                    name="clear_flags",
                )
        yield from ctx.pipe_barrier("mte3")  # the output buffer's last copy has left
        acc, out = self.acc, self.out

        def cast() -> None:
            out.view(dt, h)[:] = acc.view(F32, h).astype(dt)

        ctx.vector("cast_out", h, F32, reads=[acc], writes=[out], fn=cast)
        yield from ctx.pipe_barrier("vector")
        ctx.copy_out(ctx.tensor("x"), tok * 2 * h, out, 2 * h, name="write_x")


def _active_tokens(ctx: KernelContext, t: Mc2Tiling, bs: int) -> Wait:
    """TokenMaskCalCnt / ExpertMaskCalCnt: (live pairs (BS, K), active tokens in order)."""
    K = t.K
    live = np.ones((bs, K), bool)
    if t.x_active_mask == "none":
        return live, np.arange(bs)
    buf = ctx.alloc("mask", align32(bs * align32(K)) * 2)
    if t.x_active_mask == "1d":
        a = yield from active_token_count(ctx, buf, bs)
        live[a:] = False
        return live, np.arange(a)
    yield from copy_mask_rows(ctx, buf, bs, K, "copy_mask")
    ctx.vector_seq(
        "expert_mask",
        [*row_sum_instrs(bs, K), ("compare", bs, np.float16), ("gather_mask", bs, np.int32)],
        reads=[buf],
    )
    yield from ctx.pipe_barrier("vector")
    live = ctx.tensor("x_active_mask").as_array(np.uint8).astype(bool).reshape(bs, K)
    return live, np.flatnonzero(live.any(axis=1))
