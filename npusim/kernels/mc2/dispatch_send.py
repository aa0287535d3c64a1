"""The dispatch's send (AlltoAllDispatch of ``moe_distribute_dispatch_v2.h``): the
active tokens and masks, each token quantised once and put to its K experts' windows and
its shared experts'. CalTokenSendExpertCnt's five instructions run over every earlier
(token, k) pair of the core's range, so the send is quadratic in BS * K."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from npusim.kernels.common.int8_quant import to_f32_instrs, token_cast_instrs, token_max_instrs
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2 import reference as ref
from npusim.kernels.mc2.active_mask import active_token_count, copy_mask_rows, row_sum_instrs
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.quant import int8_token_quantize, token_dtype
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align32

F32, I32 = np.float32, np.int32


def _cal_token_send_expert_cnt(ctx: KernelContext, ids_buf, n: int) -> Wait:
    """CalTokenSendExpertCnt over n ids: Duplicate, Sub, Abs, Mins, ReduceSum; S->V, V->S."""
    if n <= 0:
        return
    for op in ("duplicate", "sub", "abs", "mins"):
        ctx.vector(op, n, I32, reads=[ids_buf])
    ctx.vector("reduce_sum", n, F32, reads=[ids_buf])
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    ctx.scalar(2)


class SendQueues:
    """The send queues of ProcessToken: bufferNum_ input and output buffers."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling, rank: int) -> None:
        n = t.send_buffers(rank)
        row = t.window.dispatch.ub_row
        if t.dispatch_quant == "none":
            self.ins = [None] * n
        else:
            self.ins = [ctx.alloc(f"x_in{p}", t.x_in_bytes) for p in range(n)]
        self.outs = [ctx.alloc(f"x_out{p}", row) for p in range(n)]
        self.puts: list[Any] = [None] * n
        self.i = 0


class TokenSend(NamedTuple):
    """One row a send core puts (ProcessToken's, TokenToExpert's arguments): the token, its
    k (K + j for shared expert j), the row of the smooth scales its quantisation takes,
    the destination rank, the window offset of the slot and the pair's expert scale."""

    token: int
    k: int
    scale_row: int
    dst: int
    offset: int
    expert_scale: float | None = None


def process_token(ctx: KernelContext, t: Mc2Tiling, q: SendQueues, memo: dict,
                  item: TokenSend) -> Wait:
    """ProcessToken: load the row, [quantise], FillTriple ([wait for the core's puts],
    the triplet), one put of the slot's bytes."""
    token, k, scale_row, dst, offset, expert_scale = item
    slot = t.window.dispatch
    p = q.i % len(q.outs)
    q.i += 1
    out = q.outs[p]
    if q.puts[p] is not None:  # AllocTensor: the buffer's previous put has read it
        yield from ctx.wait(q.puts[p])
    x = ctx.tensor("x")
    h = t.H
    if t.dispatch_quant == "none":
        yield from ctx.wait(ctx.copy_in(out, x, token * 2 * h, 2 * h, name="load_token"))
    else:
        src = q.ins[p]
        if qm.vf_mode(t.dispatch_quant):  # Duplicate(QUANT_PADDING_VALUE): zero the tail
            qm.zero_fill(ctx, src, h, t.timing_only)
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
        yield from ctx.wait(ctx.copy_in(src, x, token * 2 * h, 2 * h, name="load_token"))
        _quantise(ctx, t, src, out, memo, token, scale_row)
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    if t.fill_triple_waits_mte3:  # FillTriple's SyncFunc<MTE3_S>
        yield from ctx.pipe_barrier("mte3")
    trip = np.array([ctx.rank_id, token, k], I32)
    ctx.ub_write(out, slot.triplet_offset, trip, ops=3)
    if slot.expert_scale_offset is not None:
        ctx.ub_write(
            out,
            slot.expert_scale_offset,
            np.array([0.0 if expert_scale is None else expert_scale], F32),
        )
    q.puts[p] = t.window.put(ctx, dst, offset, out, slot.moved, name="put_token")


