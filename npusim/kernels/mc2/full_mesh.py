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
Quantisation is the fullmesh_v1 step (:func:`npusim.kernels.mc2.dispatch._quantise`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.kernels.common.align import align32, align_up, ceil_div
from npusim.kernels.common.drain import drain_round_robin, valid_expert_info
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.dispatch import (
    _cal_token_send_expert_cnt,
    _quantise,
    active_set,
    init_win_state,
    set_expert_token_nums,
    shared_items,
    wait_dispatch_clear_status,
)
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.mc2.window import SPLIT_BLOCK_DATA_SIZE, SPLIT_BLOCK_SIZE, STATE_OFFSET
from npusim.runtime.conditions import SumEquals
from npusim.runtime.context import KernelContext, Strided

Wait = Generator[Any, Any, Any]
F32, I32 = np.float32, np.int32
ONE = np.float32(1.0)
FLAG_DATA = SPLIT_BLOCK_DATA_SIZE  # a block's flag follows its 480 B of data


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


# --------------------------------------------------------------------------- expert ids
def exp_ids_copy_and_mask_cal(ctx: KernelContext, t: Mc2Tiling) -> Wait:
    """ExpIdsCopyAndMaskCal: the masks (the fullmesh_v1 instructions), then the BS * K ids
    into UB with every pair that does not travel set to -1 (Duplicate, DataCopyPad; Select
    with a 2-D mask or special experts). Returns (ids buffer, ids [-1 masked], tokens)."""
    n = t.bs(ctx.rank_id) * t.K
    tokens, valid = yield from active_set(ctx, t)
    ids_buf = ctx.alloc("expert_ids", align_up(4 * n, 256))
    flat = np.full(n, -1, I32)
    if tokens.size == 0:
        return ids_buf, flat, tokens
    ctx.vector("dup_ids", align_up(4 * n, 256) // 4, I32, writes=[ids_buf])
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * n,
                                    name="copy_ids"))
    ids = ctx.ub_read(ids_buf, I32, n, ops=0)  # SyncFunc<MTE2_S>
    if t.x_active_mask == "2d" or t.shape.special_experts:
        ctx.vector("select_ids", n, F32, reads=[ids_buf], writes=[ids_buf])
        yield from ctx.pipe_barrier("vector")
    flat[valid] = ids[valid]
    return ids_buf, flat, tokens


def expert_cnt(flat: np.ndarray, e: int, index: int, K: int) -> int:
    """What CalTokenSendExpertCnt(e, index) returns: the pairs before `index` that name e
    (0 for index < K, the first token's K distinct experts)."""
    return 0 if index < K else int(np.count_nonzero(flat[:index] == e))


def cal_token_send_expert_cnt(ctx: KernelContext, ids_buf, flat: np.ndarray, e: int,
                              index: int, K: int) -> Wait:
    """CalTokenSendExpertCnt: its five vector instructions over `index` ids, unless index < K."""
    if index >= K:
        yield from _cal_token_send_expert_cnt(ctx, ids_buf, index)
    return expert_cnt(flat, e, index, K)


