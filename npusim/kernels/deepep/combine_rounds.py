"""CamMoeCombineNormalMultiRound (csrc/deepep/ops/op_kernel/cam_moe_combine_normal_multi_round.h,
tiling key 13001 on the A3; ops2's copy, key 10001, on the A2; 15001 on the 950) as a
per-core program. The host tiling picks it whenever the maxRound deep_ep.cpp passes is above
1 (DEEPEP_NORMAL_LONG_SEQ_ROUND with DEEPEP_NORMAL_COMBINE_ENABLE_LONG_SEQ=1), whatever the
tokens; it runs realRound = ceil(realMaxBs / perRoundTokens) rounds.

Init: InitMagic (as the one-round kernel), the DCCI of ep_recv_count[E - 1], then
- InitRoundSendData: the E (local expert, source rank) blocks of ep_recv_count split over the
  cores (SplitCoreCal; the 950 splits the rows instead, combine_rounds_a5.py); per block its
  first row (roundSendOffset) and its rows (roundNeedSendCnt); a 128-entry srcInfo batch
  buffer, the 1.0 state entry, two row buffers;
- InitRoundRecvData: the receive buffers, the round flag buffers, the weights and ids of at
  most perRoundTokens / aivNum + 1 tokens.

Per round (Process):
- CopyBufferToShareAndSetStatus: per block, at most perRoundTokens rows, stopping at the first
  whose srcTokenId belongs to a later round; srcInfo loaded 128 triples at a time; per row
  CopyBufferToShare (recv_x row GM -> UB -> the source rank's buffer roundMagic at slot
  (srcTokenId % perRoundTokens) K + k), PipeBarrier<PIPE_ALL>, SetStatusBySrcInfo (32 B of
  1.0 at roundMagic's status half);
- ReadBufferFromRemote: the round's min(perRoundTokens, tokens left) split over the cores; per
  token WaitBuffCopy and ReadBufferAndWeightedSum as the one-round kernel, from roundMagic's
  status and buffer, into x at xOutTokenOffset + the round's index. A core with no token of
  the round returns before advancing its count of tokens left and its offset (the source's
  order): it only happens when perRoundTokens is below the core count, and then that core has
  no token in any later round either;
- with more than one round: core 0's SetRoundStatus / WaitRoundStatus at the combine's own
  round flags, roundMagic flips, SyncAll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.combine import RecvBuffers, init_magic, receive_token, recv_buffers
from npusim.kernels.deepep.combine_rounds_a5 import token_balanced_blocks
from npusim.kernels.deepep.dispatch import round_status
from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align_up

I32, F32 = np.int32, np.float32
BATCH_SRC_INFO_CNT = 128  # srcInfo triples per DataCopyPad
TOKEN_SRC_INFO_LEN = 3  # (rank, token, k)


@dataclass
class SendState:
    """One core's blocks: roundSendOffset / roundNeedSendCnt, advanced each round."""

    offsets: list[int]
    counts: list[int]
    need: int  # needSendTokenCnt_
    src_info: Any
    set_state: Any
    local_copy: tuple[Any, Any]


@dataclass
class RecvState:
    """One core's totalNeedRecvTokenCnt_ and xOutTokenOffset_, and its UB."""

    need: int
    offset: int
    bufs: RecvBuffers
    weights: Any
    ids: Any
    set_round: Any
    wait_round: Any


def combine_rounds_program(t: DeepepTiling):
    def program(ctx: KernelContext) -> Wait:
        half = init_magic(ctx, t)
        ctx.dcache.dcci_line(ctx.tensor("ep_recv_count"), 4 * (t.E - 1))
        ctx.ub.reset()
        if t.platform == "a5":  # InitTokenBalancedRoundSendDataA5
            blocks = yield from token_balanced_blocks(ctx, t)
            send = None if blocks is None else send_state(ctx, t, *blocks)
        else:
            send = yield from init_round_send_data(ctx, t)
        recv = init_round_recv_data(ctx, t)
        win = t.window
        rounds = t.real_round
        round_magic = 0
        for r in range(rounds):
            with ctx.phase("copy_to_share"):
                yield from copy_buffer_to_share_and_set_status(ctx, t, send, half, round_magic, r)
            with ctx.phase("read_from_remote"):
                yield from read_buffer_from_remote(ctx, t, recv, half, round_magic)
            if rounds > 1:
                with ctx.phase("round_sync"):
                    if ctx.core_id == 0:
                        yield from round_status(
                            ctx, t, lambda src, m=round_magic: win.combine_round_flag(m, src),
                            recv.set_round, recv.wait_round)
                    round_magic ^= 1
                    yield from ctx.sync_all()
        yield from ctx.pipe_barrier("mte3")

    return program


def init_round_send_data(ctx: KernelContext, t: DeepepTiling) -> Wait:
    """InitRoundSendData (the A3/A2 path): the core's blocks from ep_recv_count."""
    b0, b1 = split_to_core(t.E, ctx.num_cores, ctx.core_id)
    n = b1 - b0
    if n <= 0:
        return None
    counts_buf = ctx.alloc("temp_recv_count", align_up(4 * n, 32))
    ctx.alloc("round_need_send_cnt", align_up(4 * n, 32))
    ctx.alloc("round_send_offset", align_up(4 * n, 32))
    recv = ctx.tensor("ep_recv_count")
    yield from ctx.wait(ctx.copy_in(counts_buf, recv, 4 * b0, 4 * n))
    ends = [int(v) for v in ctx.ub_read(counts_buf, I32, n, ops=0)]
    pre = int(ctx.gm_read_scalar(recv, 4 * (b0 - 1), I32)) if b0 else 0
    ctx.scalar(4 + 4 * n)  # preRecvCount_, needSendTokenCnt_, the blocks' offsets and counts
    offsets = [pre, *ends[:-1]]
    counts = [e - o for e, o in zip(ends, offsets, strict=True)]
    return send_state(ctx, t, offsets, counts, ends[-1] - pre)