def _quantise(
    ctx: KernelContext, t: Mc2Tiling, src, out, memo: dict, token: int, scale_row: int
) -> None:
    """QuantStatic / QuantDynamicPerToken on V (INT8; DeepEP's 950 fork also to FP8);
    the 950's FP8 and MXFP4 modes: their VFs (npusim.kernels.mc2.quant_modes); the
    record is remembered per (token, row)."""
    h = t.H
    slot = t.window.dispatch
    dt = token_dtype(t.shape.dtype)
    rank = ctx.rank_id

    def effect() -> None:
        key = (rank, token, scale_row)
        rec = memo.get(key)
        if rec is None:
            row = src.bytes_at(0, 2 * h).view(dt)
            rec = np.zeros(slot.triplet_offset, np.uint8)
            scales = ctx.tensor("scales") if t.smooth_scales else None
            if qm.vf_mode(t.dispatch_quant):
                smooth = None
                if scales is not None:
                    smooth = scales.as_array(F32).reshape(-1, h)[scale_row]
                qm.quantise_record(row, t.dispatch_quant, t.quant_dtype, rec, smooth)
            elif t.dispatch_quant == qm.PERTOKEN_FP8:
                qv, s = qm.pertoken_fp8_row(row)
                rec[:h] = qv
                rec[slot.scale_offset : slot.scale_offset + 4] = s.view(np.uint8)
            elif t.dispatch_quant == "static_int8":
                sc = scales.as_array(F32)
                sc = sc if sc.size in (1, h) else sc.reshape(-1, h)[scale_row]
                rec[:h] = ref.static_int8_quantize(row, sc).view(np.uint8)
            else:
                smooth = None
                if scales is not None:
                    smooth = scales.as_array(F32).reshape(-1, h)[scale_row]
                qv, s = int8_token_quantize(row[None, :], smooth, t.int8_zero_guard)
                rec[:h] = qv[0].view(np.uint8)
                rec[slot.scale_offset : slot.scale_offset + 4] = s.view(np.uint8)
            memo[key] = rec
        out.bytes_at(0, slot.triplet_offset)[:] = rec

    fn = None if t.timing_only else effect
    if qm.vf_mode(t.dispatch_quant):
        ctx.vf(
            "quant",
            qm.quant_vfs(h, t.dispatch_quant, dt == np.float16, t.smooth_scales),
            reads=[src],
            writes=[out],
            fn=fn,
        )
        return
    if t.dispatch_quant in qm.PER_TOKEN_MODES:  # QuantDynamicPerToken
        ctx.vector_seq("int8_max", token_max_instrs(h, t.smooth_scales), reads=[src])
        ctx.scalar(4)  # SyncFunc<V_S>, 127 (448) / max
        cast = (token_cast_instrs(h) if t.dispatch_quant == "int8"
                else qm.per_token_fp8_instrs(h))
        ctx.vector_seq("quant", cast, reads=[src], writes=[out], fn=fn)
        ctx.scalar(2)  # SetValue of the scale
        return
    seq = to_f32_instrs(h, t.smooth_scales) + token_cast_instrs(h, scaled=False)  # QuantStatic
    ctx.vector_seq("quant", seq, reads=[src], writes=[out], fn=fn)


def active_set(ctx: KernelContext, t: Mc2Tiling) -> Wait:
    """The mask and special-expert preparation of AlltoAllDispatch (v2.h:772-940): the
    active tokens (original indices, in order) and the compact list of pairs that travel
    (flat indices t * K + k), charged as the kernel's vector instructions."""
    rank = ctx.rank_id
    bs, K, E = t.bs(rank), t.K, t.shape.E
    n = bs * K
    ids = ctx.tensor("expert_ids").as_array(np.int32).reshape(bs, K)
    tokens = np.arange(bs)
    pair = np.ones((bs, K), bool)
    scratch = None
    if t.x_active_mask != "none" or t.shape.special_experts:
        scratch = ctx.alloc("mask_scratch", align32(max(bs * align32(K), n)) * 2)
    if t.x_active_mask != "none":
        if t.x_active_mask == "1d":  # TokenActiveMaskCal: Cast + Sum
            a = yield from active_token_count(ctx, scratch, bs)
            tokens = np.arange(a)
            pair[a:] = False
        else:  # ExpertActiveMaskCal
            m = yield from expert_active_mask_cal(ctx, scratch, bs, K)
            pair &= m
            tokens = np.flatnonzero(m.any(axis=1))
    if t.shape.special_experts:
        yield from mask_zero_compute_expert(ctx, scratch, n)
    pair &= ids < E
    return tokens, np.flatnonzero(pair.reshape(-1))


