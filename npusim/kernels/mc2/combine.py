"""MoeDistributeCombineV2 (A3, arch22) and MoeDistributeCombineV2A5Mte (950, arch35) as
per-core programs (docs/kernels/mc2.md).

A3: rows split evenly over the cores, two rows per MTE3 barrier, then their two 32 B flags;
each core sweeps its pending tokens round robin, one (K + S) * 32 B flag probe each.
950: one row per step in a permuted order, packed 480 B data + 32 B of 1.0 per 512 B block
(data as flag, no flag put); a token is complete when all its blocks' flags read 1.0.

GM tensors per rank: expand_x (the experts' rows), assist_info_for_combine, ep_recv_count,
expert_ids, [expert_scales], [shared_expert_x], [ori_x, const_*] in; x out.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.kernels.common.align import align32, ceil_div
from npusim.kernels.common.split import split_to_core
from npusim.kernels.common.status import SPLIT_BLOCK_DATA_SIZE, WIN_ADDR_ALIGN
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2.reference import const_expert_row
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.mc2.window import a5_int8_combine_bytes
from npusim.kernels.quant import (
    int8_block_dequantize,
    int8_block_quantize,
    int8_block_scale_count,
    token_dtype,
)
from npusim.runtime.conditions import AllEqual, Condition, SumEquals
from npusim.runtime.context import KernelContext, Poll, Strided

Wait = Generator[Any, Any, Any]
F32 = np.float32
PHASES = ("send", "receive")


def int8_send_bytes(h: int) -> int:
    """tokenScaleCnt_ in bytes: Align32(H) int8 + Align16(H) / 8 scales in the token dtype."""
    return align32(h) + 2 * int8_block_scale_count(h)


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


# --------------------------------------------------------------------------- send
def send(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    rank = ctx.rank_id
    counts = ctx.tensor("ep_recv_count")
    last = (t.W if t.is_shared_rank(rank) else t.W * t.L) - 1
    total = int(ctx.gm_read_scalar(counts, 4 * last, np.int32))  # DataCacheCleanAndInvalid
    r0, r1 = split_to_core(total, t.cores, ctx.core_id)
    n = r1 - r0
    if n == 0:
        return
    h = t.H
    arch35 = t.arch == "arch35"
    cslot = t.window.combine_step
    blocks = cslot // WIN_ADDR_ALIGN
    int8 = t.combine_quant == "int8"
    mx = qm.COMBINE_MX.get(t.combine_quant)  # the 950's MXFP8 (fp8 format), else None
    idx = ctx.alloc("expand_idx", align32(12 * n))
    yield from ctx.wait(ctx.copy_in(idx, ctx.tensor("assist_info_for_combine"), 12 * r0,
                                    12 * n, name="copy_assist_info"))
    trip = ctx.ub_read(idx, np.int32, 3 * n, ops=0).reshape(n, 3)
    row_in = blocks * SPLIT_BLOCK_DATA_SIZE if arch35 and not int8 else align32(2 * h)
    if mx:
        row_in = qm.input_bytes(h)  # hExpandXAlignSize_: Align128(H) elements
    ins = [ctx.alloc(f"row{p}", row_in) for p in range(2)]
    quants = ins  # what the 950 packs: the row, or its INT8 / MXFP8 bytes
    if arch35:
        if int8 or mx:
            quants = [ctx.alloc(f"quant{p}", blocks * SPLIT_BLOCK_DATA_SIZE) for p in range(2)]
        for b in quants:  # the packing Copy reads blocks * 480 B: keep the tail defined
            ctx.vector("dup_zero", b.nbytes, np.uint8, writes=[b], fn=lambda b=b: b.view(
                np.uint8).fill(0))
        outs = [ctx.alloc(f"packed{p}", cslot) for p in range(2)]
    elif int8:
        outs = [ctx.alloc(f"quant{p}", align32(int8_send_bytes(h))) for p in range(2)]
    else:
        outs = ins
    flag = ctx.alloc("flag", 32)
    ctx.vector("dup_flag", 8, F32, writes=[flag], fn=lambda: flag.view(F32).fill(1.0))
    yield from ctx.pipe_barrier("vector")
    puts: list[Any] = [None, None]
    win = t.window
    x = ctx.tensor("expand_x")

    def one_row(p: int, i: int) -> Wait:
        dst, token, k = (int(v) for v in trip[i])
        if puts[p] is not None:
            yield from ctx.wait(puts[p])
        buf, out = ins[p], outs[p]
        if mx:  # Duplicate(QUANT_PADDING_VALUE) over Align128(H) elements
            qm.zero_fill(ctx, buf, h, t.timing_only)
        if arch35:
            yield from ctx.pipe_barrier("vector")
        yield from ctx.wait(ctx.copy_in(buf, x, (r0 + i) * 2 * h, 2 * h, name="load_row"))
        nbytes = 2 * h
        if arch35:
            if int8:  # QuantProcess, PipeBarrier<PIPE_V>, then the packing
                _quant_int8(ctx, t, buf, quants[p], a5_int8_combine_bytes(h))
                yield from ctx.pipe_barrier("vector")
            elif mx:
                _quant_mx(ctx, t, buf, quants[p], mx)
                yield from ctx.pipe_barrier("vector")
            _pack(ctx, quants[p], out, blocks)
            yield from ctx.pipe_barrier("vector")
            nbytes = cslot
        elif int8:
            _quant_int8(ctx, t, buf, out, int8_send_bytes(h))
            yield from ctx.pipe_barrier("vector")
            nbytes = int8_send_bytes(h)
        puts[p] = ctx.put(dst, win.combine_slot_offset(state, token, k), out, nbytes,
                          name="put_row")
        return dst, token, k

    if arch35:  # one row per step, permuted order (stride n/2 + 1, coprime with n)
        stride = 1 if n <= 2 else n // 2 + 1
        if n > 2 and n % 2 == 0 and stride % 2 == 0:
            stride += 1
        i = rank * n // t.W % n
        for _ in range(n):
            ctx.scalar(6)
            yield from one_row(_ % 2, i)
            i = (i + stride) % n
    else:  # two rows (DeepEP's fork: one), one MTE3 barrier, their flags
        loop = 0
        while loop < n:
            pair = [(loop + j + rank) % n for j in range(min(t.combine_send_rows, n - loop))]
            ctx.scalar(6 * len(pair))
            sent = []
            for p, i in enumerate(pair):
                sent.append((yield from one_row(p, i)))
            ctx.mte_fence("mte3")  # PipeBarrier<PIPE_MTE3>
            for dst, token, k in sent:
                ctx.put(dst, win.combine_flag(state, token, k), flag, 32, name="put_flag")
            loop += len(pair)
    yield from ctx.pipe_barrier("mte3")


def _pack(ctx: KernelContext, src, out, blocks: int) -> None:
    """Duplicate 1.0 over the slot, two strided Copy: 480 B of data into every 512 B block."""
    def dup() -> None:
        out.view(F32).fill(1.0)

    def copy() -> None:
        o = out.view(np.uint8).reshape(blocks, WIN_ADDR_ALIGN)
        o[:, :SPLIT_BLOCK_DATA_SIZE] = src.view(np.uint8).reshape(blocks, SPLIT_BLOCK_DATA_SIZE)

    ctx.vector("dup_flags", out.nbytes // 4, F32, writes=[out], fn=dup)
    ctx.vector_seq("pack_copy", [("copy_a", 64 * blocks, F32), ("copy_b", 56 * blocks, F32)],
                   reads=[src], writes=[out], fn=copy)


def _quant_int8(ctx: KernelContext, t: Mc2Tiling, src, out, nbytes: int) -> None:
    """Int8QuantProcess: per 8 fp32 a max, scale = max / 127 in the token dtype, q = rint.
    `nbytes`: Align32(H) int8 and the scales (A3: Align16(H) / 8 of them; the 950:
    Align128(H) / 8, those past H of zero-padded blocks 0)."""
    h = t.H
    dt = token_dtype(t.shape.dtype)

    def effect() -> None:
        q, s = int8_block_quantize(src.bytes_at(0, 2 * h).view(dt)[None, :], recip=True,
                                   scale_dtype=dt)
        o = out.bytes_at(0, nbytes)
        o[:align32(h)] = q[0].view(np.uint8)
        sb = s[0].view(np.uint8)
        o[align32(h):align32(h) + sb.size] = sb
        o[align32(h) + sb.size:] = 0

    nb = ceil_div(h, 8)
    ctx.vector_seq("int8_quant", [
        ("cast_f32", h, F32), ("abs", h, F32), ("block_reduce_max", h, F32),
        ("muls", nb, F32), ("cast_scale", nb, F32), ("brcb", h, F32), ("div", h, F32),
        ("cast_f16", h, F32), ("cast_i8", h, np.float16)],
        reads=[src], writes=[out], fn=None if t.timing_only else effect)


def _quant_mx(ctx: KernelContext, t: Mc2Tiling, src, out, fp8: str) -> None:
    """QuantMxFp8 (the 950): ComputeMaxExp, ComputeScale, ComputeFp8Data into `out`."""
    h = t.H
    dt = token_dtype(t.shape.dtype)

    def effect() -> None:
        qm.combine_quantise(src.bytes_at(0, 2 * h).view(dt), fp8, out.bytes_at(0, out.nbytes))

    ctx.vf("mxfp8_quant", qm.combine_quant_vfs(h, dt == np.float16), reads=[src], writes=[out],
           fn=None if t.timing_only else effect)


# --------------------------------------------------------------------------- receive
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
    rank = ctx.rank_id
    bs = t.bs(rank)
    h, K, S = t.H, t.K, t.S
    ids = ctx.tensor("expert_ids").as_array(np.int32).reshape(bs, K)
    live, tokens = yield from _active_tokens(ctx, t, bs)
    b0, b1 = split_to_core(tokens.size, t.cores, ctx.core_id)
    if b1 <= b0:
        return
    first, last = int(tokens[b0]), int(tokens[b1 - 1])
    KS = K + S
    arch35 = t.arch == "arch35"
    dt = token_dtype(t.shape.dtype)
    win_r = ctx.window()
    lay = t.window
    cslot = lay.combine_step
    blocks = cslot // WIN_ADDR_ALIGN
    has_es = t.expert_scales
    es = None
    if has_es:  # ExpertScaleCopy: the scales of my first to last token (or of all)
        lo = 0 if t.whole_expert_scales else first
        span = (bs if t.whole_expert_scales else last - first + 1) * K
        es_buf = ctx.alloc("expert_scales", align32(4 * span))
        yield from ctx.wait(ctx.copy_in(es_buf, ctx.tensor("expert_scales"), 4 * lo * K,
                                        4 * span, name="copy_expert_scales"))
        es = ctx.ub_read(es_buf, F32, span, ops=0).reshape(-1, K)[first - lo:]
    flag_bytes = KS * blocks * 32 if arch35 else KS * 32
    flags = ctx.alloc("state", align32(flag_bytes))
    zeros = ctx.alloc("state_reset", align32(blocks * 32 if arch35 else KS * 32))
    ctx.vector("dup_reset", zeros.nbytes // 4, F32, writes=[zeros],
               fn=lambda: zeros.view(np.uint8).fill(0))
    row_bytes = blocks * SPLIT_BLOCK_DATA_SIZE if arch35 else (
        align32(int8_send_bytes(h)) if t.combine_quant == "int8" else align32(2 * h))
    rows = [ctx.alloc(f"moe_sum{p}", row_bytes) for p in range(2)]
    acc = ctx.alloc("sum_f32", align32(4 * h))
    out = ctx.alloc("token_out", align32(2 * h))
    dfx = ctx.alloc("op_pos", 32)
    scratch = ctx.alloc("special_row", align32(2 * h)) if t.shape.special_experts else None
    if arch35:  # a GatherMask and a CompareScalar over the block flags, a scalar scan
        nflags = KS * blocks * 8
        check = ctx.check_ns(2 * ceil_div(nflags, 64), instrs=2, scalar=2 + nflags / 64)
    else:
        check = ctx.check_ns(ceil_div(KS * 8, 64))
    pending = [int(v) for v in tokens[b0:b1]]
    # the flags a token waits for: its live MoE pairs (special experts send none) and S
    valid = ((ids < t.shape.E) & live).sum(axis=1)
    start = 0
    pos = 1
    out_x = ctx.tensor("x")
    perf = PerfInfo(ctx, t, ids, live) if t.performance_info else None
    if perf is not None and not arch35:  # PerformanceInfoPerToken on every probe
        check += 6 * KS * ctx.issue_ns
    while pending:
        polls = []
        # WaitDispatch(tokenIndex) of DeepEP's fork: the tokens in order, each waited for
        waiting = pending[:1] if t.combine_tokens_in_order else pending
        for tok in waiting:
            if arch35:
                skip = [k < K and not (live[tok, k] and ids[tok, k] < t.shape.E)
                        for k in range(KS)]
                cond = (AllEqual(F32, 1.0) if not any(skip)
                        else SlotFlags(np.repeat(~np.array(skip), blocks)))
                polls.append(Poll(win_r, lay.combine_slot_offset(state, tok, 0) + 480, cond, flags,
                                  strided=Strided(KS * blocks, 32, src_gap=480), check_ns=check))
            else:
                polls.append(Poll(win_r, lay.combine_flag(state, tok, 0),
                                  SumEquals(F32, 8.0 * (valid[tok] + S), tolerance=0.49),
                                  flags,
                                  nbytes=KS * 32, check_ns=check))
        seen = perf.a3_observer(waiting, polls) if perf is not None and not arch35 else None
        j = yield from ctx.poll_round_robin(polls, start % len(waiting), name="wait_tokens",
                                            observe=seen)
        tok = pending.pop(j)
        start = j
        if perf is not None:
            if arch35:
                yield from perf.a5_record(tok, state, blocks)
            else:
                perf.a3_settle()
        if not arch35:  # reset the flags
            ctx.copy_out(win_r, lay.combine_flag(state, tok, 0), zeros, KS * 32,
                         name="reset_flags")
        pos += 1
        yield from ctx.pipe_barrier("mte3")
        ctx.ub_write(dfx, 0, np.array([pos], np.uint32))
        ctx.copy_out(win_r, lay.combine_state_word(ctx.core_id) + 4, dfx, 4, name="op_pos")
        yield from process_expert(ctx, t, state, tok, np.where(live[tok], ids[tok], -1),
                                  None if es is None else es[tok - first], rows, acc, blocks, dt,
                                  scratch)
        if arch35:  # ClearPackedTokenFlags: per slot, its blocks' flags
            for k in range(KS):
                ctx.copy_out(win_r, lay.combine_slot_offset(state, tok, k) + 480, zeros, 0,
                             strided=Strided(blocks, 32, dst_gap=480), name="clear_flags")
        yield from ctx.pipe_barrier("mte3")  # the output buffer's last copy has left

        def cast() -> None:
            out.view(dt, h)[:] = acc.view(F32, h).astype(dt)

        ctx.vector("cast_out", h, F32, reads=[acc], writes=[out], fn=cast)
        yield from ctx.pipe_barrier("vector")
        ctx.copy_out(out_x, tok * 2 * h, out, 2 * h, name="write_x")
    if perf is not None:
        yield from perf.write()
    yield from ctx.drain()


class PerfInfo:
    """performance_info of the receive (PerformanceInfoPerToken): per (token, slot) the
    first sighting of its flag, in whole us from the loop's start, maxed per source rank.

    A3 looks at every probe (a token's slots are seen as their flags land); the 950 only
    once a token is complete, re-checking each awaited slot's flags (one strided read,
    CompareScalar, a scalar scan). The operator's AtomicMax over the cores is modelled
    as one row per core in performance_info_cores (the report takes their max)."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling, ids: np.ndarray, live: np.ndarray
                 ) -> None:
        self.ctx, self.t = ctx, t
        K, S = t.K, t.S
        rank = ctx.rank_id
        need = np.ones((ids.shape[0], K + S), bool)
        need[:, :K] = live & (ids < t.shape.E)
        self.need = need  # NeedWaitTokenSlot
        src = np.zeros((ids.shape[0], K + S), np.int64)
        src[:, :K] = np.where(need[:, :K], ids // t.L + t.shape.S_r, 0)
        for j in range(S):
            src[:, K + j] = t.shared_dst(rank, j)
        self.src = src
        self.first = np.full(need.shape, -1.0)  # time of the first sighting, ns
        self.t0 = ctx.t
        self.perf = np.zeros(t.W, np.int64)
        self._pending: list[tuple[int, float, np.ndarray]] = []
        blocks = t.window.combine_step // WIN_ADDR_ALIGN
        self.flags_buf = (ctx.alloc("perf_flags", align32(32 * blocks))
                          if t.arch == "arch35" else None)

    def _record(self, tok: int, k: int, at: float) -> None:
        if self.need[tok, k] and self.first[tok, k] < 0:
            self.first[tok, k] = at
            us = int((at - self.t0) // 1000)  # GetSystemCycle() / CYCLES_PER_US
            s = int(self.src[tok, k])
            self.perf[s] = max(self.perf[s], us)

    # ---- A3: every probe reads the token's (K + S) flags
    def a3_observer(self, pending: list[int], polls: list[Poll]):
        self._pending = []

        def observe(i: int, at: float, data: np.ndarray) -> None:
            self._pending.append((pending[i], at, data.view(F32)[::8] > 0.5))
        return observe

    def a3_settle(self) -> None:
        """The sightings of the round just ended (reads up to its winner's), in time order."""
        end = self.ctx.t
        for tok, at, up in sorted(self._pending, key=lambda x: x[1]):
            if at <= end:
                for k in np.flatnonzero(up):
                    self._record(tok, int(k), at)
        self._pending = []

    # ---- 950: a complete token's slots checked one by one
    def a5_record(self, tok: int, state: int, blocks: int) -> Wait:
        """CheckPackedTokenArrive per awaited slot: Duplicate, one strided read of its
        blocks' 32 B flags, CompareScalar, a scalar scan; then the slot's time."""
        ctx, t = self.ctx, self.t
        buf = self.flags_buf
        win = ctx.window()
        for k in range(t.K + t.S):
            ctx.scalar(3)  # NeedWaitTokenSlot
            if not self.need[tok, k]:
                continue
            ctx.vector("perf_dup_flags", 8 * blocks, F32, writes=[buf])
            yield from ctx.pipe_barrier("vector")
            yield from ctx.wait(ctx.copy_in(buf, win, t.window.combine_slot_offset(state, tok, k)
                                            + 480, 0, name="perf_check_flags",
                                            strided=Strided(blocks, 32, src_gap=480)))
            ctx.vector("perf_compare", 8 * blocks, F32, reads=[buf])
            yield from ctx.pipe_barrier("vector")
            ctx.scalar(4)  # the first-zero scan and GetSystemCycle
            self._record(tok, k, ctx.t)

    def write(self) -> Wait:
        ctx, W = self.ctx, self.t.W
        pbuf = ctx.alloc("perf", align32(8 * W))
        ctx.ub_write(pbuf, 0, self.perf, ops=1)
        yield from ctx.wait(ctx.copy_out(ctx.tensor("performance_info_cores"),
                                         8 * W * ctx.core_id, pbuf, 8 * W,
                                         name="write_performance_info"))


def _active_tokens(ctx: KernelContext, t: Mc2Tiling, bs: int) -> Wait:
    """TokenMaskCalCnt / ExpertMaskCalCnt: (live pairs (BS, K), active tokens in order)."""
    K = t.K
    live = np.ones((bs, K), bool)
    if t.x_active_mask == "none":
        return live, np.arange(bs)
    raw = ctx.tensor("x_active_mask").as_array(np.uint8).astype(bool)
    buf = ctx.alloc("mask", align32(bs * align32(K)) * 2)
    if t.x_active_mask == "1d":
        yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("x_active_mask"), 0, bs,
                                        name="copy_mask"))
        ctx.vector_seq("token_mask", [("cast", bs, np.float16), ("sum", bs, np.float16)],
                       reads=[buf])
        yield from ctx.pipe_barrier("vector")
        a = int(np.count_nonzero(raw))
        live[a:] = False
        return live, np.arange(a)
    yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("x_active_mask"), 0, 0, name="copy_mask",
                                    strided=Strided(bs, K, dst_gap=align32(K) - K)))
    ctx.vector_seq("expert_mask", [("cast", bs * align32(K), np.float16),
                                   ("sum_k", bs * align32(K), np.float16),
                                   ("compare", bs, np.float16), ("gather_mask", bs, np.int32)],
                   reads=[buf])
    yield from ctx.pipe_barrier("vector")
    live = raw.reshape(bs, K)
    return live, np.flatnonzero(live.any(axis=1))


