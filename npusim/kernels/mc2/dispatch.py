"""MoeDistributeDispatchV2 (fullmesh_v1, the V3 default) as a per-core program.

Steps as in ``moe_distribute_dispatch_v2.h`` (docs/kernels/mc2.md, with line
numbers): AlltoAllDispatch, SetStatus (SyncAll, then the count entries), WaitDispatch (A3:
SyncCntOnCore; SyncAll), LocalWindowCopy, SetExpertTokenNums. Vector work is charged per
instruction as the kernel issues it; CalTokenSendExpertCnt's five instructions run over
every earlier (token, k) pair of the core's range, so the send is quadratic in BS * K.

GM tensors per rank: x, expert_ids, [scales], [expert_scales] in; expand_x, dynamic_scales,
assist_info_for_combine, expert_token_nums, ep_recv_count, [expand_scales] out; workspace
(A3: C x C rows of 512 B for SyncCntOnCore).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.kernels.common.align import align32, ceil_div
from npusim.kernels.common.split import split_to_core
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2 import reference as ref
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.quant import int8_token_quantize, token_dtype
from npusim.runtime.conditions import SumEquals
from npusim.runtime.context import KernelContext, Strided

Wait = Generator[Any, Any, Any]
F32, I32 = np.float32, np.int32
ONE = np.float32(1.0)
PHASES = ("send", "set_status", "wait_dispatch", "local_copy", "token_nums")


class SumAtLeast(SumEquals):
    """At least `value` flags set: the poll that first sees a new arrival."""

    def __call__(self, data: np.ndarray) -> bool:
        return self.total(data) >= self.value - self.tolerance


def dispatch_program(t: Mc2Tiling):
    memo: dict[tuple[int, int, int], np.ndarray] = {}  # (rank, token, scale row) -> record

    def program(ctx: KernelContext) -> Wait:
        state = yield from init_win_state(ctx, t.window.dispatch_state_word(ctx.core_id))
        with ctx.phase("send"):
            ids = yield from all_to_all_dispatch(ctx, t, state, memo)
        with ctx.phase("set_status"):
            yield from set_status(ctx, t, state, ids)
        ctx.ub.reset()  # BufferInit: tpipe_->Reset()
        with ctx.phase("wait_dispatch"):
            counts = yield from wait_dispatch(ctx, t, state)
        with ctx.phase("local_copy"):
            total = yield from local_window_copy(ctx, t, state, counts)
        if t.update_token_nums_out:
            with ctx.phase("token_nums"):
                yield from update_token_nums_out(ctx, t, total)
        elif ctx.core_id == 0:
            with ctx.phase("token_nums"):
                yield from set_expert_token_nums(ctx, t, state)

    return program


def init_win_state(ctx: KernelContext, offset: int) -> Wait:
    """InitWinState: read the core's state word, write back its flip (and the op counter)."""
    buf = ctx.alloc("data_state", 32)
    yield from ctx.wait(ctx.copy_in(buf, ctx.window(), offset, 32, name="read_state"))
    words = ctx.ub_read(buf, np.uint32, 8)
    state = int(words[0]) & 1
    words[0] = 1 - state
    words[1] = 1
    ctx.ub_write(buf, 0, words, ops=8)
    ctx.copy_out(ctx.window(), offset, buf, 32, name="flip_state")
    return state


# --------------------------------------------------------------------------- send
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


def process_token(ctx: KernelContext, t: Mc2Tiling, q: SendQueues, memo: dict, token: int,
                  k: int, scale_row: int, dst: int, offset: int, expert_scale: float | None
                  ) -> Wait:
    """ProcessToken: load the row, [quantise], FillTriple, one put of the slot's bytes."""
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
        if qm.fp8_mode(t.dispatch_quant):  # Duplicate(QUANT_PADDING_VALUE): zero the tail
            qm.zero_fill(ctx, src, h, t.timing_only)
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE2>
        yield from ctx.wait(ctx.copy_in(src, x, token * 2 * h, 2 * h, name="load_token"))
        _quantise(ctx, t, src, out, memo, token, scale_row)
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_S>
    trip = np.array([ctx.rank_id, token, k], I32)
    ctx.ub_write(out, slot.triplet_offset, trip, ops=3)
    if slot.expert_scale_offset is not None:
        ctx.ub_write(out, slot.expert_scale_offset,
                     np.array([0.0 if expert_scale is None else expert_scale], F32))
    q.puts[p] = ctx.put(dst, offset, out, slot.moved, name="put_token")


