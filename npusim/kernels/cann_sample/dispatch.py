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
from npusim.kernels.cann_sample.layout import (
    SPLIT_BLOCK_BYTES,
    SPLIT_BLOCK_DATA,
    UB_USABLE_FOR_LOCAL_COPY,
)
from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.cumsum import clear_cum_sum_column
from npusim.kernels.common.drain import drain_round_robin, valid_expert_info
from npusim.kernels.common.split import split_to_core
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32, align256, align_up, ceil_div

KiB = 1024
UB_BUDGET_NON_QUANT = 190 * KiB  # MAX_UB_SIZE of the non-quantised local copy
UB_HEADROOM = 16 * KiB  # 256 KiB UB - the sample's 240 KiB budget
ONE_F32 = np.float32(1.0)

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


def _load_expert_ids(ctx: KernelContext, t: MoeTiling, name: str) -> Wait:
    """ExpIdsCopy: pad with -1 on V, then DataCopyPad the BS*K ids GM -> UB."""
    n = t.bs * t.k
    buf = ctx.alloc(name, align256(4 * n))
    count = align256(4 * n) // 4
    ctx.vector("dup_ids", count, np.int32, writes=[buf], fn=lambda: buf.view(np.int32).fill(-1))
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
    yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("expert_ids"), 0, 4 * n, name="copy_ids"))
    ids = ctx.ub_read(buf, np.int32, n, ops=0)  # SyncFunc<MTE2_S>
    return buf, ids


