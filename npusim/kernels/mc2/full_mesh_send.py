"""AllToAllDispatch of the full-mesh dispatch (``comm_alg: fullmesh_v2``): the expert ids
and masks (ExpIdsCopyAndMaskCal), then the three MoE send paths and the shared experts'
(docs/kernels/mc2.md, "fullmesh_v2"). Every 512 B block carries 480 B of data and a 32 B
flag of 1.0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.dispatch_send import (
    TokenSend,
    _cal_token_send_expert_cnt,
    _quantise,
    active_set,
    shared_items,
)
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.mc2.window import SPLIT_BLOCK_DATA_SIZE, SPLIT_BLOCK_SIZE
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align32, align_up, ceil_div

F32, I32 = np.float32, np.int32
ONE = np.float32(1.0)


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
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * n, name="copy_ids"))
    ids = ctx.ub_read(ids_buf, I32, n, ops=0)  # SyncFunc<MTE2_S>
    if t.x_active_mask == "2d" or t.shape.special_experts:
        ctx.vector("select_ids", n, F32, reads=[ids_buf], writes=[ids_buf])
        yield from ctx.pipe_barrier("vector")
    flat[valid] = ids[valid]
    return ids_buf, flat, tokens


@dataclass(frozen=True)
class SendIds:
    """What the MoE send paths read of ExpIdsCopyAndMaskCal: the ids in UB, their values
    (-1 where a pair does not travel) and the pairs' expert scales (None without)."""

    buf: Any
    flat: np.ndarray
    scales: np.ndarray | None

    def scale(self, index: int) -> float | None:
        """Pair `index`'s expert scale, as FillTriple writes it."""
        return None if self.scales is None else float(self.scales[index])


def expert_cnt(flat: np.ndarray, e: int, index: int, K: int) -> int:
    """What CalTokenSendExpertCnt(e, index) returns: the pairs before `index` that name e
    (0 for index < K, the first token's K distinct experts)."""
    return 0 if index < K else int(np.count_nonzero(flat[:index] == e))


def cal_token_send_expert_cnt(ctx: KernelContext, ids: SendIds, e: int, index: int, K: int
                              ) -> Wait:
    """CalTokenSendExpertCnt: its five vector instructions over `index` ids, unless index < K."""
    if index >= K:
        yield from _cal_token_send_expert_cnt(ctx, ids.buf, index)
    return expert_cnt(ids.flat, e, index, K)