def process_expert(ctx: KernelContext, t: Mc2Tiling, state: int, tok: int, ids: np.ndarray,
                   es: np.ndarray | None, rows: list, acc, blocks: int, dt: np.dtype,
                   scratch=None) -> Wait:
    """ProcessExpert: fp32 sum of the token's K weighted rows, special experts, S shared."""
    h, K, S, E = t.H, t.K, t.S, t.shape.E
    Z, C = t.shape.zero_experts, t.shape.copy_experts
    win_r = ctx.window()
    lay = t.window
    arch35 = t.arch == "arch35"
    ctx.vector("dup_sum", h, F32, writes=[acc], fn=lambda: acc.view(F32, h).fill(0))
    loads: list[Any] = [None, None]
    p = 0
    for k in range(K + S):
        w = None
        if k < K:
            e = int(ids[k])
            if e < 0:  # masked pair (2-D x_active_mask)
                continue
            if es is not None:
                w = F32(es[k])
            if e >= E:
                if e < E + Z:
                    continue
                yield from _special(ctx, t, tok, e - E - Z - C, e < E + Z + C, w, acc, scratch)
                continue
        buf = rows[p]
        if loads[p] is not None:
            yield from ctx.pipe_barrier("vector")  # the buffer's previous sum has read it
        off = lay.combine_slot_offset(state, tok, k)
        if arch35:
            ld = ctx.copy_in(buf, win_r, off, 0, name="copy_slot",
                             strided=Strided(blocks, SPLIT_BLOCK_DATA_SIZE, src_gap=32))
        else:
            nb = int8_send_bytes(h) if t.combine_quant == "int8" else 2 * h
            ld = ctx.copy_in(buf, win_r, off, nb, name="copy_slot")
        loads[p] = ld
        yield from ctx.wait(ld)

        mx = qm.COMBINE_MX.get(t.combine_quant)

        def add(buf=buf, w=w, mx=mx) -> None:
            if mx:
                r = qm.combine_dequantise(buf.bytes_at(0, buf.nbytes), h, mx)
                a = acc.view(F32, h)
                a[:] = a + (r if w is None else r * w)
                return
            if t.combine_quant == "int8":  # the 950's bytes start as A3's (more scales)
                raw = buf.bytes_at(0, int8_send_bytes(h))
                q = raw[:align32(h)].view(np.int8)
                s = raw[align32(h):].view(dt)
                row = int8_block_dequantize(q[None, :], s[None, :], h, out_dtype=dt)[0]
            else:
                row = buf.bytes_at(0, 2 * h).view(dt)
            r = row.astype(F32)
            a = acc.view(F32, h)
            a[:] = a + (r if w is None else r * w)

        if mx:  # DeQuantMxFp8: dequantisation, weight and sum in one VF
            ctx.vf("sum_row", qm.combine_dequant_vf(h, w is not None), reads=[buf],
                   writes=[acc], fn=None if t.timing_only else add)
            p ^= 1
            continue
        seq = []
        if t.combine_quant == "int8" and arch35:
            # Int8DequantProcessA5: Cast + Brcb of the scales, then one fused loop per
            # element: int8 -> half -> fp32, Mul, Cast RINT to the dtype and back, Muls, Add
            nb8 = ceil_div(h, 128) * 16
            seq += [("cast_scale", nb8, np.float16), ("brcb", 8 * nb8, F32),
                    ("cast_i8_f16", h, np.int8), ("cast_f16_f32", h, np.float16),
                    ("mul", h, F32), ("cast_x", h, F32), ("cast_back", h, np.float16)]
        elif t.combine_quant == "int8":
            nb8 = ceil_div(h, 8)
            seq += [("cast_scale", nb8, np.float16), ("cast_i8_f16", h, np.int8),
                    ("cast_f16_f32", h, np.float16), ("brcb", h, F32), ("mul", h, F32),
                    ("cast_x", h, F32)]
        if not (t.combine_quant == "int8" and arch35):
            seq.append(("cast_f32", h, np.float16))
        if w is not None:
            seq.append(("muls", h, F32))
        seq.append(("add", h, F32))
        ctx.vector_seq("sum_row", seq, reads=[buf], writes=[acc],
                       fn=None if t.timing_only else add)
        p ^= 1
    if t.shared_expert_x:
        buf = rows[p]
        yield from ctx.pipe_barrier("vector")
        yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("shared_expert_x"), tok * 2 * h, 2 * h,
                                        name="copy_shared_x"))

        def add_x(buf=buf) -> None:
            a = acc.view(F32, h)
            a[:] = a + buf.bytes_at(0, 2 * h).view(dt).astype(F32)

        ctx.vector_seq("sum_shared_x", [("cast_f32", h, np.float16), ("add", h, F32)],
                       reads=[buf], writes=[acc], fn=None if t.timing_only else add_x)