# --------------------------------------------------------------------------- send data
def owned_experts(t: MoeTiling, core: int) -> list[tuple[int, int, int]]:
    """SplitExpertNumToCore: (expert, group_size, place_in_group) for each owned expert."""
    n = t.n_all_to_all
    base, r = divmod(t.n_experts, n)
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
        h = t.h
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
    h = t.h
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
            fn=lambda s=slot_in: s.view(np.uint8).fill(0),
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
    ids_buf, ids = yield from _load_expert_ids(ctx, t, "expert_ids")
    b.alloc_record(ctx, t)
    owned = owned_experts(t, ctx.core_id)
    mask_bytes = align32(align256(4 * t.bs * t.k) // 4 // 8)
    mask = ctx.alloc("expert_mask", mask_bytes * max(1, len(owned)))

    # CalExpertSendNum: a bit mask and a count per owned expert.
    compare_count = align256(4 * t.bs * t.k) // 4
    ctx.vector(
        "dup_mask", mask.nbytes, np.uint8, writes=[mask], fn=lambda: mask.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    positions = []
    for e, _, _ in owned:
        ctx.vector("compare_scalar", compare_count, np.int32, reads=[ids_buf], writes=[mask])
        ctx.vector("gather_mask", t.bs * t.k, np.int32, reads=[ids_buf, mask])
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
        ctx.scalar(1)
        positions.append(np.flatnonzero(ids == e))
    b.dup_flags(ctx, t)
    yield from ctx.pipe_barrier("vector")

    words = ceil_div(t.bs * t.k, 64)
    n_owned = len(owned)
    for idx in range(n_owned):
        i = (idx + ctx.rank_id % n_owned) % n_owned if n_owned else 0
        e, group, place = owned[i]
        flat_ids = positions[i]
        if flat_ids.size == 0:
            continue
        dst = t.expert_rank(e)
        block = lay.dispatch_block(state, ctx.rank_id, e % t.experts_per_rank)
        ctx.loop(words)
        for j, flat in enumerate(flat_ids.tolist()):
            ctx.scalar(8)  # ScalarGetSFFValue, token/k, slot offset, group test
            if j % group != place:
                continue
            token, k = divmod(flat, t.k)
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
    v0, v1 = split_to_core(t.bs * t.shared_experts, t.n_shared_send_cores, c)
    block = t.window.shared_block(state, ctx.rank_id)
    for v in range(v0, v1):
        j, token = divmod(v, t.bs)
        ctx.scalar(4)  # token / expert index, destination rank, slot offset
        yield from send_token(
            ctx,
            t,
            b,
            memo,
            token,
            t.k + j,
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
    h = t.h
    dt = q.token_dtype(t.dtype)
    rec = t.record
    payload = rec.scale_offset + rec.scale_bytes

    def effect() -> None:
        row = slot.bytes_at(0, 2 * h)
        key = row.tobytes()
        out = memo.get(key)
        if out is None:
            out = np.zeros(payload, np.uint8)
            x = row.view(dt)
            if t.dispatch_quant == "mxfp8":
                data, scales = q.mxfp8_quantize(x, saturate=t.mxfp8_saturate)
                out[:h] = data[0]
                out[rec.scale_offset : payload] = scales[0]
            else:
                qv, scale = q.int8_token_quantize(x)
                out[:h] = qv[0].view(np.uint8)
                out[rec.scale_offset : payload] = scale.view(np.uint8)
            memo[key] = out
        record.view(np.uint8, payload)[:] = out

    fn = None if t.timing_only else effect
    if t.dispatch_quant == "mxfp8":
        iters = ceil_div(h, 256)
        # three VFs back to back: the block max exponents, the E8M0 scales, the data
        ctx.vector_function(
            "mxfp8_quant",
            [
                iters * MAXEXP_INSTRS + MAXEXP_SETUP,
                ceil_div(rec.scale_bytes, 128) * SCALE_INSTRS + SCALE_SETUP,
                iters * DATA_INSTRS,
            ],
            reads=[slot],
            writes=[record],
            fn=fn,
        )
    else:  # per-token dynamic INT8 (ops-transformer QuantDynamicPerToken)
        f32 = np.float32
        ctx.vector_seq(
            "int8_max",
            [("cast_f32", h, f32), ("abs", h, f32), ("reduce_max", h, f32)],
            reads=[slot],
        )
        ctx.scalar(12)  # SyncFunc<V_S>, d = 127 / max
        ctx.vector_seq(
            "int8_scale",
            [
                ("muls", h, f32),
                ("cast_i32", h, f32),
                ("cast_f16", h, f32),
                ("cast_i8", h, np.float16),
            ],
            reads=[slot],
            writes=[record],
            fn=fn,
        )


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


# --------------------------------------------------------------------------- counts
def cal_and_send_cnt(ctx: KernelContext, t: MoeTiling, state: int, m: int) -> Wait:
    """CalAndSendCnt: count the ids of each expert of my range, put (1.0, count) entries.

    With shared experts the range covers S_r + E status "experts" (ops-transformer V2
    SetStatus): index i < S_r is shared rank i, which gets count BS if this rank sends to
    it (i mod R == r mod R) and 0 otherwise, at its status entry of source r; index
    S_r + e is MoE expert e as in the sample."""
    ids_buf, ids = yield from _load_expert_ids(ctx, t, "cs_expert_ids")
    n_sr = t.shared_expert_ranks
    e0, e1 = split_to_core(n_sr + t.n_experts, t.n_cumsum, m)
    entries = [ctx.alloc(f"status{e}", 32) for e in range(e0, e1)]
    n_entries = ceil_div(n_sr + t.n_experts, 8) * 8  # Align8(S_r + E)

    def flags() -> None:
        for b in entries:
            b.view(np.float32).fill(0)
            b.view(np.float32)[0] = ONE_F32

    ctx.vector("dup_status", n_entries * 8, np.int32, writes=entries)
    ctx.vector("dup_flag", repeats=n_entries // 8, writes=entries, fn=flags)
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    n = t.bs * t.k
    for i, buf in zip(range(e0, e1), entries, strict=True):
        if i < n_sr:  # a shared rank: every token of mine, or none
            R = t.ranks_per_shared_expert
            ctx.scalar(2)
            count = t.bs if i % R == ctx.rank_id % R else 0
            dst, le = i, 0
        else:
            e = i - n_sr
            for op in ("dup", "sub", "abs", "mins"):
                ctx.vector(op, n, np.int32, reads=[ids_buf])
            ctx.vector("reduce_sum", n, np.float32, reads=[ids_buf])
            yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
            count = int(np.count_nonzero(ids == e))
            dst, le = t.expert_rank(e), e % t.experts_per_rank
        ctx.ub_write(buf, 4, np.array([count], np.int32))
        off = t.window.dispatch_status_entry(state, le, ctx.rank_id)
        ctx.put(dst, off, buf, 32, name="put_status")
    yield from ctx.drain()


# --------------------------------------------------------------------------- prefix sums
def wait_and_prefix_sum(ctx: KernelContext, t: MoeTiling, state: int, m: int) -> Wait:
    """WaitDispatch + CalRecvAndSetFlag (+ SetExpertTokenNums on cum-sum core 0).

    A MoE rank has W*L status entries (local expert major); a shared rank has W, one per
    source rank, and a single expert_token_nums entry."""
    ctx.ub.reset()
    wl = t.status_count(ctx.rank_id)
    n_local = t.local_experts(ctx.rank_id)
    n_cs = t.n_cumsum
    s0, s1 = split_to_core(wl, n_cs, m)
    n_s = s1 - s0
    wait_buf = ctx.alloc("wait_status", align256(32 * max(n_s, 1)))
    handoff = ctx.alloc("partial_sums", 32 * n_cs)
    row_buf = ctx.alloc("prefix_slice", align32(4 * max(n_s, 1)))
    ones = ctx.alloc("ready_ones", 32 * ctx.num_cores)
    column = ctx.alloc("handoff_column", 32 * n_cs)
    all_status = ctx.alloc("all_status", 32 * wl)
    token_nums = ctx.alloc("expert_token_nums", align32(8 * n_local))
    counts = yield from wait_dispatch(ctx, t, state, s0, n_s, wait_buf)
    yield from gather_sum_recv_cnt(ctx, t, m, int(counts.sum()), max(n_s, 1), wait_buf, handoff)
    before = yield from get_cum_sum(ctx, t, m, column)
    yield from cal_recv_and_set_flag(ctx, t, m, s0, before, counts, row_buf, ones)
    if m == 0:
        yield from set_expert_token_nums(ctx, t, state, all_status, token_nums)
    yield from ctx.drain()


def wait_dispatch(
    ctx: KernelContext, t: MoeTiling, state: int, s0: int, n_s: int, wait_buf
) -> Wait:
    """WaitDispatch: poll my n_s statuses until every flag is 1.0 (ReduceSum of the flags
    == n_s), then clear the flags (word 0 of each entry), keep the counts and write back.
    Returns the counts."""
    win = ctx.window()
    status_base = t.window.dispatch_status_entry(state, 0, 0)
    check_ns = ctx.check_ns(max(1, ceil_div(n_s, 8)))
    if not n_s:
        return np.zeros(0, np.int64)
    yield from ctx.wait_until(
        win,
        status_base + 32 * s0,
        32 * n_s,
        SumEquals(np.float32, float(n_s), stride=32),
        wait_buf,
        name="wait_status",
        check_ns=check_ns,
    )
    counts = wait_buf.view(np.int32, 8 * n_s).reshape(n_s, 8)[:, 1].astype(np.int64)

    def clear_flags() -> None:
        wait_buf.view(np.int32, 8 * n_s).reshape(n_s, 8)[:, 0] = 0

    ctx.vector("clear_flags", repeats=n_s, writes=[wait_buf], fn=clear_flags)
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(
        ctx.copy_out(win, status_base + 32 * s0, wait_buf, 32 * n_s, name="clear_status")
    )
    return counts


def gather_sum_recv_cnt(
    ctx: KernelContext, t: MoeTiling, m: int, partial: int, repeats: int, wait_buf, handoff
) -> Wait:
    """GatherSumRecvCnt: my partial sum, sent to every cum-sum core (row m of the matrix)."""
    n_cs = t.n_cumsum
    ctx.vector("gather_counts", repeats=repeats, reads=[wait_buf])
    ctx.vector("sum_counts", repeats, np.float32)
    yield from ctx.pipe_barrier("vector")
    ctx.scalar(2)

    def fill_handoff() -> None:
        v = handoff.view(np.int32).reshape(n_cs, 8)
        v[:] = 0
        v[:, 0] = partial
        v[:, 1] = ONE_F32.view(np.int32)

    ctx.vector("dup_partial", n_cs * 8, np.int32, writes=[handoff], fn=fill_handoff)
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(
        ctx.window(), t.window.status.cumsum_cal(n_cs, m), handoff, 32 * n_cs, name="put_partial"
    )


def get_cum_sum(ctx: KernelContext, t: MoeTiling, m: int, column) -> Wait:
    """GetCumSum: poll column m (one entry from each cum-sum core) until every flag is 1.0,
    clear it; returns the partial sums of the cum-sum cores before m."""
    n_cs, win, status = t.n_cumsum, ctx.window(), t.window.status
    col = Strided(n_cs, 32, src_gap=(n_cs - 1) * 32)
    yield from ctx.wait_until(
        win,
        status.cumsum_cal(n_cs, 0, m),
        0,
        SumEquals(np.float32, float(n_cs), stride=32, offset=4),
        column,
        strided=col,
        name="wait_partials",
        check_ns=ctx.check_ns(max(1, ceil_div(n_cs, 8))),
    )
    cells = column.view(np.int32).reshape(n_cs, 8)
    before = int(cells[:m, 0].sum())
    ctx.vector("gather_prefix", repeats=max(m, 1), reads=[column])
    yield from ctx.pipe_barrier("vector")
    yield from clear_cum_sum_column(ctx, status, column, n_cs, m)
    return before


def cal_recv_and_set_flag(
    ctx: KernelContext,
    t: MoeTiling,
    m: int,
    s0: int,
    before: int,
    counts: np.ndarray,
    row_buf,
    ones,
) -> Wait:
    """CalRecvAndSetFlag: the inclusive prefix over index le*W + src for my slice (by the
    scalar unit) into ep_recv_count and every core's copy of the table, then every core's
    ready flag raised."""
    n_s, n_cs, wl = len(counts), t.n_cumsum, t.status_count(ctx.rank_id)
    prefix = (before + np.cumsum(counts)).astype(np.int32)
    if n_s:
        ctx.ub_write(row_buf, 0, prefix, ops=2 * n_s)
        ctx.copy_out(
            ctx.tensor("ep_recv_count"), 4 * s0, row_buf, 4 * n_s, name="write_ep_recv_count"
        )
        workspace = ctx.tensor("workspace")
        for c in range(ctx.num_cores):  # my slice into every core's copy of the table
            ctx.copy_out(workspace, 4 * (c * wl + s0), row_buf, 4 * n_s, name="write_workspace")
    ctx.vector(
        "dup_ready",
        ctx.num_cores * 8,
        np.int32,
        writes=[ones],
        fn=lambda: ones.view(np.int32).fill(1),
    )
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(
        ctx.window(),
        t.window.status.cumsum_flag(n_cs, 0, m),
        ones,
        0,
        strided=Strided(ctx.num_cores, 32, dst_gap=(n_cs - 1) * 32),
        name="set_ready",
    )


def set_expert_token_nums(
    ctx: KernelContext, t: MoeTiling, state: int, all_status, token_nums
) -> Wait:
    """SetExpertTokenNums (cum-sum core 0): re-read all statuses (flag + count) of this
    state, reduce over the sources, write int64 (cumsum or counts)."""
    n_local, wl = t.local_experts(ctx.rank_id), t.status_count(ctx.rank_id)
    status_base = t.window.dispatch_status_entry(state, 0, 0)
    yield from ctx.wait(
        ctx.copy_in(all_status, ctx.window(), status_base, 32 * wl, name="read_all_status")
    )
    per_le = all_status.view(np.int32).reshape(n_local, t.world, 8)[:, :, 1]
    nums = per_le.sum(axis=1).astype(np.int64)
    for _ in range(n_local):
        ctx.vector("reduce_sum", 2 * t.world, np.float32, reads=[all_status])
    yield from ctx.pipe_barrier("vector")
    if t.expert_token_nums_type == "cumsum":
        nums = np.cumsum(nums)
    ctx.ub_write(token_nums, 0, nums.astype(np.int64), ops=2 * n_local)
    ctx.copy_out(
        ctx.tensor("expert_token_nums"), 0, token_nums, 8 * n_local, name="write_expert_token_nums"
    )


# --------------------------------------------------------------------------- local copy
def local_window_copy(ctx: KernelContext, t: MoeTiling, state: int) -> Wait:
    """Wait for the prefix table, then drain my status indices' tokens into the outputs."""
    ctx.ub.reset()
    n_cs = t.n_cumsum
    wl = t.status_count(ctx.rank_id)
    ready = ctx.alloc("ready", 32 * n_cs)
    cum_buf = ctx.alloc("cumsum", align32(4 * wl))
    zero = ctx.alloc("ready_clear", 32 * n_cs)
    yield from wait_cum_sum_flag(ctx, t, ready, zero)
    i0, i1 = split_to_core(wl, ctx.num_cores, ctx.core_id)
    if i1 <= i0:
        return
    budget = UB_BUDGET_NON_QUANT if t.dispatch_quant == "none" else UB_USABLE_FOR_LOCAL_COPY
    # The sample's budget is sized for 256 KiB of UB; on a smaller UB (Atlas A3, 192 KiB)
    # keep the same 16 KiB of headroom below the capacity (docs/kernels/cann_sample.md).
    budget = min(budget, ctx.ub.capacity - UB_HEADROOM)
    small = 32 + align32(4 * wl) + 64 * n_cs + 3 * align32(4 * (i1 - i0)) + 64
    tbuf_bytes = budget - small
    max_tokens = tbuf_bytes // t.record.slot_bytes
    tbuf = ctx.alloc("tokens", tbuf_bytes)
    flag_zero = ctx.alloc("flag_zero", 32)
    # SetValidExpertInfo: my copy of the prefix table, then per index the rows left.
    yield from ctx.wait(
        ctx.copy_in(
            cum_buf, ctx.tensor("workspace"), 4 * ctx.core_id * wl, 4 * wl, name="read_prefix"
        )
    )
    cum = ctx.ub_read(cum_buf, np.int32, wl, ops=0).astype(np.int64)
    ctx.scalar(4 * (i1 - i0))
    valid = valid_expert_info(cum, i0, i1)
    if not valid:
        return
    yield from wait_and_format_output(ctx, t, state, valid, tbuf, max_tokens, flag_zero)


def wait_cum_sum_flag(ctx: KernelContext, t: MoeTiling, ready, zero) -> Wait:
    """WaitCumSumFlag: every cum-sum core has raised my ready flag (8 x int32 1 each);
    then cleared."""
    n_cs, win = t.n_cumsum, ctx.window()
    ready_off = t.window.status.cumsum_flag(n_cs, ctx.core_id)
    yield from ctx.wait_until(
        win,
        ready_off,
        32 * n_cs,
        SumEquals(np.int32, 8.0 * n_cs),
        ready,
        name="wait_ready",
        check_ns=ctx.check_ns(n_cs),
    )
    ctx.vector(
        "dup_zero", 8 * n_cs, np.int32, writes=[zero], fn=lambda: zero.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(win, ready_off, zero, 32 * n_cs, name="clear_ready")


def wait_and_format_output(
    ctx: KernelContext, t: MoeTiling, state: int, valid: list, tbuf, max_tokens: int, flag_zero
) -> Wait:
    """WaitAndFormatOutput: round robin over my indices with rows left; arrived rows copied
    out (CopyInAndOut), a drained index's block flags cleared for the next call."""
    rec, win = t.record, ctx.window()
    ctx.vector(
        "dup_pattern", 16, np.int32, writes=[flag_zero], fn=lambda: flag_zero.view(np.uint8).fill(0)
    )
    yield from ctx.pipe_barrier("vector")

    def block_of(idx: int) -> int:
        return _block_base(t, state, idx, ctx.rank_id)

    def copy_rows(src: int, row: int, n: int) -> Wait:
        yield from copy_in_and_out(ctx, t, tbuf, src, row, n)

    def after(block: int, finish: int, drained: bool) -> Wait:
        if drained:  # clear every block flag of this index for the next call
            yield from ctx.pipe_barrier("mte3")
            ctx.vector("dup_zero", 8, np.int32, writes=[flag_zero])
            yield from ctx.pipe_barrier("vector")
            ctx.copy_out(
                win,
                block + SPLIT_BLOCK_DATA,
                flag_zero,
                0,
                strided=Strided(rec.blocks * finish, 4, src_gap=-4, dst_gap=SPLIT_BLOCK_BYTES - 4),
                name="clear_block_flags",
            )
        yield from ctx.drain()  # PipeBarrier<PIPE_ALL>

    yield from drain_round_robin(
        ctx, valid, max_tokens, block_of, rec.slot_bytes, rec.blocks, tbuf, copy_rows, after
    )


def copy_in_and_out(ctx: KernelContext, t: MoeTiling, tbuf, src: int, row: int, n: int) -> Wait:
    """CopyInAndOut: strip the flags on the way in, then three strided copies out."""
    rec = t.record
    stride = rec.blocks * SPLIT_BLOCK_DATA  # a token's bytes in UB once the flags are gone
    yield from ctx.wait(
        ctx.copy_in(
            tbuf,
            ctx.window(),
            src,
            0,
            name="copy_tokens",
            strided=Strided(rec.blocks * n, SPLIT_BLOCK_DATA, src_gap=32),
        )
    )
    scale_bytes = rec.scale_bytes
    out_scales = ctx.tensor("dynamic_scales")
    if scale_bytes and t.dispatch_quant == "mxfp8":
        ctx.copy_out(
            out_scales,
            row * scale_bytes,
            tbuf,
            0,
            src_offset=rec.scale_offset,
            strided=Strided(n, scale_bytes, src_gap=stride - scale_bytes),
            name="write_scales",
        )
    elif t.dispatch_quant == "int8":
        ctx.copy_out(
            out_scales,
            row * 4,
            tbuf,
            0,
            src_offset=rec.scale_offset,
            strided=Strided(n, 4, src_gap=stride - 4),
            name="write_scales",
        )
    row_bytes = rec.data_bytes
    ctx.copy_out(
        ctx.tensor("expand_x"),
        row * row_bytes,
        tbuf,
        0,
        strided=Strided(n, row_bytes, src_gap=stride - row_bytes),
        name="write_expand_x",
    )
    ctx.copy_out(
        ctx.tensor("assist_info_for_combine"),
        row * 12,
        tbuf,
        0,
        src_offset=rec.triplet_offset,
        strided=Strided(n, 12, src_gap=stride - 12),
        name="write_assist_info",
    )


def _block_base(t: MoeTiling, state: int, idx: int, rank: int) -> int:
    """Window block of status index idx: source idx on a shared rank, else (le, src)."""
    if t.is_shared_rank(rank):
        return t.window.shared_block(state, idx)
    le, src = divmod(idx, t.world)
    return t.window.dispatch_block(state, src, le)
