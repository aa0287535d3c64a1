"""The MoE dispatch kernel of the CANN sample (moe_dispatch_and_combine_story, final
version), as a per-core program on the npusim runtime.

Each step follows the sample's DispatchImpl (and its non-quantised twin; per-token INT8
follows ops-transformer's quant_mode 2). Comments name the Ascend C steps. Vector costs
are the sample's instruction counts (see docs/kernels/cann_sample.md); the hardware config turns
them into time.

Core roles: cores [0, n_a2a) send tokens (AllToAllDispatch); the next n_cs cores send
the per-expert counts and form the prefix sums (CalCumSum); with shared experts the last
max(1, C*S // (K+S)) cores send every token to the shared experts (ops-transformer V2
SendToSharedExpert; without them n_cs are the last cores, as in the sample); then every
core copies received tokens from its window to the outputs (LocalWindowCopy).

GM tensors on every rank: x [BS,H], expert_ids [BS,K] int32 (inputs); expand_x,
dynamic_scales, assist_info_for_combine, expert_token_nums, ep_recv_count (outputs);
workspace [cores, W*L] int32 (per-core copies of the prefix table).
"""

from __future__ import annotations

import numpy as np

from npusim.kernels import quant as q
from npusim.kernels.cann_sample.dispatch_count import (
    ONE_F32,
    cal_and_send_cnt,
    load_expert_ids,
    wait_and_prefix_sum,
)
from npusim.kernels.cann_sample.dispatch_local_copy import local_window_copy
from npusim.kernels.cann_sample.layout import (
    SPLIT_BLOCK_BYTES,
    SPLIT_BLOCK_DATA,
)
from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.int8_quant import token_cast_instrs, token_max_instrs
from npusim.kernels.common.split import split_to_core
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align32, align256, align_up, ceil_div

# Register-based vector functions of the MXFP8 quantisation: instructions per loop
# iteration (one iteration = 256 fp16 elements for MaxExp/Data, 128 scales for Scale),
# counted from the sample's moe_distribute_dispatch_quant.h.
MAXEXP_INSTRS, MAXEXP_SETUP = 10, 2
SCALE_INSTRS, SCALE_SETUP = 17, 8
DATA_INSTRS = 27


def dispatch_program(tiling: MoeTiling):
    """The kernel: a program every core of every rank runs once per call."""
    memo: dict[bytes, np.ndarray] = {}  # quantised record by token bytes (a pure function)

    def program(ctx: KernelContext) -> Wait:
        state = yield from init_win_state(ctx, tiling)
        first_shared = tiling.cores - tiling.n_shared_send_cores
        if ctx.core_id < tiling.n_all_to_all:
            with ctx.phase("send_data"):
                yield from all_to_all_dispatch(ctx, tiling, state, memo)
        elif ctx.core_id >= first_shared:
            with ctx.phase("send_data"):
                yield from send_to_shared_expert(
                    ctx, tiling, state, ctx.core_id - first_shared, memo
                )
        else:
            m = ctx.core_id - tiling.n_all_to_all
            with ctx.phase("send_status"):
                yield from cal_and_send_cnt(ctx, tiling, state, m)
            with ctx.phase("wait_status"):
                yield from wait_and_prefix_sum(ctx, tiling, state, m)
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
        with ctx.phase("local_copy"):
            yield from local_window_copy(ctx, tiling, state)

    return program


# --------------------------------------------------------------------------- init
def init_win_state(ctx: KernelContext, t: MoeTiling) -> Wait:
    """InitWinState: read this core's 0/1 data-state word, write back its flip."""
    buf = ctx.alloc("data_state", 32)
    off = t.window.data_state_word(ctx.core_id)
    yield from ctx.wait(ctx.copy_in(buf, ctx.window(), off, 32, name="read_state"))
    state = int(ctx.ub_read(buf, np.uint32, 1)[0])  # SyncFunc<MTE2_S>
    ctx.ub_write(buf, 0, np.array([0 if state else 1], np.uint32))
    ctx.copy_out(ctx.window(), off, buf, 32, name="flip_state")
    return state & 1