# --------------------------------------------------------------------------- send
class SendSlots:
    """The send side's UB: the input queue (2 buffers), the quantised record (tempTensor_)
    and the packed 512 B-block out slots (2 on A3's expert split and shared send, up to
    8 otherwise), each with the put that last read it."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling, slots: int) -> None:
        slot = t.window.dispatch
        # TokenToExpert's FillTriple writes the triplet at tokenQuantAlign_, past
        # hAlignSize_ (into the next buffer on the device): npusim gives each the 32 B
        self.ins = [ctx.alloc(f"x_in{p}", max(t.x_in_bytes, slot.triplet_offset + 32))
                    for p in range(2)]
        self.temp = (ctx.alloc("quant_record", align32(slot.triplet_offset + 32))
                     if t.dispatch_quant != "none" else None)
        self.outs = [ctx.alloc(f"x_out{p}", slot.slot) for p in range(slots)]
        self.puts: list[Any] = [None] * slots
        self.i = 0
        outs = self.outs
        ctx.vector("dup_flags", slots * slot.slot // 4, F32, writes=outs,
                   fn=lambda: [o.view(F32).fill(ONE) for o in outs])

    def wait_all(self, ctx: KernelContext) -> Wait:
        yield from ctx.wait(*[p for p in self.puts if p is not None])


def pack(ctx: KernelContext, t: Mc2Tiling, src, out) -> None:
    """Two strided vector Copies (256 B, then 224 B, blockCntPerToken_ repeats): record
    bytes [480 b, 480 b + 480) -> out [512 b, 512 b + 480); the flags stay 1.0."""
    slot = t.window.dispatch
    n = min(src.nbytes, slot.blocks * SPLIT_BLOCK_DATA_SIZE)

    def effect() -> None:
        rec = np.zeros(slot.blocks * SPLIT_BLOCK_DATA_SIZE, np.uint8)
        rec[:n] = src.bytes_at(0, n)
        o = out.view(np.uint8).reshape(slot.blocks, SPLIT_BLOCK_SIZE)
        o[:, :SPLIT_BLOCK_DATA_SIZE] = rec.reshape(slot.blocks, SPLIT_BLOCK_DATA_SIZE)

    ctx.vector("copy_256", reads=[src], writes=[out], repeats=slot.blocks)
    ctx.vector("copy_224", reads=[src], writes=[out], repeats=slot.blocks, fn=effect)


def packed_offset(byte: int) -> int:
    """Where record byte `byte` lies in the packed slot."""
    return byte // SPLIT_BLOCK_DATA_SIZE * SPLIT_BLOCK_SIZE + byte % SPLIT_BLOCK_DATA_SIZE


def fill_triple(ctx: KernelContext, t: Mc2Tiling, buf, token: int, k: int,
                expert_scale: float | None, packed: bool = False) -> None:
    """FillTriple: (rank, token, k) at tokenQuantAlign_ [and the pair's expert scale]."""
    slot = t.window.dispatch
    at = packed_offset if packed else (lambda b: b)
    ctx.ub_write(buf, at(slot.triplet_offset), np.array([ctx.rank_id, token, k], I32), ops=3)
    if slot.expert_scale_offset is not None and k < t.K and expert_scale is not None:
        ctx.ub_write(buf, at(slot.expert_scale_offset), np.array([expert_scale], F32))


def token_to_expert(ctx: KernelContext, t: Mc2Tiling, s: SendSlots, memo: dict, token: int,
                    k: int, scale_row: int, dst: int, offset: int,
                    expert_scale: float | None) -> Wait:
    """TokenToExpert / TokenToExpertInQuant: load the row, [quantise], FillTriple, pack into
    an out slot, one put of the whole slot. A3 alternates two slots and waits for the last
    put before FillTriple (SyncFunc<MTE3_S>); the 950 cycles its slots, each waiting for
    its own previous put (WaitFlag<MTE3_V>)."""
    a3 = t.arch == "arch22"
    p = s.i % len(s.outs)
    xin = s.ins[s.i % 2]
    s.i += 1
    out = s.outs[p]
    x = ctx.tensor("x")
    h = t.H
    if t.dispatch_quant != "none":
        fp8 = qm.fp8_mode(t.dispatch_quant)
        if fp8:  # Duplicate(QUANT_PADDING_VALUE): zero the tail
            qm.zero_fill(ctx, xin, h, t.timing_only)
        if a3 or fp8:
            yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
        yield from ctx.wait(ctx.copy_in(xin, x, token * 2 * h, 2 * h, name="load_token"))
        _quantise(ctx, t, xin, s.temp, memo, token, scale_row)
        rec = s.temp
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    else:
        yield from ctx.wait(ctx.copy_in(xin, x, token * 2 * h, 2 * h, name="load_token"))
        rec = xin
    if a3:  # FillTriple's SyncFunc<MTE3_S>: the previous put has read its slot
        yield from s.wait_all(ctx)
    fill_triple(ctx, t, rec, token, k, expert_scale)
    if not a3 and s.puts[p] is not None:  # WaitFlag<MTE3_V>(slot)
        yield from ctx.wait(s.puts[p])
    pack(ctx, t, rec, out)
    yield from ctx.pipe_barrier("vector")  # V_MTE3
    s.puts[p] = ctx.put(dst, offset, out, t.window.dispatch.slot, name="put_token")


def all_to_all_dispatch(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict) -> Wait:
    """AlltoAllDispatch: ids and masks, then the shared cores (the last of the all-to-all
    cores) SendToSharedExpert, the MoE cores the path of this chip and shape."""
    rank, core = ctx.rank_id, ctx.core_id
    ids_buf, flat, tokens = yield from exp_ids_copy_and_mask_cal(ctx, t)
    n = t.bs(rank) * t.K
    es = None
    if t.expert_scales:
        es_buf = ctx.alloc("expert_scales", align_up(4 * n, 256))
        if tokens.size:
            yield from ctx.wait(ctx.copy_in(es_buf, ctx.tensor("expert_scales"), 0, 4 * n,
                                            name="copy_expert_scales"))
            es = ctx.ub_read(es_buf, F32, n, ops=0)
    if tokens.size == 0:
        return
    moe = tl.full_mesh_moe_cores(t, rank)
    if core >= moe and t.shape.S_r:
        yield from send_to_shared_expert(ctx, t, state, memo, core - moe, tokens)
    elif t.arch == "arch35":
        yield from send_to_moe_expert_by_token(ctx, t, state, memo, ids_buf, flat, es,
                                               tokens.size)
    elif tl.bs_mode(t, rank, tokens.size):
        yield from send_to_moe_expert_by_bs(ctx, t, state, memo, ids_buf, flat, tokens.size)
    else:
        yield from send_to_moe_expert(ctx, t, state, memo, ids_buf, flat, es)
    yield from ctx.pipe_barrier("mte3")


def _slots(t: Mc2Tiling, rank: int, bs_path: bool) -> int:
    if t.arch == "arch22" and not bs_path:
        return 2  # BUFFER_NUM
    return tl.send_token_buf_num(t, rank, bs_path)


def send_to_shared_expert(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict, c: int,
                          tokens: np.ndarray) -> Wait:
    """SendToSharedExpert: item v -> active token v % activeBS to shared expert
    v // activeBS on rank (r % R) + j R, into slot v % activeBS of block r."""
    rank = ctx.rank_id
    s = SendSlots(ctx, t, _slots(t, rank, False))
    yield from ctx.pipe_barrier("vector")
    for token, k, j, dst, off in shared_items(t, state, rank, tokens,
                                              tl.full_mesh_shared_cores(t, rank), c):
        ctx.scalar(4)
        yield from token_to_expert(ctx, t, s, memo, token, k, j, dst, off, None)
    yield from s.wait_all(ctx)


def send_to_moe_expert(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict, ids_buf,
                       flat: np.ndarray, es: np.ndarray | None) -> Wait:
    """A3 SendToMoeExpert by expert: SplitExpertNumToCore, CalExpertSendNum (a CompareScalar
    and a GatherMask per owned expert), then per owned expert from (i + rank % n) % n every
    set bit of its mask (ScalarGetSFFValue), the remainder expert's pairs dealt round robin
    over the cores that share it."""
    rank, K = ctx.rank_id, t.K
    moe = tl.full_mesh_moe_cores(t, rank)
    owned = tl.split_expert_num_to_core(t.shape.E, moe, ctx.core_id)
    n = flat.size
    mask_bytes = align32(align_up(4 * n, 256) // 4 // 8)
    mask = ctx.alloc("expert_mask", mask_bytes * max(1, ceil_div(t.shape.E, moe)))
    ctx.alloc("token_num_to_expert", align32(4 * t.shape.E))
    ctx.vector("dup_mask", mask.nbytes // 4, I32, writes=[mask])
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    compare = align_up(4 * n, 256) // 4
    pairs = []
    for e, _, _ in owned:
        ctx.vector("compare_scalar", compare, I32, reads=[ids_buf], writes=[mask])
        yield from ctx.pipe_barrier("vector")
        ctx.vector("gather_mask", n, I32, reads=[ids_buf, mask])
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
        ctx.scalar(1)
        pairs.append(np.flatnonzero(flat == e))
    s = SendSlots(ctx, t, 2)
    yield from ctx.pipe_barrier("vector")
    words = ceil_div(n, 64)
    m = len(owned)
    for idx in range(m):
        i = (idx + rank % m) % m
        e, group, place = owned[i]
        if pairs[i].size == 0:
            continue
        block = rank * t.L + e % t.L
        ctx.loop(words)
        for j, f in enumerate(pairs[i].tolist()):
            ctx.scalar(8)  # ScalarGetSFFValue, token / k, address, the remainder test
            if j % group != place:
                continue
            token, k = divmod(f, K)
            off = t.window.dispatch_slot_offset(state, block, j)
            yield from token_to_expert(ctx, t, s, memo, token, k, e + t.S, t.expert_rank(e),
                                       off, None if es is None else float(es[f]))
    yield from s.wait_all(ctx)


def send_to_moe_expert_by_token(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict,
                                ids_buf, flat: np.ndarray, es: np.ndarray | None,
                                active: int) -> Wait:
    """The 950's SendToMoeExpert by token: items core, core + moe, ...; per item its slot by
    CalTokenSendExpertCnt and the rotated block ((src + dst) % W) * L + e % L."""
    rank, K = ctx.rank_id, t.K
    moe = tl.full_mesh_moe_cores(t, rank)
    s = SendSlots(ctx, t, _slots(t, rank, False))
    valid_n = active * K if t.x_active_mask == "1d" else flat.size  # validTokenNum
    for index in range(ctx.core_id, valid_n, moe):
        e = int(flat[index])
        ctx.scalar(4)
        if e < 0 or e >= t.shape.E:
            continue
        dst = t.expert_rank(e)
        cnt = yield from cal_token_send_expert_cnt(ctx, ids_buf, flat, e, index, K)
        block = tl.rotated_block(rank, dst, e, t.W, t.L)
        off = t.window.dispatch_slot_offset(state, block, cnt)
        token, k = divmod(index, K)
        yield from token_to_expert(ctx, t, s, memo, token, k, e + t.S, dst, off,
                                   None if es is None else float(es[index]))
    yield from s.wait_all(ctx)


def send_to_moe_expert_by_bs(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict,
                             ids_buf, flat: np.ndarray, active: int) -> Wait:
    """SendToMoeExpertByBS (A3, canUseBSMode): CalcBSTokenRange, then per token one load and
    one quantisation, and SendBSExpertLoop: its K (or its share of K) destinations in
    batches of sendTokenBufNum_ slots, k = (ki + token) % K unless cores share the token;
    each a CalTokenSendExpertCnt, the pack Copy pair, the triplet by scalar stores, a put;
    the batch's puts done before the next batch reuses the slots."""
    rank, K = ctx.rank_id, t.K
    t0, t1, k0, k1, multi = tl.bs_token_range(t, rank, ctx.core_id, active)
    nslots = tl.send_token_buf_num(t, rank, True)
    if t.dispatch_quant == "none" and t.x_active_mask == "none" and not t.shape.special_experts:
        ctx.alloc("dst_exp", align32(4 * flat.size))
        ctx.alloc("sub_exp", align32(4 * flat.size))
    ctx.alloc("cal_temp", align32(4 * flat.size))
    if t0 >= t1 or nslots == 0:
        return
    s = SendSlots(ctx, t, nslots)
    yield from ctx.pipe_barrier("vector")
    x = ctx.tensor("x")
    h = t.H
    xin = s.ins[0]
    slot = t.window.dispatch
    for token in range(t0, t1):
        if qm.fp8_mode(t.dispatch_quant):  # Duplicate(QUANT_PADDING_VALUE): zero the tail
            qm.zero_fill(ctx, xin, h, t.timing_only)
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
        yield from ctx.wait(ctx.copy_in(xin, x, token * 2 * h, 2 * h, name="load_token"))
        if t.dispatch_quant != "none":  # QuantProcess with expert index 0 (no per-expert scales)
            _quantise(ctx, t, xin, s.temp, memo, token, 0)
            rec = s.temp
        else:
            rec = xin
        yield from s.wait_all(ctx)  # WaitFlag<MTE3_V>: the previous token's puts are done
        order = tl.bs_k_order(token, k0, k1, K, multi)
        for b0 in range(0, len(order), nslots):
            b1 = min(b0 + nslots, len(order))
            for ki in range(b0, b1):
                k = order[ki]
                flat_idx = token * K + k
                e = int(flat[flat_idx])
                ctx.scalar(4)
                if e < 0 or e >= t.shape.E:
                    continue
                cnt = 0
                if flat_idx > 0:
                    cnt = yield from cal_token_send_expert_cnt(ctx, ids_buf, flat, e, flat_idx, K)
                out = s.outs[ki - b0]
                pack(ctx, t, rec, out)
                yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
                ctx.ub_write(out, packed_offset(slot.triplet_offset),
                             np.array([rank, token, k], I32), ops=3)
                off = t.window.dispatch_slot_offset(state, rank * t.L + e % t.L, cnt)
                s.puts[ki - b0] = ctx.put(t.expert_rank(e), off, out, slot.slot,
                                          name="put_token")
            if b1 < len(order):  # SyncFunc<MTE3_S> between batches
                yield from s.wait_all(ctx)
    yield from s.wait_all(ctx)


# --------------------------------------------------------------------------- count cores
def cal_cum_sum(ctx: KernelContext, t: Mc2Tiling, state: int, m: int) -> Wait:
    """CalCumSum on count core m: the counts out, my share of the status entries in, the
    prefix table to every core; A3's first count core SetExpertTokenNums."""
    with ctx.phase("set_status"):
        ids_buf, flat, tokens = yield from exp_ids_copy_and_mask_cal(ctx, t)
        if t.arch == "arch35":
            yield from cal_and_send_cnt_by_rank(ctx, t, state, m, ids_buf, flat, tokens.size)
        else:
            yield from cal_and_send_cnt_by_exp(ctx, t, state, m, ids_buf, flat, tokens.size)
    if t.arch == "arch22":
        ctx.ub.reset()  # tpipe_->Reset() before BufferInit
    with ctx.phase("wait_dispatch"):
        counts, s0 = yield from wait_dispatch(ctx, t, state, m)
        yield from cal_recv_and_set_flag(ctx, t, m, counts, s0)
    if t.arch == "arch22" and m == 0:
        with ctx.phase("token_nums"):
            yield from set_expert_token_nums(ctx, t, state)


def _status_buffer(ctx: KernelContext, t: Mc2Tiling, entries: int, split: bool = False):
    """statusTensor_: Align8(S_r + E) entries of (1.0, count) (two Duplicates). `split`: one
    32 B buffer per entry (npusim's UB hazards are per buffer; ByExp writes an entry while
    the put of the one before still reads the tensor)."""
    n = align_up(entries, 8)
    bufs = ([ctx.alloc(f"status{i}", 32) for i in range(n)] if split
            else [ctx.alloc("status", 32 * n)])

    def flags() -> None:
        for b in bufs:
            v = b.view(I32).reshape(-1, 8)
            v[:] = 0
            v[:, 0] = ONE.view(I32)

    ctx.vector("dup_status", 8 * n, I32, writes=bufs)
    ctx.vector("dup_flag", repeats=n // 8, writes=bufs, fn=flags)
    return bufs


def _mask_cnt(t: Mc2Tiling, flat: np.ndarray, active: int) -> int:
    """maskCnt: activeBS * K with a 1-D mask, else BS * K ids to count over."""
    return active * t.K if t.x_active_mask == "1d" else flat.size


def _count(t: Mc2Tiling, rank: int, i: int, flat: np.ndarray, active: int) -> int:
    """Status "expert" i: shared rank i (activeBS if it is my replica) or MoE expert i - S_r."""
    S_r = t.shape.S_r
    if i < S_r:
        return active if i % t.shape.R == rank % t.shape.R else 0
    return int(np.count_nonzero(flat == i - S_r))


def cal_and_send_cnt_by_exp(ctx: KernelContext, t: Mc2Tiling, state: int, m: int, ids_buf,
                            flat: np.ndarray, active: int) -> Wait:
    """CalAndSendCntByExp (A3): my contiguous share of the S_r + E status experts, each a
    CalTokenSendExpertCnt over all ids and one 32 B put to its rank."""
    rank = ctx.rank_id
    total = t.shape.S_r + t.shape.E
    e0, e1 = split_to_core(total, tl.count_cores(t, rank), m)
    status = _status_buffer(ctx, t, e1 - e0, split=True)
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    for i in range(e0, e1):
        if i < t.shape.S_r:
            ctx.scalar(2)
        else:
            yield from _cal_token_send_expert_cnt(ctx, ids_buf, _mask_cnt(t, flat, active))
        buf = status[i - e0]
        ctx.ub_write(buf, 4, np.array([_count(t, rank, i, flat, active)], I32))
        if i < t.shape.S_r:
            dst, entry = i, rank
        else:
            e = i - t.shape.S_r
            dst, entry = t.expert_rank(e), (e % t.L) * t.W + rank
        ctx.put(dst, t.window.dispatch_status(state, entry), buf, 32, name="put_status")
    yield from ctx.drain()


def cal_and_send_cnt_by_rank(ctx: KernelContext, t: Mc2Tiling, state: int, m: int, ids_buf,
                             flat: np.ndarray, active: int) -> Wait:
    """CalAndSendCntByRank (950): destination ranks m, m + n_cs, ...; the L counts of a MoE
    rank (a CalTokenSendExpertCnt each) go in one strided put of L entries W apart."""
    rank = ctx.rank_id
    S_r, L, W = t.shape.S_r, t.L, t.W
    n_cs = tl.count_cores(t, rank)
    status = _status_buffer(ctx, t, S_r + t.shape.E)[0]
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    dsts = list(range(m, W, n_cs))
    for d in dsts:
        items = [d] if d < S_r else range(S_r + (d - S_r) * L, S_r + (d - S_r + 1) * L)
        for i in items:
            if i >= S_r:
                yield from _cal_token_send_expert_cnt(ctx, ids_buf, _mask_cnt(t, flat, active))
            else:
                ctx.scalar(2)
            ctx.ub_write(status, 32 * i + 4, np.array([_count(t, rank, i, flat, active)], I32))
    for d in dsts:
        base = t.window.dispatch_status(state, rank)
        if d < S_r:
            ctx.put(d, base, status, 32, src_offset=32 * d, name="put_status")
        else:
            first = S_r + (d - S_r) * L
            ctx.put(d, base, status, 0, src_offset=32 * first, name="put_status",
                    strided=Strided(L, 32, dst_gap=(W - 1) * 32))
    yield from ctx.drain()


def run_pos_record(ctx: KernelContext, t: Mc2Tiling, pos: int) -> None:
    """RunPosRecord: a 4 B DFX write after the core's state word."""
    buf = ctx.alloc(f"run_pos{pos}", 32)
    ctx.ub_write(buf, 0, np.array([pos], np.uint32))
    ctx.copy_out(ctx.window(), t.window.dispatch_state_word(ctx.core_id) + 4, buf, 4,
                 name="run_pos")


def wait_dispatch(ctx: KernelContext, t: Mc2Tiling, state: int, m: int) -> Wait:
    """WaitDispatch: poll my share of the status entries until every flag is 1.0, clear the
    flags (WaitDispatchClearStatus), GatherSumRecvCnt: my counts' sum, written n_cs times
    (with a 1.0 each) into row m of the partial sums at 868 KiB."""
    rank = ctx.rank_id
    n_cs = tl.count_cores(t, rank)
    s0, s1 = split_to_core(t.status_count(rank), n_cs, m)
    n = s1 - s0
    win = ctx.window()
    base = t.window.dispatch_status(state, s0)
    wait_buf = ctx.alloc("wait_status", align_up(32 * n, 256))
    yield from ctx.wait_until(win, base, 32 * n, SumEquals(F32, float(n), stride=32), wait_buf,
                              name="wait_status", check_ns=ctx.check_ns(n))
    run_pos_record(ctx, t, 2)
    counts = yield from wait_dispatch_clear_status(ctx, win, base, wait_buf, n)
    ctx.vector("gather_counts", repeats=n, reads=[wait_buf])
    yield from ctx.pipe_barrier("vector")
    ctx.vector("sum_counts", align32(4 * n) // 4, F32)
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(1)
    total = int(counts.sum())
    sums = ctx.alloc("sum_core", 32 * t.cores)

    def dup() -> None:
        v = sums.view(I32).reshape(t.cores, 8)
        v[:, 0] = total  # the sum's bits (the kernel sums int counts as fp32 denormals)
        v[:, 1] = ONE.view(I32)

    ctx.vector("dup_sum", repeats=ceil_div(n_cs, 8), writes=[sums])
    ctx.vector("dup_flag", repeats=ceil_div(n_cs, 8), writes=[sums], fn=dup)
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
    ctx.copy_out(win, t.window.status.cumsum_cal(n_cs, m), sums, n_cs * STATE_OFFSET,
                 name="put_partial")
    return counts, s0


def cal_recv_and_set_flag(ctx: KernelContext, t: Mc2Tiling, m: int, counts: np.ndarray,
                          s0: int) -> Wait:
    """CalRecvAndSetFlag: GetCumSum (poll column m of the partial sums until every count
    core's 1.0 is in, sum the earlier ones, clear the column), my slice of ep_recv_count,
    copied into every core's row of the workspace, then my ready flag into every core's
    row at 876 KiB."""
    rank = ctx.rank_id
    n_cs = tl.count_cores(t, rank)
    C = t.cores
    wl = t.status_count(rank)
    win = ctx.window()
    col = ctx.alloc("sum_local", 32 * C)
    gather = ctx.alloc("sum_continue", align32(4 * C))
    status = t.window.status
    yield from ctx.wait_until(win, status.cumsum_cal(n_cs, 0, m), 0,
                              SumEquals(F32, float(n_cs), stride=32, offset=4), col,
                              strided=Strided(n_cs, 32, src_gap=(n_cs - 1) * 32),
                              name="wait_partials", check_ns=ctx.check_ns(n_cs))
    cells = col.view(I32, 8 * n_cs).reshape(n_cs, 8)
    before = int(cells[:m, 0].sum())
    if m:
        ctx.vector("gather_sums", repeats=m, reads=[col], writes=[gather])
        yield from ctx.pipe_barrier("vector")
        ctx.vector("sum_sums", align32(4 * m) // 4, F32, reads=[gather])
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(1)
    ctx.vector("clear_column", repeats=ceil_div(n_cs, 8), writes=[col],
               fn=lambda: col.view(np.uint8).fill(0))
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(win, status.cumsum_cal(n_cs, 0, m), col, 0,
                 strided=Strided(n_cs, 32, dst_gap=(n_cs - 1) * 32), name="clear_partials")
    n = counts.size
    prefix = ctx.alloc("prefix", max(align32(4 * n), align32(4 * wl)))
    ctx.ub_write(prefix, 0, (before + np.cumsum(counts)).astype(I32), ops=2 * n)
    ctx.copy_out(ctx.tensor("ep_recv_count"), 4 * s0, prefix, 4 * n, name="write_ep_recv_count")
    ws = ctx.tensor("workspace")
    for c in range(C):  # "copy aivNum_ times": my slice into every core's prefix table
        ctx.copy_out(ws, 4 * (c * wl + s0), prefix, 4 * n, name="write_workspace")
    ones = ctx.alloc("sync_on_core", 32 * C)
    ctx.vector("dup_ready", repeats=ceil_div(C, 8), writes=[ones],
               fn=lambda: ones.view(I32).fill(1))
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
    yield from ctx.pipe_barrier("mte3")  # PipeBarrier<PIPE_MTE3>: the table before the flag
    ctx.copy_out(win, status.cumsum_flag(n_cs, 0, m), ones, 0,
                 strided=Strided(C, 32, dst_gap=(n_cs - 1) * 32), name="set_cumsum_flag")
    yield from ctx.drain()


# --------------------------------------------------------------------------- local copy
def local_window_copy(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """LocalWindowCopy: WaitCumSumFlag, SetValidExpertInfo (my share of the W * L indices,
    the 950's core 0 also writes expert_token_nums), WaitAndFormatOutput: round robin over
    my indices with rows left, each probe reading the block flags of up to maxCopyTokenCnt
    rows (CheckDataArriveWithFlag); arrived rows are copied out (CopyInAndOut) and, once an
    index is drained, its block flags zeroed, one strided copy per row."""
    ctx.ub.reset()  # tpipe_->Reset()
    rank, core, C = ctx.rank_id, ctx.core_id, t.cores
    n_cs = tl.count_cores(t, rank)
    wl = t.status_count(rank)
    win = ctx.window()
    slot = t.window.dispatch
    rscv_align = align32(4 * wl)
    ctx.alloc("scalar", 32)
    ready = ctx.alloc("status_wait", 32 * n_cs)
    cum_buf = ctx.alloc("cumsum", rscv_align)
    zero = ctx.alloc("status_clean", 32 * n_cs)
    i0, i1 = split_to_core(wl, C, core)
    flag_off = t.window.status.cumsum_flag(n_cs, core)
    yield from ctx.wait_until(win, flag_off, 32 * n_cs, SumEquals(I32, 8.0 * n_cs), ready,
                              name="wait_cumsum_flag", check_ns=ctx.check_ns(n_cs))
    run_pos_record(ctx, t, 3)
    ctx.vector("dup_zero", 8 * n_cs, F32, writes=[zero])
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(win, flag_off, zero, 32 * n_cs, name="clear_cumsum_flag")
    if i1 <= i0:
        return
    n_idx = i1 - i0
    exp_info = align32(4 * n_idx)
    for name in ("expert_map", "expert_finish", "expert_left"):
        ctx.alloc(name, exp_info)
    ctx.alloc("flag_mask", 64)
    clean = ctx.alloc("clean_up", slot.blocks * 32)
    tbuf_bytes = (tl.FULL_MESH_MAX_UB_SIZE - (32 + rscv_align + 2 * n_cs * 32) - 3 * exp_info
                  - 64 - slot.blocks * 32)
    tbuf = ctx.alloc("tokens", tbuf_bytes)
    max_tokens = tbuf_bytes // slot.slot
    # SetValidExpertInfo: my copy of the prefix table
    yield from ctx.wait(ctx.copy_in(cum_buf, ctx.tensor("workspace"), 4 * core * wl, 4 * wl,
                                    name="read_prefix"))
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    cum = ctx.ub_read(cum_buf, I32, wl, ops=0).astype(np.int64)
    if t.arch == "arch35" and core == 0:
        _token_nums_from_prefix(ctx, t, cum)
    ctx.scalar(4 * n_idx)
    valid = valid_expert_info(cum, i0, i1)  # index, first output row, finished, left
    if not valid:
        return
    ctx.vector("dup_clean", slot.blocks * 8, F32, writes=[clean],
               fn=lambda: clean.view(np.uint8).fill(0))
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(1)
    outs = _Outputs(ctx, t)

    def block_of(idx: int) -> int:
        return _recv_block(t, state, idx, rank)

    def copy_rows(src: int, row: int, n: int) -> Wait:
        yield from outs.copy_in_and_out(ctx, src, tbuf, row, n)

    def after(block: int, finish: int, drained: bool) -> Wait:
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
        if drained:  # zero every block flag of the index, one copy per row
            for i in range(finish):
                ctx.copy_out(win, block + i * slot.slot + FLAG_DATA, clean, 0,
                             strided=Strided(slot.blocks, 32, dst_gap=SPLIT_BLOCK_SIZE - 32),
                             name="clean_block_flags")

    yield from drain_round_robin(ctx, valid, max_tokens, block_of, slot.slot, slot.blocks,
                                 tbuf, copy_rows, after)
    run_pos_record(ctx, t, 4)
    yield from ctx.drain()


def _recv_block(t: Mc2Tiling, state: int, idx: int, rank: int) -> int:
    """The window block of status index idx = local * W + src: src * L + local, on the 950
    ((src + me) % W) * L + local; src on a shared rank."""
    if t.is_shared_rank(rank):
        return t.window.dispatch_block(state, idx)
    local, src = divmod(idx, t.W)
    if t.arch == "arch35":
        src = (src + rank) % t.W
    return t.window.dispatch_block(state, src * t.L + local)


def _token_nums_from_prefix(ctx: KernelContext, t: Mc2Tiling, cum: np.ndarray) -> None:
    """The 950's expert_token_nums (SetValidExpertInfo, core 0): each local expert's last
    prefix entry, less the one before for counts (type 1)."""
    le, W = t.local_experts(ctx.rank_id), t.W
    ends = cum.reshape(le, W)[:, -1]
    nums = ends if t.expert_token_nums_type == 0 else np.diff(ends, prepend=0)
    buf = ctx.alloc("token_nums", align32(8 * t.L))
    ctx.ub_write(buf, 0, nums.astype(np.int64), ops=3 * le)
    ctx.copy_out(ctx.tensor("expert_token_nums"), 0, buf, 8 * le, name="write_expert_token_nums")


class _Outputs:
    """The output tensors CopyInAndOut writes."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling) -> None:
        self.t = t
        self.x = ctx.tensor("expand_x")
        self.assist = ctx.tensor("assist_info_for_combine")
        scaled = t.window.dispatch.scale_offset is not None  # int8 and the FP8 modes
        self.scales = ctx.tensor("dynamic_scales") if scaled else None
        es = t.window.dispatch.expert_scale_offset
        self.es = ctx.tensor("expand_scales") if es is not None else None

    def copy_in_and_out(self, ctx: KernelContext, src: int, tbuf, row: int, n: int) -> Wait:
        """CopyInAndOut: n rows window -> UB without their flags (480 B pieces), then the
        scales, the rows and the triplets out by strided copies; the expert scales from the
        window directly."""
        slot = self.t.window.dispatch
        win = ctx.window()
        stride = slot.blocks * SPLIT_BLOCK_DATA_SIZE
        yield from ctx.wait(ctx.copy_in(tbuf, win, src, 0, name="copy_tokens",
                                        strided=Strided(slot.blocks * n, SPLIT_BLOCK_DATA_SIZE,
                                                        src_gap=32)))
        ops = []
        if self.scales is not None:
            sb = slot.scale_bytes
            ops.append(ctx.copy_out(self.scales, row * sb, tbuf, 0, src_offset=slot.scale_offset,
                                    strided=Strided(n, sb, src_gap=stride - sb),
                                    name="write_scales"))
        ob = slot.out_bytes
        ops.append(ctx.copy_out(self.x, row * ob, tbuf, 0,
                                strided=Strided(n, ob, src_gap=stride - ob),
                                name="write_expand_x"))
        ops.append(ctx.copy_out(self.assist, row * 12, tbuf, 0, src_offset=slot.triplet_offset,
                                strided=Strided(n, 12, src_gap=stride - 12),
                                name="write_assist_info"))
        if self.es is not None:
            yield from ctx.wait(*ops)  # SyncFunc<MTE3_MTE2>
            at = packed_offset(slot.expert_scale_offset)
            yield from ctx.wait(ctx.copy_in(tbuf, win, src + at, 0, name="copy_expert_scales",
                                            strided=Strided(n, 4, src_gap=slot.slot - 4)))
            ctx.copy_out(self.es, row * 4, tbuf, 4 * n, name="write_expand_scales")