# --------------------------------------------------------------------------- send
class SendSlots:
    """The send side's UB: the input queue (2 buffers), the quantised record (tempTensor_)
    and the packed 512 B-block out slots (2 on A3's expert split and shared send, up to
    8 otherwise), each with the put that last read it."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling, slots: int) -> None:
        slot = t.window.dispatch
        # TokenToExpert's FillTriple writes the triplet at tokenQuantAlign_, past
        # hAlignSize_ (into the next buffer on the device): npusim gives each the 32 B
        self.ins = [
            ctx.alloc(f"x_in{p}", max(t.x_in_bytes, slot.triplet_offset + 32)) for p in range(2)
        ]
        self.temp = (
            ctx.alloc("quant_record", align32(slot.triplet_offset + 32))
            if t.dispatch_quant != "none"
            else None
        )
        self.outs = [ctx.alloc(f"x_out{p}", slot.slot) for p in range(slots)]
        self.puts: list[Any] = [None] * slots
        self.i = 0
        outs = self.outs
        ctx.vector(
            "dup_flags",
            slots * slot.slot // 4,
            F32,
            writes=outs,
            fn=lambda: [o.view(F32).fill(ONE) for o in outs],
        )

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


def fill_triple(
    ctx: KernelContext,
    t: Mc2Tiling,
    buf,
    token: int,
    k: int,
    expert_scale: float | None,
    packed: bool = False,
) -> None:
    """FillTriple: (rank, token, k) at tokenQuantAlign_ [and the pair's expert scale]."""
    slot = t.window.dispatch
    at = packed_offset if packed else (lambda b: b)
    ctx.ub_write(buf, at(slot.triplet_offset), np.array([ctx.rank_id, token, k], I32), ops=3)
    if slot.expert_scale_offset is not None and k < t.K and expert_scale is not None:
        ctx.ub_write(buf, at(slot.expert_scale_offset), np.array([expert_scale], F32))


def token_to_expert(ctx: KernelContext, t: Mc2Tiling, s: SendSlots, memo: dict,
                    item: TokenSend) -> Wait:
    """TokenToExpert / TokenToExpertInQuant: load the row, [quantise], FillTriple, pack into
    an out slot, one put of the whole slot. A3 alternates two slots and waits for the last
    put before FillTriple (SyncFunc<MTE3_S>); the 950 cycles its slots, each waiting for
    its own previous put (WaitFlag<MTE3_V>)."""
    token, k, scale_row, dst, offset, expert_scale = item
    a3 = t.arch == "arch22"
    p = s.i % len(s.outs)
    xin = s.ins[s.i % 2]
    s.i += 1
    out = s.outs[p]
    x = ctx.tensor("x")
    h = t.H
    if t.dispatch_quant != "none":
        fp8 = qm.vf_mode(t.dispatch_quant)
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
            yield from ctx.wait(
                ctx.copy_in(
                    es_buf, ctx.tensor("expert_scales"), 0, 4 * n, name="copy_expert_scales"
                )
            )
            es = ctx.ub_read(es_buf, F32, n, ops=0)
    if tokens.size == 0:
        return
    ids = SendIds(ids_buf, flat, es)
    moe = tl.full_mesh_moe_cores(t, rank)
    if core >= moe and t.shape.S_r:
        yield from send_to_shared_expert(ctx, t, state, memo, core - moe, tokens)
    elif t.arch == "arch35":
        yield from send_to_moe_expert_by_token(ctx, t, state, memo, ids, tokens.size)
    elif tl.bs_mode(t, rank, tokens.size):
        yield from send_to_moe_expert_by_bs(ctx, t, state, memo, ids, tokens.size)
    else:
        yield from send_to_moe_expert(ctx, t, state, memo, ids)
    yield from ctx.pipe_barrier("mte3")


def _slots(t: Mc2Tiling, rank: int, bs_path: bool) -> int:
    if t.arch == "arch22" and not bs_path:
        return 2  # BUFFER_NUM
    return tl.send_token_buf_num(t, rank, bs_path)


def send_to_shared_expert(
    ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict, c: int, tokens: np.ndarray
) -> Wait:
    """SendToSharedExpert: item v -> active token v % activeBS to shared expert
    v // activeBS on rank (r % R) + j R, into slot v % activeBS of block r."""
    rank = ctx.rank_id
    s = SendSlots(ctx, t, _slots(t, rank, False))
    yield from ctx.pipe_barrier("vector")
    for item in shared_items(t, state, rank, tokens, tl.full_mesh_shared_cores(t, rank), c):
        ctx.scalar(4)
        yield from token_to_expert(ctx, t, s, memo, item)
    yield from s.wait_all(ctx)


def _cal_expert_send_num(ctx: KernelContext, t: Mc2Tiling, ids: SendIds, owned: list, moe: int
                         ) -> Wait:
    """CalExpertSendNum: per owned expert a CompareScalar and a GatherMask over the ids;
    returns each owned expert's pairs (flat indices)."""
    n, ids_buf = ids.flat.size, ids.buf
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
        pairs.append(np.flatnonzero(ids.flat == e))
    return pairs


def send_to_moe_expert(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict, ids: SendIds
                       ) -> Wait:
    """A3 SendToMoeExpert by expert: SplitExpertNumToCore, CalExpertSendNum (a CompareScalar
    and a GatherMask per owned expert), then per owned expert from (i + rank % n) % n every
    set bit of its mask (ScalarGetSFFValue), the remainder expert's pairs dealt round robin
    over the cores that share it."""
    rank, K = ctx.rank_id, t.K
    moe = tl.full_mesh_moe_cores(t, rank)
    owned = tl.split_expert_num_to_core(t.shape.E, moe, ctx.core_id)
    pairs = yield from _cal_expert_send_num(ctx, t, ids, owned, moe)
    n = ids.flat.size
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
            item = TokenSend(token, k, e + t.S, t.expert_rank(e), off, ids.scale(f))
            yield from token_to_expert(ctx, t, s, memo, item)
    yield from s.wait_all(ctx)


def send_to_moe_expert_by_token(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict,
                                ids: SendIds, active: int) -> Wait:
    """The 950's SendToMoeExpert by token: items core, core + moe, ...; per item its slot by
    CalTokenSendExpertCnt and the rotated block ((src + dst) % W) * L + e % L."""
    rank, K = ctx.rank_id, t.K
    moe = tl.full_mesh_moe_cores(t, rank)
    s = SendSlots(ctx, t, _slots(t, rank, False))
    valid_n = active * K if t.x_active_mask == "1d" else ids.flat.size  # validTokenNum
    for index in range(ctx.core_id, valid_n, moe):
        e = int(ids.flat[index])
        ctx.scalar(4)
        if e < 0 or e >= t.shape.E:
            continue
        dst = t.expert_rank(e)
        cnt = yield from cal_token_send_expert_cnt(ctx, ids, e, index, K)
        block = tl.rotated_block(rank, dst, e, t.W, t.L)
        off = t.window.dispatch_slot_offset(state, block, cnt)
        token, k = divmod(index, K)
        yield from token_to_expert(
            ctx, t, s, memo, TokenSend(token, k, e + t.S, dst, off, ids.scale(index))
        )
    yield from s.wait_all(ctx)


def send_to_moe_expert_by_bs(
    ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict, ids: SendIds, active: int
) -> Wait:
    """SendToMoeExpertByBS (A3, canUseBSMode): CalcBSTokenRange, then per token one load and
    one quantisation, and SendBSExpertLoop: its K (or its share of K) destinations in
    batches of sendTokenBufNum_ slots, k = (ki + token) % K unless cores share the token;
    each a CalTokenSendExpertCnt, the pack Copy pair, the triplet by scalar stores, a put;
    the batch's puts done before the next batch reuses the slots."""
    rank, K, flat = ctx.rank_id, t.K, ids.flat
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
        if qm.vf_mode(t.dispatch_quant):  # Duplicate(QUANT_PADDING_VALUE): zero the tail
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
                    cnt = yield from cal_token_send_expert_cnt(ctx, ids, e, flat_idx, K)
                out = s.outs[ki - b0]
                pack(ctx, t, rec, out)
                yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
                ctx.ub_write(
                    out, packed_offset(slot.triplet_offset), np.array([rank, token, k], I32), ops=3
                )
                off = t.window.dispatch_slot_offset(state, rank * t.L + e % t.L, cnt)
                s.puts[ki - b0] = ctx.put(t.expert_rank(e), off, out, slot.slot, name="put_token")
            if b1 < len(order):  # SyncFunc<MTE3_S> between batches
                yield from s.wait_all(ctx)
    yield from s.wait_all(ctx)