# --------------------------------------------------------------------------- send data
def owned_experts(t: MoeTiling, core: int) -> list[tuple[int, int, int]]:
    """SplitExpertNumToCore: (expert, group_size, place_in_group) for each owned expert."""
    n = t.n_all_to_all
    base, r = divmod(t.E, n)
    out = [(core * base + i, 1, 0) for i in range(base)]
    if r:
        extra = core % r + n * base
        group = n // r + (1 if core % r < n % r else 0)
        out.append((extra, group, core // r))
    return out


class SendBuffers:
    """UB of a sending core and the per-token state of its ping-pong (parity, last put)."""

    def __init__(self, ctx: KernelContext, t: MoeTiling) -> None:
        rec = t.record
        h = t.H
        # UB, in the sample's order: input queue, output halves (then the caller's ids),
        # record, scratch.
        if t.dispatch_quant == "none":
            self.in_slots = [
                (ctx.alloc(f"in{p}", align32(2 * h)), ctx.alloc(f"in{p}_triplet", 32))
                for p in range(2)
            ]
        else:
            self.in_slots = [(ctx.alloc(f"in{p}", align_up(h, 128) * 2), None) for p in range(2)]
        self.outs = [ctx.alloc(f"out{p}", rec.slot_bytes) for p in range(2)]
        self.record = self.triplet = self.tail = None
        self.parity = 0
        self.prev_put = None

    def alloc_record(self, ctx: KernelContext, t: MoeTiling) -> None:
        rec = t.record
        if t.dispatch_quant != "none":
            self.record = ctx.alloc("record", rec.triplet_offset)
            self.triplet = ctx.alloc("triplet", 32)
        tail_bytes = rec.blocks * SPLIT_BLOCK_DATA - rec.record_bytes
        self.tail = ctx.alloc("record_tail", tail_bytes) if tail_bytes > 0 else None

    def dup_flags(self, ctx: KernelContext, t: MoeTiling) -> None:
        """Duplicate 1.0f over both output halves: the per-block "arrived" flags."""
        outs = self.outs
        ctx.vector(
            "dup_flags",
            2 * t.record.slot_bytes // 4,
            np.float32,
            writes=outs,
            fn=lambda: [o.view(np.float32).fill(ONE_F32) for o in outs],
        )


def send_token(
    ctx: KernelContext,
    t: MoeTiling,
    b: SendBuffers,
    memo: dict[bytes, np.ndarray],
    token: int,
    k: int,
    dst: int,
    offset: int,
) -> Wait:
    """One token to one expert: (zero-fill,) load, (quantise,) triplet (rank, token, k)
    once the previous put has read the record, pack 480/512, put to ``dst`` at ``offset``."""
    h = t.H
    x = ctx.tensor("x")
    slot_in, trip_in = b.in_slots[b.parity]
    out = b.outs[b.parity]
    if t.dispatch_quant == "none":
        load = ctx.copy_in(slot_in, x, token * 2 * h, 2 * h, name="load_token")
        yield from ctx.wait(load)  # EnQue/DeQue (MTE2 -> V)
        yield from ctx.wait(b.prev_put) if b.prev_put else iter(())  # FillTriple: MTE3_S
        ctx.ub_write(trip_in, 0, np.array([ctx.rank_id, token, k], np.int32), ops=3)
        src_bufs = [slot_in, trip_in]
    else:
        ctx.vector(
            "dup_zero",
            align_up(h, 128) * 2,
            np.uint8,
            writes=[slot_in],
            fn=slot_in.clear,
        )
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
        load = ctx.copy_in(slot_in, x, token * 2 * h, 2 * h, name="load_token")
        yield from ctx.wait(load)  # EnQue/DeQue (MTE2 -> V)
        _quantise(ctx, t, slot_in, b.record, memo)
        yield from ctx.wait(b.prev_put) if b.prev_put else iter(())  # FillTriple: MTE3_S
        ctx.ub_write(b.triplet, 0, np.array([ctx.rank_id, token, k], np.int32), ops=3)
        src_bufs = [b.record, b.triplet]
    if b.tail is not None:
        src_bufs.append(b.tail)
    _pack(ctx, t, src_bufs, out)
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
    b.prev_put = ctx.put(dst, offset, out, t.record.slot_bytes, name="put_token")
    b.parity ^= 1


def all_to_all_dispatch(
    ctx: KernelContext, t: MoeTiling, state: int, memo: dict[bytes, np.ndarray]
) -> Wait:
    rec = t.record
    lay = t.window
    b = SendBuffers(ctx, t)
    ids_buf, ids = yield from load_expert_ids(ctx, t, "expert_ids")
    b.alloc_record(ctx, t)
    owned = owned_experts(t, ctx.core_id)
    mask_bytes = align32(align256(4 * t.BS * t.K) // 4 // 8)
    mask = ctx.alloc("expert_mask", mask_bytes * max(1, len(owned)))

    # CalExpertSendNum: a bit mask and a count per owned expert.
    compare_count = align256(4 * t.BS * t.K) // 4
    ctx.vector(
        "dup_mask", mask.nbytes, np.uint8, writes=[mask], fn=lambda: mask.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    positions = []
    for e, _, _ in owned:
        ctx.vector("compare_scalar", compare_count, np.int32, reads=[ids_buf], writes=[mask])
        ctx.vector("gather_mask", t.BS * t.K, np.int32, reads=[ids_buf, mask])
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
        ctx.scalar(1)
        positions.append(np.flatnonzero(ids == e))
    b.dup_flags(ctx, t)
    yield from ctx.pipe_barrier("vector")

    words = ceil_div(t.BS * t.K, 64)
    n_owned = len(owned)
    for idx in range(n_owned):
        i = (idx + ctx.rank_id % n_owned) % n_owned if n_owned else 0
        e, group, place = owned[i]
        flat_ids = positions[i]
        if flat_ids.size == 0:
            continue
        dst = t.expert_rank(e)
        block = lay.dispatch_block(state, ctx.rank_id, e % t.L)
        ctx.loop(words)
        for j, flat in enumerate(flat_ids.tolist()):
            ctx.scalar(8)  # ScalarGetSFFValue, token/k, slot offset, group test
            if j % group != place:
                continue
            token, k = divmod(flat, t.K)
            yield from send_token(ctx, t, b, memo, token, k, dst, block + j * rec.slot_bytes)
    yield from ctx.pipe_barrier("mte3")


def send_to_shared_expert(
    ctx: KernelContext, t: MoeTiling, state: int, c: int, memo: dict[bytes, np.ndarray]
) -> Wait:
    """SendToSharedExpert (ops-transformer V2; the sample has no shared experts).

    Shared-send core ``c`` takes a contiguous share (SplitToCore) of the BS*S items
    v = j*BS + token (shared expert j major). Token ``token`` of this rank r goes to the
    replica (r mod R) + j*R, into the block of source r at row ``token``, with the
    triplet (r, token, K + j): combine sends the result back to slot K + j."""
    b = SendBuffers(ctx, t)
    b.alloc_record(ctx, t)
    b.dup_flags(ctx, t)
    yield from ctx.pipe_barrier("vector")
    v0, v1 = split_to_core(t.BS * t.S, t.n_shared_send_cores, c)
    block = t.window.shared_block(state, ctx.rank_id)
    for v in range(v0, v1):
        j, token = divmod(v, t.BS)
        ctx.scalar(4)  # token / expert index, destination rank, slot offset
        yield from send_token(
            ctx,
            t,
            b,
            memo,
            token,
            t.K + j,
            t.shared_dst(ctx.rank_id, j),
            block + token * t.record.slot_bytes,
        )
    yield from ctx.pipe_barrier("mte3")


def _quantise(
    ctx: KernelContext, t: MoeTiling, slot, record, memo: dict[bytes, np.ndarray]
) -> None:
    """Quantise the token in `slot` into `record` on the vector unit.

    A token is sent to K experts and quantised K times by the kernel; the result is a
    pure function of its bytes, so it is computed once and remembered by those bytes."""
    rec = t.record
    payload = rec.scale_offset + rec.scale_bytes

    def effect() -> None:
        row = slot.bytes_at(0, 2 * t.H)
        key = row.tobytes()
        out = memo.get(key)
        if out is None:
            out = memo[key] = _quantised_record(t, row)
        record.view(np.uint8, payload)[:] = out

    fn = None if t.timing_only else effect
    if t.dispatch_quant == "mxfp8":
        _quant_mxfp8(ctx, t, slot, record, fn)
    else:
        _quant_dynamic_per_token(ctx, t, slot, record, fn)


def _quantised_record(t: MoeTiling, row: np.ndarray) -> np.ndarray:
    """A token's record payload: its quantised data, then its scales at scale_offset."""
    h, rec = t.H, t.record
    payload = rec.scale_offset + rec.scale_bytes
    out = np.zeros(payload, np.uint8)
    x = row.view(q.token_dtype(t.dtype))
    if t.dispatch_quant == "mxfp8":
        data, scales = q.mxfp8_quantize(x, saturate=t.mxfp8_saturate)
        out[:h] = data[0]
        out[rec.scale_offset : payload] = scales[0]
    else:
        qv, scale = q.int8_token_quantize(x)
        out[:h] = qv[0].view(np.uint8)
        out[rec.scale_offset : payload] = scale.view(np.uint8)
    return out


def _quant_mxfp8(ctx: KernelContext, t: MoeTiling, slot, record, fn) -> None:
    """Three VFs back to back: the block max exponents, the E8M0 scales, the data."""
    iters = ceil_div(t.H, 256)
    ctx.vector_function(
        "mxfp8_quant",
        [
            iters * MAXEXP_INSTRS + MAXEXP_SETUP,
            ceil_div(t.record.scale_bytes, 128) * SCALE_INSTRS + SCALE_SETUP,
            iters * DATA_INSTRS,
        ],
        reads=[slot],
        writes=[record],
        fn=fn,
    )


def _quant_dynamic_per_token(ctx: KernelContext, t: MoeTiling, slot, record, fn) -> None:
    """Per-token dynamic INT8 (ops-transformer QuantDynamicPerToken): the row's max, then
    d = 127 / max on the scalar unit, then the scaled casts down to int8."""
    ctx.vector_seq("int8_max", token_max_instrs(t.H), reads=[slot])
    ctx.scalar(12)  # SyncFunc<V_S>, d = 127 / max
    ctx.vector_seq("int8_scale", token_cast_instrs(t.H), reads=[slot], writes=[record], fn=fn)


def _pack(ctx: KernelContext, t: MoeTiling, src_bufs: list, out) -> None:
    """Two strided vector Copies: record bytes [480r, 480r+480) -> out [512r, 512r+480)."""
    rec = t.record
    first = src_bufs[0]
    nbytes = rec.blocks * SPLIT_BLOCK_DATA

    def effect() -> None:
        ub = first.ub.data
        payload = ub[first.offset : first.offset + nbytes].reshape(rec.blocks, SPLIT_BLOCK_DATA)
        o = out.view(np.uint8).reshape(rec.blocks, SPLIT_BLOCK_BYTES)
        o[:, :SPLIT_BLOCK_DATA] = payload

    # one repeat per 512 B block each; always applied, also timing-only: the triplet
    # travels in the record
    per_copy = rec.blocks * ctx.cfg.vector.bytes_per_cycle
    ctx.vector_seq(
        "pack_copy",
        [("copy_a", per_copy, np.uint8), ("copy_b", per_copy, np.uint8)],
        reads=src_bufs,
        writes=[out],
        fn=effect,
    )