def send_state(ctx: KernelContext, t: DeepepTiling, offsets: list[int], counts: list[int],
               need: int) -> SendState:
    """The core's blocks and the sends' UB: the 128-entry srcInfo batch buffer, the 1.0
    state entry, two row buffers."""
    src_info = ctx.alloc("src_info", align_up(BATCH_SRC_INFO_CNT * TOKEN_SRC_INFO_LEN * 4, 32))
    set_state = ctx.alloc("set_state", 32)
    ctx.vector("duplicate", 8, I32, writes=[set_state],
               fn=lambda: set_state.bytes_at(0, 32).view(F32).fill(1.0))
    row = align_up(2 * t.H, 32)
    local_copy = (ctx.alloc("local_copy0", row), ctx.alloc("local_copy1", row))
    return SendState(offsets, counts, need, src_info, set_state, local_copy)


def init_round_recv_data(ctx: KernelContext, t: DeepepTiling) -> RecvState:
    bufs = recv_buffers(ctx, t)
    flags = 32 * t.W
    set_round = ctx.alloc("set_round_state", flags)
    wait_round = ctx.alloc("wait_round_state", flags)
    ctx.alloc("temp_round_state", flags)
    most = (t.per_round_tokens // ctx.num_cores + 1) * t.K * 4
    ids = ctx.alloc("token_idx", align_up(most, 32))
    weights = ctx.alloc("topk_weights", align_up(most, 32))
    return RecvState(t.BS, 0, bufs, weights, ids, set_round, wait_round)


def copy_buffer_to_share_and_set_status(ctx: KernelContext, t: DeepepTiling, s: SendState | None,
                                        half: int, round_magic: int, r: int) -> Wait:
    if s is None or s.need == 0:
        return
    K, prt = t.K, t.per_round_tokens
    row = 2 * t.H
    win = t.window
    x, src_gm = ctx.tensor("x"), ctx.tensor("expand_idx")
    q = 0
    info: Any = None
    for b in range(len(s.offsets)):
        ctx.loop(1)
        ctx.scalar(3)  # roundMaxSendCount, sendTokenOffset
        most = min(s.counts[b], prt)
        sent = 0
        while sent < most:
            ctx.loop(1)
            i = s.offsets[b] + sent  # recvXTokenIdx
            in_batch = sent % BATCH_SRC_INFO_CNT
            ctx.scalar(2)
            if in_batch == 0:
                cnt = min(BATCH_SRC_INFO_CNT, most - sent)
                yield from ctx.wait(ctx.copy_in(s.src_info, src_gm, 12 * i, 12 * cnt,
                                                name="src_info"))
                info = ctx.ub_read(s.src_info, I32, 3 * cnt, ops=0).reshape(cnt, 3)
            ctx.scalar(3)  # srcRankId, srcTokenId, the round's end
            src, tok, k = (int(v) for v in info[in_batch])
            if tok >= (r + 1) * prt:
                break
            ctx.scalar(2)  # srcTopkId, roundTokenId
            slot = (tok % prt) * K + k
            buf = s.local_copy[q & 1]
            q += 1
            yield from ctx.wait(ctx.copy_in(buf, x, i * row, row, name="load_row"))
            ctx.put(src, win.combine_round_data(half, round_magic, slot), buf, row,
                    name="copy_to_share")
            yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
            ctx.put(src, win.combine_round_status(half, round_magic, slot), s.set_state, 32,
                    name="set_status")
            sent += 1
        s.offsets[b] += sent
        s.counts[b] -= sent
        s.need -= sent
    yield from ctx.pipe_barrier("mte3")  # SyncFunc<MTE3_S>


def read_buffer_from_remote(ctx: KernelContext, t: DeepepTiling, s: RecvState, half: int,
                            round_magic: int) -> Wait:
    if s.need == 0:
        return
    total = min(t.per_round_tokens, s.need)  # roundTotalRecvTokenCnt_
    t0, t1 = split_to_core(total, ctx.num_cores, ctx.core_id)
    if t1 <= t0:
        return
    n, K = t1 - t0, t.K
    first = (s.offset + t0) * K
    ctx.copy_in(s.weights, ctx.tensor("topk_weights"), 4 * first, 4 * n * K)
    ctx.copy_in(s.ids, ctx.tensor("topk_idx"), 4 * first, 4 * n * K)
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    weights = ctx.ub_read(s.weights, F32, n * K, ops=0).reshape(n, K)
    ids = ctx.ub_read(s.ids, I32, n * K, ops=0).reshape(n, K)
    win = t.window
    for j in range(n):
        tok = t0 + j  # roundTokenIdx
        status = win.combine_round_status(half, round_magic, tok * K)
        yield from receive_token(
            ctx, t, s.bufs, ids[j], weights[j], status,
            lambda k, tok=tok: win.combine_round_data(half, round_magic, tok * K + k),
            s.offset + tok)
    # npusim's bookkeeping, not a device step: these slots are consumed, and two rounds on
    # the same roundMagic puts them again
    at = win.combine_round_status(half, round_magic, t0 * K)
    ctx.window().release(at, 32 * n * K)
    at = win.combine_round_data(half, round_magic, t0 * K)
    ctx.window().release(at, win.combine_row * n * K)
    s.need -= total
    s.offset += total