def _quantise(ctx: KernelContext, t: Mc2Tiling, src, out, memo: dict, token: int,
              scale_row: int) -> None:
    """QuantStatic / QuantDynamicPerToken on V (the 950's FP8 modes: their VFs,
    npusim.kernels.mc2.quant_modes); the record is remembered per (token, row)."""
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
            if qm.fp8_mode(t.dispatch_quant):
                smooth = None
                if scales is not None:
                    smooth = scales.as_array(F32).reshape(-1, h)[scale_row]
                qm.quantise_record(row, t.dispatch_quant, t.quant_dtype, rec, smooth)
            elif t.dispatch_quant == "static_int8":
                sc = scales.as_array(F32)
                sc = sc if sc.size in (1, h) else sc.reshape(-1, h)[scale_row]
                rec[:h] = ref.static_int8_quantize(row, sc).view(np.uint8)
            else:
                smooth = None
                if scales is not None:
                    smooth = scales.as_array(F32).reshape(-1, h)[scale_row]
                qv, s = int8_token_quantize(row[None, :], smooth)
                rec[:h] = qv[0].view(np.uint8)
                rec[slot.scale_offset:slot.scale_offset + 4] = s.view(np.uint8)
            memo[key] = rec
        out.bytes_at(0, slot.triplet_offset)[:] = rec

    fn = None if t.timing_only else effect
    if qm.fp8_mode(t.dispatch_quant):
        ctx.vf("quant", qm.quant_vfs(h, t.dispatch_quant, dt == np.float16, t.smooth_scales),
               reads=[src], writes=[out], fn=fn)
        return
    seq = [("cast_f32", h, F32)]
    if t.smooth_scales:
        seq.append(("mul_scales", h, F32))
    if t.dispatch_quant == "int8":
        seq += [("abs", h, F32), ("reduce_max", h, F32)]
        ctx.vector_seq("int8_max", seq, reads=[src])
        ctx.scalar(4)  # SyncFunc<V_S>, 127 / max
        seq = [("muls", h, F32)]
    seq += [("cast_i32", h, F32), ("cast_f16", h, F32), ("cast_i8", h, np.float16)]
    ctx.vector_seq("quant", seq, reads=[src], writes=[out], fn=fn)
    if t.dispatch_quant == "int8":
        ctx.scalar(2)  # SetValue of the scale


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
        mt = ctx.tensor("x_active_mask")
        raw = mt.as_array(np.uint8).astype(bool)
        if t.x_active_mask == "1d":  # TokenActiveMaskCal: Cast + Sum
            yield from ctx.wait(ctx.copy_in(scratch, mt, 0, bs, name="copy_mask"))
            ctx.vector_seq("token_mask", [("cast", bs, np.float16), ("sum", bs, np.float16)],
                           reads=[scratch])
            yield from ctx.pipe_barrier("vector")
            a = int(np.count_nonzero(raw))
            tokens = np.arange(a)
            pair[a:] = False
        else:  # ExpertActiveMaskCal: strided + dense reads, Sum over K, GatherMask twice
            yield from ctx.wait(ctx.copy_in(scratch, mt, 0, 0, name="copy_mask_rows",
                                            strided=Strided(bs, K, dst_gap=align32(K) - K)))
            ctx.vector_seq("valid_bs", [("cast", bs * align32(K), np.float16),
                                        ("sum_k", bs * align32(K), np.float16),
                                        ("mins", bs, np.float16), ("compare", bs, np.float16),
                                        ("vec_index", bs, I32), ("gather_mask", bs, I32)],
                           reads=[scratch])
            yield from ctx.pipe_barrier("vector")
            yield from ctx.wait(ctx.copy_in(scratch, mt, 0, n, name="copy_mask"))
            ctx.vector_seq("valid_pairs", [("dup", n, np.float16), ("cast", n, np.float16),
                                           ("dup_mask", n // 8 + 1, np.uint8),
                                           ("compare", n, np.float16), ("vec_index", n, I32),
                                           ("gather_mask", n, I32)], reads=[scratch])
            yield from ctx.pipe_barrier("vector")
            m = raw.reshape(bs, K)
            pair &= m
            tokens = np.flatnonzero(m.any(axis=1))
    if t.shape.special_experts:  # MaskZeroComputeExpert: ids < E, And, GatherMask
        yield from ctx.wait(ctx.copy_in(scratch, ctx.tensor("expert_ids"), 0, 4 * n,
                                        name="copy_ids_special"))
        ctx.vector_seq("special_mask", [("cast", n, I32), ("dup", n // 8 + 1, np.uint8),
                                        ("compare", n, np.float16), ("and", n // 8 + 1, np.uint16),
                                        ("vec_index", n, I32), ("gather_mask", n, I32)],
                       reads=[scratch])
        yield from ctx.pipe_barrier("vector")
    pair &= ids < E
    return tokens, np.flatnonzero(pair.reshape(-1))


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
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * n_pairs,
                                    name="copy_ids"))
    ids_all = ctx.ub_read(ids_buf, I32, n_pairs, ops=0)
    if valid.size != n_pairs:  # GatherMask into the compact id list
        ctx.vector("gather_ids", n_pairs, I32, reads=[ids_buf], writes=[ids_buf])
        yield from ctx.pipe_barrier("vector")
    ids = ids_all[valid]
    es = None
    if t.expert_scales:
        es_buf = ctx.alloc("expert_scales", align32(4 * n_pairs))
        yield from ctx.wait(ctx.copy_in(es_buf, ctx.tensor("expert_scales"), 0, 4 * n_pairs,
                                        name="copy_expert_scales"))
        es = ctx.ub_read(es_buf, F32, n_pairs, ops=0)
    if shared_core:
        return ids_buf, ids, tokens.size
    p0, p1 = split_to_core(valid.size, t.moe_send_cores, ctx.core_id)
    win = t.window
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
        yield from process_token(ctx, t, q, memo, token, k, e + (t.S if t.shape.S_r else 0),
                                 t.expert_rank(e), off, None if es is None else float(es[flat]))
    yield from ctx.pipe_barrier("mte3")
    return ids_buf, ids, tokens.size


def send_to_shared(ctx: KernelContext, t: Mc2Tiling, state: int, q: SendQueues, memo: dict,
                   c: int, tokens: np.ndarray) -> Wait:
    """SendToSharedExpert: item v -> active token v % activeBS to shared expert v // activeBS,
    into slot v % activeBS of this rank's block."""
    for token, k, j, dst, off in shared_items(t, state, ctx.rank_id, tokens,
                                              t.shared_send_cores, c):
        ctx.scalar(4)
        yield from process_token(ctx, t, q, memo, token, k, j, dst, off, None)
    yield from ctx.pipe_barrier("mte3")


def shared_items(t: Mc2Tiling, state: int, rank: int, tokens: np.ndarray, cores: int,
                 c: int) -> list[tuple[int, int, int, int, int]]:
    """Shared-send core c's contiguous share of the activeBS * S items: (token, k = K + j,
    shared expert j, destination rank, window offset) of item v = j * activeBS + slot."""
    a = tokens.size
    v0, v1 = split_to_core(a * t.S, cores, c)
    out = []
    for v in range(v0, v1):
        slot, j = v % a, v // a
        out.append((int(tokens[slot]), t.K + j, j, t.shared_dst(rank, j),
                    t.window.dispatch_slot_offset(state, rank, slot)))
    return out


# --------------------------------------------------------------------------- status
def set_status(ctx: KernelContext, t: Mc2Tiling, state: int, id_info) -> Wait:
    """SetStatus: count per status expert of my share, SyncAll, one 32 B put each."""
    ids_buf, ids, active = id_info
    rank = ctx.rank_id
    S_r, E = t.shape.S_r, t.shape.E
    total = S_r + E
    e0, e1 = split_to_core(total, t.cores, ctx.core_id)
    n_pairs = ids.size
    nbuf = max(1, e1 - e0)
    status = ctx.alloc("status", align32(32 * nbuf))
    counts = []
    for i in range(e0, e1):
        if i < S_r:
            R = t.shape.R
            ctx.scalar(2)
            counts.append(active if i % R == rank % R else 0)
        else:
            yield from _cal_token_send_expert_cnt(ctx, ids_buf, n_pairs)
            counts.append(int(np.count_nonzero(ids == i - S_r)))

    def fill() -> None:
        v = status.view(I32).reshape(-1, 8)
        v[:] = 0
        v[:, 0] = ONE.view(I32)
        v[:len(counts), 1] = counts

    ctx.vector("dup_status", 8 * nbuf, I32, writes=[status], fn=fill)
    ctx.scalar(len(counts))
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    yield from ctx.sync_all()
    win = t.window
    for j, i in enumerate(range(e0, e1)):
        if i < S_r:
            dst, entry = i, rank
        else:
            e = i - S_r
            dst, entry = t.expert_rank(e), (e % t.L) * t.W + rank
        ctx.put(dst, win.dispatch_status(state, entry), status, 32, src_offset=32 * j,
                name="put_status")
    yield from ctx.pipe_barrier("mte3")


def wait_dispatch(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """WaitDispatch: poll my entries' flags, clear them, (A3) SyncCntOnCore, SyncAll.
    Returns the counts of my entries (None for a core without entries)."""
    rank = ctx.rank_id
    wl = t.status_count(rank)
    s0, s1 = split_to_core(wl, t.cores, ctx.core_id)
    n = s1 - s0
    C = t.cores
    if n <= 0:
        yield from ctx.sync_all()
        return None
    win = ctx.window()
    base = t.window.dispatch_status(state, s0)
    wait_buf = ctx.alloc("wait_status", max(32 * n, 256))
    compact = t.arch == "arch35"  # the 950 reads only the 4 B flags
    flags = ctx.alloc("flags", align32(4 * n)) if compact else wait_buf
    per_entry = 4 * ctx.issue_ns * n if t.performance_info else 0.0  # PerformanceInfoPerRank
    # the reduce, then the compare and PerformanceInfoPerRank's writes
    check = ctx.check_ns(ceil_div(n, 64) if compact else n, scalar=0) + (2 * ctx.issue_ns
                                                                         + per_entry)
    t_start = ctx.t
    perf = np.zeros(t.W, np.int64)
    seen = np.zeros(n, bool)
    # without performance_info one wait for all flags; with it, one per newly seen flag, so
    # each entry's first sighting is timed (the operator's loop reads them all each time)
    targets = range(1, n + 1) if t.performance_info else (n,)
    for target in targets:
        if target <= seen.sum():
            continue
        cond = SumAtLeast(F32, float(target), stride=0 if compact else 32)
        if compact:
            yield from ctx.wait_until(win, base, 0, cond, flags, strided=Strided(n, 4, src_gap=28),
                                      name="wait_status", check_ns=check)
        else:
            yield from ctx.wait_until(win, base, 32 * n, cond, wait_buf, name="wait_status",
                                      check_ns=check)
        if t.performance_info:
            f = flags.view(F32, n) if compact else wait_buf.view(F32, 8 * n)[::8]
            new = (f > 0.5) & ~seen
            us = int((ctx.t - t_start) // 1000)  # GetSystemCycle() / CYCLES_PER_US
            for i in np.flatnonzero(new):
                src = (s0 + int(i)) % t.W
                perf[src] = max(perf[src], us)
            seen |= new
    if compact:
        yield from ctx.wait(ctx.copy_in(wait_buf, win, base, 32 * n, name="reread_status"))
    if t.performance_info:  # AtomicMax into performance_info: per-core rows, core 0 reduces
        pbuf = ctx.alloc("perf", align32(8 * t.W))
        ctx.ub_write(pbuf, 0, perf, ops=1)
        yield from ctx.wait(ctx.copy_out(ctx.tensor("performance_info_cores"),
                                         8 * t.W * ctx.core_id, pbuf, 8 * t.W,
                                         name="write_performance_info"))
    counts = yield from wait_dispatch_clear_status(ctx, win, base, wait_buf, n)
    if t.arch == "arch22":  # SyncCntOnCore: my sum into every reader's workspace column
        ctx.vector("gather_counts", repeats=n, reads=[wait_buf])
        ctx.vector("sum_counts", n, F32)
        yield from ctx.pipe_barrier("vector")
        ctx.scalar(2)
        readers = min(t.W * t.L, C)
        sums = ctx.alloc("sum_core", 32 * C)
        total = int(counts.sum())

        def dup() -> None:
            sums.view(I32).reshape(C, 8)[:, 0] = total

        ctx.vector("dup_sum", 8 * readers, I32, writes=[sums], fn=dup)
        yield from ctx.pipe_barrier("vector")
        ctx.copy_out(ctx.tensor("workspace"), 512 * C * ctx.core_id, sums, 0,
                     strided=Strided(readers, 32, dst_gap=480), name="write_workspace")
        yield from ctx.drain()
    yield from ctx.sync_all()
    return counts


def wait_dispatch_clear_status(ctx: KernelContext, win, base: int, wait_buf, n: int) -> Wait:
    """WaitDispatchClearStatus: the n entries' counts, then their flags zeroed and written
    back (Duplicate, one copy)."""
    counts = wait_buf.view(I32, 8 * n).reshape(n, 8)[:, 1].astype(np.int64).copy()

    def clear() -> None:
        wait_buf.view(I32, 8 * n).reshape(n, 8)[:, 0] = 0

    ctx.vector("clear_flags", repeats=ceil_div(n, 8), writes=[wait_buf], fn=clear)
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(ctx.copy_out(win, base, wait_buf, 32 * n, name="clear_status"))
    return counts


# --------------------------------------------------------------------------- local copy
def local_window_copy(ctx: KernelContext, t: Mc2Tiling, state: int, counts) -> Wait:
    """LocalWindowCopy: my prefix, then the rows of my entries window -> UB -> outputs.
    Returns the prefix after my entries (totalCnt_), None for a core without entries."""
    rank, core, C = ctx.rank_id, ctx.core_id, t.cores
    dfx = ctx.alloc("run_pos", 32)
    ctx.ub_write(dfx, 0, np.array([2], np.uint32))
    ctx.copy_out(ctx.window(), t.window.dispatch_state_word(core) + 4, dfx, 4, name="run_pos")
    if counts is None:
        return
    wl = t.status_count(rank)
    s0, s1 = split_to_core(wl, C, core)
    win = ctx.window()
    prefix_buf = ctx.alloc("prefix", max(align32(4 * (s1 - s0)), align32(4 * t.W * t.L)))
    begin = 0
    if core:
        if t.arch == "arch22":  # GetCumSum: my column of the workspace
            col = ctx.alloc("sum_local", 32 * C)
            yield from ctx.wait(ctx.copy_in(col, ctx.tensor("workspace"), 512 * core, 0,
                                            strided=Strided(core, 32, src_gap=(16 * C - 1) * 32),
                                            name="read_workspace"))
            ctx.vector("gather_sums", repeats=core, reads=[col])
            ctx.vector("sum_sums", core, F32)
            yield from ctx.pipe_barrier("vector")
            begin = int(ctx.ub_read(col, I32, 8 * core).reshape(core, 8)[:, 0].sum())
        else:  # GetCumSumA5: the entries before mine, counts summed
            before = ctx.alloc("status_before", 32 * s0)
            yield from ctx.wait(ctx.copy_in(before, win, t.window.dispatch_status(state, 0),
                                            32 * s0, name="read_status_before"))
            ctx.vector("reduce_sum", 2 * s0, F32, reads=[before])
            yield from ctx.pipe_barrier("vector")
            begin = int(ctx.ub_read(before, I32, 8 * s0).reshape(s0, 8)[:, 1].sum())
    slot = t.window.dispatch
    size, per = t.local_copy_rows(rank)
    bufs = [ctx.alloc(f"triple{p}", size) for p in range(2)]
    busy: list[list[Any]] = [[], []]
    out_x, out_a = ctx.tensor("expand_x"), ctx.tensor("assist_info_for_combine")
    out_s = ctx.tensor("dynamic_scales") if slot.scale_offset is not None else None
    out_es = ctx.tensor("expand_scales") if slot.expert_scale_offset is not None else None
    ob = slot.out_bytes
    row = slot.ub_row
    prefix = []
    b = 0
    for i, index in enumerate(range(s0, s1)):
        cnt = int(counts[i])
        ctx.scalar(3)
        if t.is_shared_rank(rank) or t.L == 1:
            block = index
        else:
            block = (index % t.W) * t.L + index // t.W
        base = t.window.dispatch_block(state, block)
        done = 0
        while done < cnt:
            m = min(per, cnt - done)
            buf = bufs[b % 2]
            yield from ctx.wait(*busy[b % 2])  # AllocTensor: its copies out are done
            yield from ctx.wait(ctx.copy_in(buf, win, base + done * slot.slot, 0,
                                            strided=Strided(m, row, src_gap=slot.slot - row),
                                            name="copy_tokens"))
            r0 = begin + done
            ops = [ctx.copy_out(out_x, r0 * ob, buf, 0,
                                strided=Strided(m, ob, src_gap=row - ob), name="write_expand_x")]
            if out_s is not None:
                sb = slot.scale_bytes
                ops.append(ctx.copy_out(out_s, r0 * sb, buf, 0, src_offset=slot.scale_offset,
                                        strided=Strided(m, sb, src_gap=row - sb),
                                        name="write_scales"))
            ops.append(ctx.copy_out(out_a, r0 * 12, buf, 0, src_offset=slot.triplet_offset,
                                    strided=Strided(m, 12, src_gap=row - 12),
                                    name="write_assist_info"))
            if out_es is not None:
                yield from ctx.wait(*ops)  # SyncFunc<MTE3_MTE2>
                yield from ctx.wait(ctx.copy_in(
                    buf, win, base + done * slot.slot + slot.expert_scale_offset, 0,
                    strided=Strided(m, 4, src_gap=slot.slot - 4), name="copy_expert_scales"))
                ops.append(ctx.copy_out(out_es, r0 * 4, buf, 4 * m, name="write_expand_scales"))
            busy[b % 2] = ops
            b += 1
            done += m
        begin += cnt
        prefix.append(begin)
    ctx.ub_write(prefix_buf, 0, np.array(prefix, I32), ops=len(prefix))
    ctx.copy_out(ctx.tensor("ep_recv_count"), 4 * s0, prefix_buf, 4 * len(prefix),
                 name="write_ep_recv_count")
    yield from ctx.drain()
    return begin


def update_token_nums_out(ctx: KernelContext, t: Mc2Tiling, total: int | None) -> Wait:
    """UpdateTokenNumsOut (DeepEP's fork): with more than one local expert every core
    SyncAlls; the last core with entries writes its totalCnt_, then per local expert
    re-reads two ep_recv_count entries through the data cache (DataCacheCleanAndInvalid,
    GetValue) and writes their difference (type 1; type 0 accumulates) with SetValue."""
    rank = ctx.rank_id
    le, W = t.local_experts(rank), t.W
    if le > 1:
        yield from ctx.sync_all()
    if ctx.core_id != min(t.status_count(rank), t.cores) - 1 or total is None:
        return
    recv, out = ctx.tensor("ep_recv_count"), ctx.tensor("expert_token_nums")
    cache = ctx.dcache

    def put(i: int, value: int) -> None:
        ctx.gm_write_scalar(out, 8 * i, value, np.int64)
        cache.dcci_line(out, 8 * i)

    put(0, total)
    if le == 1:
        return
    cache.dcci_line(recv, 4 * (W - 1))
    acc = int(ctx.gm_read_scalar(recv, 4 * (W - 1), I32))
    put(0, acc)
    for i in range(1, le):
        pre, cur = 4 * (W * (i - 1) + W - 1), 4 * (W * i + W - 1)
        cache.dcci_line(recv, pre)
        cache.dcci_line(recv, cur)
        step = int(ctx.gm_read_scalar(recv, cur, I32)) - int(ctx.gm_read_scalar(recv, pre, I32))
        acc = (acc if t.expert_token_nums_type == 0 else 0) + step
        put(i, acc)


def set_expert_token_nums(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """SetExpertTokenNums (core 0): re-read the counts, reduce over sources, write int64."""
    rank = ctx.rank_id
    le, W = t.local_experts(rank), t.W
    win = ctx.window()
    base = t.window.dispatch_status(state, 0)
    nums_buf = ctx.alloc("token_nums", align32(8 * t.L))
    if t.arch == "arch35":  # compact count read, one [L, W] reduce, a cast
        cnt = ctx.alloc("counts", align32(4 * le * W))
        yield from ctx.wait(ctx.copy_in(cnt, win, base + 4, 0,
                                        strided=Strided(le * W, 4, src_gap=28),
                                        name="read_counts"))
        ctx.vector("reduce_sum_ar", le * W, F32, reads=[cnt])
        ctx.vector("cast_i64", le, np.int64)
        yield from ctx.pipe_barrier("vector")
        c = ctx.ub_read(cnt, I32, le * W).reshape(le, W).sum(axis=1)
    else:
        allst = ctx.alloc("all_status", 32 * le * W)
        yield from ctx.wait(ctx.copy_in(allst, win, base, 32 * le * W, name="read_status"))
        for _ in range(le):
            ctx.vector("reduce_sum", 2 * W, F32, reads=[allst])
            yield from ctx.pipe_barrier("vector")
            ctx.scalar(3)
        c = ctx.ub_read(allst, I32, 8 * le * W).reshape(le, W, 8)[:, :, 1].sum(axis=1)
    nums = np.cumsum(c) if t.expert_token_nums_type == 0 else c
    ctx.ub_write(nums_buf, 0, nums.astype(np.int64), ops=le)
    ctx.copy_out(ctx.tensor("expert_token_nums"), 0, nums_buf, 8 * le,
                 name="write_expert_token_nums")
    if t.performance_info:  # the max over the cores' rows (the kernel's AtomicMax)
        rows = ctx.alloc("perf_rows", align32(8 * t.W * t.cores))
        yield from ctx.wait(ctx.copy_in(rows, ctx.tensor("performance_info_cores"), 0,
                                        8 * t.W * t.cores, name="read_performance_info"))
        ctx.vector("max_rows", t.W * t.cores, np.int64, reads=[rows])
        yield from ctx.pipe_barrier("vector")
        best = ctx.ub_read(rows, np.int64, t.W * t.cores).reshape(t.cores, t.W).max(axis=0)
        out = ctx.alloc("perf_out", align32(8 * t.W))
        ctx.ub_write(out, 0, best, ops=1)
        ctx.copy_out(ctx.tensor("performance_info"), 0, out, 8 * t.W,
                     name="write_performance_info")
    yield from ctx.drain()