def _special(ctx: KernelContext, t: Mc2Tiling, tok: int, c: int, copy: bool, w, acc,
             scratch) -> Wait:
    """ProcessCopyExpert (scale * ori_x) or ProcessConstantExpert (a1' x + a2' v): the rows
    are copied in (timed); the numbers come from the same GM bytes."""
    h = t.H
    dt = token_dtype(t.shape.dtype)
    yield from ctx.pipe_barrier("vector")
    names = ["ori_x"] if copy else ["ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
                                     "const_expert_v"]
    rows = []
    for name in names:
        row = tok if name == "ori_x" else c
        yield from ctx.wait(ctx.copy_in(scratch, ctx.tensor(name), row * 2 * h, 2 * h,
                                        name=f"copy_{name}"))
        rows.append(scratch.bytes_at(0, 2 * h).view(dt).copy())
        yield from ctx.pipe_barrier("vector")
    if copy:
        val = rows[0].astype(F32)
        seq = [("cast_f32", h, np.float16)]
    else:
        val = const_expert_row(*rows)
        seq = [("cast_f32", h, np.float16)] + [("cast_a", h, np.float16), ("mul", h, F32),
                                               ("sum", h, F32)] * 2
        seq += [("exp", 64, F32), ("cast_v", h, np.float16), ("muls_x", h, F32),
                ("muls_v", h, F32), ("add_xv", h, F32)]
    if w is not None:
        seq.append(("muls", h, F32))
    seq.append(("add", h, F32))

    def add() -> None:
        a = acc.view(F32, h)
        a[:] = a + (val if w is None else val * w)

    ctx.vector_seq("special_expert", seq, writes=[acc], fn=None if t.timing_only else add)
    yield from ctx.pipe_barrier("vector")