def expert_active_mask_cal(ctx: KernelContext, scratch, bs: int, K: int) -> Wait:
    """ExpertActiveMaskCal: strided + dense reads of the 2-D mask, Sum over K, GatherMask
    twice. Returns the live pairs (BS, K)."""
    n = bs * K
    mt = ctx.tensor("x_active_mask")
    yield from copy_mask_rows(ctx, scratch, bs, K, "copy_mask_rows")
    ctx.vector_seq(
        "valid_bs",
        [
            *row_sum_instrs(bs, K),
            ("mins", bs, np.float16),
            ("compare", bs, np.float16),
            ("vec_index", bs, I32),
            ("gather_mask", bs, I32),
        ],
        reads=[scratch],
    )
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(ctx.copy_in(scratch, mt, 0, n, name="copy_mask"))
    ctx.vector_seq(
        "valid_pairs",
        [
            ("dup", n, np.float16),
            ("cast", n, np.float16),
            ("dup_mask", n // 8 + 1, np.uint8),
            ("compare", n, np.float16),
            ("vec_index", n, I32),
            ("gather_mask", n, I32),
        ],
        reads=[scratch],
    )
    yield from ctx.pipe_barrier("vector")
    return mt.as_array(np.uint8).astype(bool).reshape(bs, K)


def mask_zero_compute_expert(ctx: KernelContext, scratch, n: int) -> Wait:
    """MaskZeroComputeExpert: the ids compared with E, And, GatherMask (the pairs to special
    experts do not travel)."""
    yield from ctx.wait(
        ctx.copy_in(scratch, ctx.tensor("expert_ids"), 0, 4 * n, name="copy_ids_special")
    )
    ctx.vector_seq(
        "special_mask",
        [
            ("cast", n, I32),
            ("dup", n // 8 + 1, np.uint8),
            ("compare", n, np.float16),
            ("and", n // 8 + 1, np.uint16),
            ("vec_index", n, I32),
            ("gather_mask", n, I32),
        ],
        reads=[scratch],
    )
    yield from ctx.pipe_barrier("vector")


def _send_to_moe_experts(ctx: KernelContext, t: Mc2Tiling, state: int, q: SendQueues,
                         memo: dict, ids_buf: Any, ids: np.ndarray, valid: np.ndarray,
                         es: np.ndarray | None, p0: int, p1: int) -> Wait:
    """The travelling pairs [p0, p1) of this core, each to its expert's slot: its index
    among the pairs for that expert (CalTokenSendExpertCnt), then ProcessToken."""
    rank, K, win = ctx.rank_id, t.K, t.window
    for index in range(p0, p1):
        flat = int(valid[index])
        token, k = divmod(flat, K)
        e = int(ids[index])
        ctx.scalar(4)  # token / k, destination rank, offsets
        if token > 0 and index > 0:
            yield from _cal_token_send_expert_cnt(ctx, ids_buf, index)
        cnt = int(np.count_nonzero(ids[:index] == e)) if index else 0
        block = rank * t.L + e % t.L
        off = win.dispatch_slot_offset(state, block, cnt)
        scale = None if es is None else float(es[flat])
        yield from process_token(ctx, t, q, memo, TokenSend(
            token, k, e + (t.S if t.shape.S_r else 0), t.expert_rank(e), off, scale))


def all_to_all_dispatch(ctx: KernelContext, t: Mc2Tiling, state: int, memo: dict) -> Wait:
    """AlltoAllDispatch: the shared-send cores send every active token to its shared
    experts, the others their contiguous share of the travelling pairs; every core reads
    the (compacted) ids."""
    rank = ctx.rank_id
    K = t.K
    tokens, valid = yield from active_set(ctx, t)
    first_shared = t.moe_send_cores
    shared_core = ctx.core_id >= first_shared and t.shape.S_r > 0
    q = SendQueues(ctx, t, rank)
    n_pairs = t.bs(rank) * K
    ids_buf = ctx.alloc("expert_ids", max(align32(4 * n_pairs), align32(2 * n_pairs)))
    if tokens.size == 0:
        return ids_buf, np.zeros(0, I32), 0
    if shared_core:
        yield from send_to_shared(ctx, t, state, q, memo, ctx.core_id - first_shared, tokens)
    yield from ctx.wait(
        ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * n_pairs, name="copy_ids")
    )
    ids_all = ctx.ub_read(ids_buf, I32, n_pairs, ops=0)
    if valid.size != n_pairs:  # GatherMask into the compact id list
        ctx.vector("gather_ids", n_pairs, I32, reads=[ids_buf], writes=[ids_buf])
        yield from ctx.pipe_barrier("vector")
    ids = ids_all[valid]
    es = None
    if t.expert_scales:
        es_buf = ctx.alloc("expert_scales", align32(4 * n_pairs))
        yield from ctx.wait(
            ctx.copy_in(
                es_buf, ctx.tensor("expert_scales"), 0, 4 * n_pairs, name="copy_expert_scales"
            )
        )
        es = ctx.ub_read(es_buf, F32, n_pairs, ops=0)
    if shared_core:
        return ids_buf, ids, tokens.size
    p0, p1 = split_to_core(valid.size, t.moe_send_cores, ctx.core_id)
    yield from _send_to_moe_experts(ctx, t, state, q, memo, ids_buf, ids, valid, es, p0, p1)
    yield from ctx.pipe_barrier("mte3")
    return ids_buf, ids, tokens.size


def send_to_shared(
    ctx: KernelContext,
    t: Mc2Tiling,
    state: int,
    q: SendQueues,
    memo: dict,
    c: int,
    tokens: np.ndarray,
) -> Wait:
    """SendToSharedExpert: item v -> active token v % activeBS to shared expert v // activeBS,
    into slot v % activeBS of this rank's block."""
    for item in shared_items(t, state, ctx.rank_id, tokens, t.shared_send_cores, c):
        ctx.scalar(4)
        yield from process_token(ctx, t, q, memo, item)
    yield from ctx.pipe_barrier("mte3")


def shared_items(
    t: Mc2Tiling, state: int, rank: int, tokens: np.ndarray, cores: int, c: int
) -> list[TokenSend]:
    """Shared-send core c's contiguous share of the activeBS * S items: item v =
    j * activeBS + slot sends token tokens[slot] as k = K + j (scales row j) to shared
    expert j's rank, into slot `slot` of this rank's block."""
    a = tokens.size
    v0, v1 = split_to_core(a * t.S, cores, c)
    out = []
    for v in range(v0, v1):
        slot, j = v % a, v // a
        off = t.window.dispatch_slot_offset(state, rank, slot)
        out.append(TokenSend(int(tokens[slot]), t.K + j, j, t.shared_dst(rank, j), off))
    return out
