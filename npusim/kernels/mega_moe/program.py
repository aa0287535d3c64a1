"""The MegaMoE kernel (shmem_mega_moe_kernel.h, Process()), one generator per core of the
MIX launch: block b is AIC b with AIV 2b (sub-block 0) and 2b + 1 (sub-block 1).

AIV, every core: BuildSendMasks, QuantizeLocalTokens, SyncAll + SynchronizeRanks.
Per local expert e: AIV1 CountReceivedTokens (CrossCoreSetFlag 2 to the AIC, which
reads m and raises 3 for AIV0), AIV1 BuildRoutingMetadataAndDispatch (remote MTE2 pulls
into a 6-deep ring, AtomicAdd per 256-row wave), then RunFirstProjection: the AIC's
gate/up tiles FixPiped into AIV0's UB, AIV0's SwiGLU + requant epilogue. Then per expert
RunSecondProjection (ping-pong UB outputs, CombineTokens' 512 B stores to the source
rank), SyncAll, SynchronizeRanks and CombineRoutedTokens on every AIV.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.kernels.common.split import split_share
from npusim.kernels.mega_moe import mx
from npusim.kernels.mega_moe import sync as hw
from npusim.kernels.mega_moe.cube import (
    first_projection_aic,
    first_projection_aiv,
    second_projection_aic,
    second_projection_aiv,
)
from npusim.kernels.mega_moe.tiling import (
    GENERATION_BASE,
    META,
    RING,
    RING_BYTES,
    SLOT,
    TILE_M1,
    TILE_M2,
    TILE_N,
    WAVE,
    MegaTiling,
)
from npusim.kernels.quant import mx_quantize_bf16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div


class ExpertState:
    """What a core carries across experts (the source's members): the rotated scheduler
    start, the vector-sync state and, on AIV1, the cumulative receive prefix."""

    def __init__(self, t: MegaTiling) -> None:
        self.t = t
        self.start_block = 0
        self.vsync = 0
        self.prefix: list[int] = []  # AIV1: receivedTokenPrefix per (expert, source)
        self.routes: dict[int, np.ndarray] = {}  # AIV1: selected routes per source
        self.buffer = 0  # GEMM2 ping-pong index
        self.done_tiles = 0  # GEMM2 outputs completed
        self.mmad: Any = None  # AIC: its L1/L0 buffers (cube.BlockMmad)
        self._gemm1: tuple[Any, Any] | None = None
        self._gemm2: tuple[list[Any], Any] | None = None
        self._aiv1: dict[str, Any] = {}

    def _aiv1_buffer(self, ctx: KernelContext, name: str, nbytes: int) -> Any:
        buf = self._aiv1.get(name)
        if buf is None:
            buf = self._aiv1[name] = ctx.alloc(name, nbytes)
        return buf

    def masks(self, ctx: KernelContext) -> Any:
        """AIV1: the W inbound mask slots of one expert."""
        return self._aiv1_buffer(ctx, "received_masks", self.t.W * self.t.mask_slot)

    def scratch(self, ctx: KernelContext) -> Any:
        """AIV1: 32 B for a count store or an AtomicAdd's value."""
        return self._aiv1_buffer(ctx, "scalar_scratch", 32)

    def ring(self, ctx: KernelContext) -> list[Any]:
        return [self._aiv1_buffer(ctx, f"dispatch_copy{i}", RING_BYTES) for i in range(RING)]

    def meta(self, ctx: KernelContext) -> Any:
        """AIV1: the routing metadata of a work item (at most one source's BS * K routes)."""
        return self._aiv1_buffer(ctx, "routing_metadata", self.t.routes * META)

    def gemm1_buffers(self, ctx: KernelContext) -> tuple[Any, Any]:
        """AIV0: GEMM1's gate and up tiles, 256 x 256 bf16 at UB 0 and 128 KiB."""
        if self._gemm1 is None:
            self._gemm1 = (ctx.alloc("gemm1_gate", TILE_M1 * TILE_N * 2),
                           ctx.alloc("gemm1_up", TILE_M1 * TILE_N * 2))
        return self._gemm1

    def gemm2_buffers(self, ctx: KernelContext) -> tuple[list[Any], Any]:
        """AIV0: GEMM2's ping-pong outputs (128 x 256 bf16 at 0 and 64 KiB) and the routing
        metadata of a tile's rows."""
        if self._gemm2 is None:
            ctx.ub.reset()
            self._gemm2 = ([ctx.alloc(f"gemm2_out{i}", TILE_M2 * TILE_N * 2) for i in range(2)],
                           ctx.alloc("tile_routing_metadata", TILE_M2 * META))
        return self._gemm2


def mega_moe_program(t: MegaTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        kind, block, sub = hw.role(ctx)
        if kind == "aic":
            yield from _aic(ctx, t, block)
        else:
            yield from _aiv(ctx, t, block, sub)
    return program


# ------------------------------------------------------------------------------ AIC
def _aic(ctx: KernelContext, t: MegaTiling, b: int) -> Wait:
    st = ExpertState(t)
    counts = ctx.tensor("received_token_counts")
    ms = []
    for e in range(t.L):
        with ctx.phase("count_received_tokens"):
            yield from hw.wait_flag(ctx, 2 + 16)
            m = yield from hw.read_bypass(ctx, counts, (e * t.block_dim + b) * 32)
            hw.set_flag(ctx, 3)
        ms.append(m)
        if m:
            with ctx.phase("first_projection"):
                yield from first_projection_aic(ctx, t, b, e, m, sum(ms[:-1]), st)
    if st.vsync:
        yield from hw.wait_flag(ctx, 6)  # FinishFirstProjectionSync
    st.vsync = 0
    for e in range(t.L):
        if ms[e]:
            with ctx.phase("second_projection"):
                yield from second_projection_aic(ctx, t, b, e, ms[e], sum(ms[:e]), st)
    n = st.done_tiles
    for i in range(n - min(2, n), n):  # FinishSecondProjectionSync: the last two tiles
        yield from hw.wait_flag(ctx, 6 + i % 2)
    yield from ctx.drain()
    yield from ctx.sync_all()


# ------------------------------------------------------------------------------ AIV
def _aiv(ctx: KernelContext, t: MegaTiling, b: int, sub: int) -> Wait:
    vid = 2 * b + sub
    with ctx.phase("build_send_masks"):
        yield from _build_send_masks(ctx, t, vid)
    with ctx.phase("quantize_local_tokens"):
        yield from _quantize_local_tokens(ctx, t, vid)
    with ctx.phase("synchronize_ranks"):
        yield from ctx.sync_all()
        yield from _synchronize_ranks(ctx, t, vid)
    ctx.ub.reset()
    st = ExpertState(t)
    counts = ctx.tensor("received_token_counts")
    ms = []
    for e in range(t.L):
        if sub == 1:
            with ctx.phase("count_received_tokens"):
                m = yield from _count_received_tokens(ctx, t, b, e, st)
        else:
            with ctx.phase("count_received_tokens"):
                yield from hw.wait_flag(ctx, 3)
                m = yield from hw.read_bypass(ctx, counts, (e * t.block_dim + b) * 32)
        ms.append(m)
        if not m:
            continue
        if sub == 1:
            with ctx.phase("dispatch"):
                yield from _dispatch(ctx, t, b, e, st)
        else:
            with ctx.phase("first_projection"):
                yield from first_projection_aiv(ctx, t, b, e, m, sum(ms[:-1]), st)
    if sub == 1:
        yield from _copy_expert_token_counts(ctx, t, ms)
    else:
        st.vsync = 0
        for e in range(t.L):
            if ms[e]:
                with ctx.phase("second_projection"):
                    yield from second_projection_aiv(ctx, t, b, e, ms[e], sum(ms[:e]), st)
    yield from ctx.drain()
    ctx.ub.reset()
    with ctx.phase("synchronize_ranks"):
        yield from ctx.sync_all()
        yield from _synchronize_ranks(ctx, t, vid)
    with ctx.phase("combine"):
        yield from _combine_routed_tokens(ctx, t, vid)


def _build_send_masks(ctx: KernelContext, t: MegaTiling, vid: int) -> Wait:
    """Expert e = vid, vid + 2*AIC, ...: CompareScalar(ids == e) as a bitmask over the
    padded routes, GatherMask's count after it, one MTE3 store of mask + count straight
    into inboundMask[le * W + me] of the expert's rank (double-buffered)."""
    experts = range(vid, t.W * t.L, t.aiv_num)
    if not experts:
        return
    ids_buf = ctx.alloc("expert_ids", t.pad_routes * 4)
    ctx.vector("duplicate", t.pad_routes, np.int32, writes=[ids_buf],
               fn=lambda: ids_buf.view(np.int32, t.pad_routes).fill(-1))
    yield from ctx.pipe_barrier("vector")
    load = ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, t.routes * 4)
    yield from ctx.wait(load)
    masks = [ctx.alloc(f"mask{i}", t.mask_slot) for i in range(2)]
    last: list[Any] = [None, None]
    for it, e in enumerate(experts):
        dst, le = divmod(e, t.L)
        buf = masks[it % 2]
        if last[it % 2] is not None:
            yield from ctx.wait(last[it % 2])

        def compare(buf: Any = buf, e: int = e) -> None:
            hit = ids_buf.view(np.int32, t.pad_routes) == e
            buf.view(np.uint8, t.mask_bytes)[:] = 0
            buf.view(np.uint8, t.mask_slot)[:t.pad_routes // 8] = np.packbits(
                hit, bitorder="little")
        ctx.vector("compare_scalar", t.pad_routes, np.int32, reads=[ids_buf], writes=[buf],
                   fn=compare)
        ctx.vector("gather_mask", t.routes, np.int32, reads=[ids_buf, buf])
        yield from ctx.pipe_barrier("vector")
        n = int(np.unpackbits(buf.view(np.uint8, t.mask_bytes), bitorder="little").sum())
        ctx.ub_write(buf, t.mask_bytes, np.array([n] + [0] * 7, np.int32))
        last[it % 2] = hw.remote_store(ctx, dst, t.mask_at(le, ctx.rank_id), buf, t.mask_slot,
                                       "inbound_mask")
    yield from ctx.pipe_barrier("mte3")


def _quantize_local_tokens(ctx: KernelContext, t: MegaTiling, vid: int) -> Wait:
    """Tokens split over the AIV cores; per token MTE2 loads the bf16 row, ComputeMaxExp,
    ComputeScale and ComputeFp8Data make the FP8 row and its E8M0 scales, MTE3 stores
    them to the local quantizedTokens (double-buffered)."""
    first, count = split_share(t.BS, t.aiv_num, vid)
    if not count:
        return
    x = ctx.tensor("x")
    win = ctx.window()
    row_in = t.H * 2
    out_bytes = t.data_bytes + t.scale_count
    ins = [ctx.alloc(f"quant_in{i}", row_in) for i in range(2)]
    outs = [ctx.alloc(f"quant_out{i}", t.row_bytes) for i in range(2)]
    stores: list[Any] = [None, None]
    for i in range(count):
        tok = first + i
        p = i % 2
        if stores[p] is not None:
            yield from ctx.wait(stores[p])
        yield from ctx.wait(ctx.copy_in(ins[p], x, tok * row_in, row_in))

        def quantize(src: Any = ins[p], dst: Any = outs[p]) -> None:
            codes, scales = mx_quantize_bf16(src.view(mx.BF16, t.H).reshape(1, t.H), t.mode)
            raw = dst.view(np.uint8, t.row_bytes)
            raw[:] = 0
            raw[:t.H] = codes[0]
            raw[t.data_bytes:t.data_bytes + t.scale_count] = scales[0]
        hw.compute(ctx, ctx.vector("compute_max_exp", t.H, mx.BF16, reads=[ins[p]], passes=2))
        hw.compute(ctx, ctx.vector("compute_scale", t.scale_count, np.uint16, passes=4))
        hw.compute(ctx, ctx.vector("compute_fp8_data", t.H, np.float32, reads=[ins[p]],
                                   writes=[outs[p]], passes=3, fn=quantize))
        yield from ctx.pipe_barrier("vector")
        stores[p] = ctx.copy_out(win, t.quantized_tokens + tok * t.row_bytes, outs[p],
                                 out_bytes)
    yield from ctx.pipe_barrier("mte3")


def _synchronize_ranks(ctx: KernelContext, t: MegaTiling, vid: int) -> Wait:
    """AIV i < W: read the own generation counter, write gen + 1 into rank i's slot for
    this rank, spin until rank i's slot here reaches it; store the counter; SyncAll."""
    gen_at = GENERATION_BASE + vid * SLOT
    gen = (yield from hw.read_bypass(ctx, ctx.window(), gen_at)) + 1
    yield from hw.rank_barrier(ctx, 0, gen)
    hw.store_bypass(ctx, ctx.rank_id, gen_at, gen)
    yield from ctx.sync_all()


def _count_received_tokens(ctx: KernelContext, t: MegaTiling, b: int, e: int,
                           st: ExpertState) -> Generator[Any, Any, int]:
    """AIV1: the W masks of expert e, each source's count capped cumulatively at
    max_received_tokens; m to receivedTokenCounts[e][b]; CrossCoreSetFlag(2)."""
    buf = st.masks(ctx)
    yield from ctx.wait(ctx.copy_in(buf, ctx.window(), t.mask_at(e, 0), t.W * t.mask_slot))
    done = st.prefix[-1] if st.prefix else 0
    m = 0
    for src in range(t.W):
        n = int(ctx.ub_read(buf, np.int32, 1, src * t.mask_slot + t.mask_bytes)[0])
        take = min(n, max(t.max_recv - done, 0))
        m += take
        done += take
        st.prefix.append(done)
        bits = np.unpackbits(buf.view(np.uint8, t.mask_bytes, src * t.mask_slot),
                             bitorder="little")
        st.routes[src] = np.flatnonzero(bits[:t.routes])
    cnt = st.scratch(ctx)
    ctx.ub_write(cnt, 0, np.array([m] + [0] * 7, np.int32))
    store = ctx.copy_out(ctx.tensor("received_token_counts"), (e * t.block_dim + b) * 32, cnt, 32)
    yield from ctx.wait(store)
    hw.set_flag(ctx, 2)
    return m


def _dispatch(ctx: KernelContext, t: MegaTiling, b: int, e: int, st: ExpertState) -> Wait:
    """BuildRoutingMetadataAndDispatch: work items (source rank, part) round robin over
    the blocks; each pulls its rows' quantised tokens from the source's window (remote
    MTE2, a 6-deep ring of 8 KiB), stores data and scales to the received rows, writes
    the routing metadata, then AtomicAdds the rows to each 256-row wave's counter."""
    cbpr = t.cube_blocks_per_rank
    prior = st.prefix[e * t.W - 1] if e else 0
    data, scales = ctx.tensor("received_token_data"), ctx.tensor("received_token_scales")
    meta_t, ready = ctx.tensor("routing_metadata"), ctx.tensor("input_ready")
    ring = st.ring(ctx)
    for idx in range(b, t.W * cbpr, t.block_dim):
        src, part = divmod(idx, cbpr)
        ctx.vector("gather_mask", t.routes, np.int32)
        start = st.prefix[e * t.W + src - 1] if (src or e) else 0
        end = st.prefix[e * t.W + src]
        bounded = min(end - start, max(t.max_recv - start, 0))
        per = ceil_div(bounded, cbpr)
        lo = start + part * per
        rows = max(0, min(per, start + bounded - lo))
        if rows <= 0:
            continue
        first_route = lo - start
        routes = st.routes[src][first_route:first_route + rows]
        meta = st.meta(ctx)
        records = np.zeros((rows, 8), np.int32)
        records[:, 0] = src
        records[:, 1] = routes // t.K
        records[:, 2] = routes % t.K
        ctx.ub_write(meta, 0, records, ops=3 * rows)
        stores: list[Any] = [None] * RING
        pulls: list[Any] = [None] * RING
        for i in range(min(rows, RING)):
            pulls[i] = hw.pull(ctx, ring[i], src, t.quantized_tokens
                               + int(records[i, 1]) * t.row_bytes, t.row_bytes)
        for i in range(rows):
            j = i % RING
            yield from ctx.wait(pulls[j])
            row = lo + i
            ctx.copy_out(data, row * t.H, ring[j], t.H)
            stores[j] = ctx.copy_out(scales, row * t.scale_count, ring[j], t.scale_count,
                                     src_offset=t.data_bytes)
            nxt = i + RING
            if nxt < rows:
                yield from ctx.wait(stores[j])
                pulls[j] = hw.pull(ctx, ring[j], src, t.quantized_tokens
                                   + int(records[nxt, 1]) * t.row_bytes, t.row_bytes)
        yield from ctx.pipe_barrier("mte3")
        yield from ctx.wait(ctx.copy_out(meta_t, lo * META, meta, rows * META))
        local_lo, local_hi = lo - prior, lo - prior + rows
        for w in range(local_lo // WAVE, (local_hi - 1) // WAVE + 1):
            n = min(local_hi, (w + 1) * WAVE) - max(local_lo, w * WAVE)
            yield from hw.atomic_add(ctx, ready, (e * t.wave_slots + w) * 4, n, st.scratch(ctx))


def _copy_expert_token_counts(ctx: KernelContext, t: MegaTiling, ms: list[int]) -> Wait:
    buf = ctx.alloc("expert_token_counts", 32 * ceil_div(t.L, 8))
    ctx.ub_write(buf, 0, np.array(ms, np.int32), ops=t.L)
    yield from ctx.wait(ctx.copy_out(ctx.tensor("expert_token_counts"), 0, buf, 4 * t.L))


def _combine_routed_tokens(ctx: KernelContext, t: MegaTiling, vid: int) -> Wait:
    """Tokens split over the AIV cores; per token and k, MTE2 loads the returned bf16 row,
    Cast to fp32, Muls by the routing weight and Add; Cast (RINT) to bf16, MTE3 to y."""
    first, count = split_share(t.BS, t.aiv_num, vid)
    if not count:
        return
    row = t.H * 2
    w_buf = ctx.alloc("routing_weights", ceil_div(t.routes * 4, 32) * 32)
    yield from ctx.wait(ctx.copy_in(w_buf, ctx.tensor("routing_weights"), 0, t.routes * 4))
    weights = w_buf.view(np.float32, t.routes)
    ins = [ctx.alloc(f"row{i}", row) for i in range(2)]
    acc = ctx.alloc("acc", t.H * 4)
    out = ctx.alloc("out", row)
    win, y = ctx.window(), ctx.tensor("y")
    loads: list[Any] = [None, None]
    used: list[Any] = [None, None]
    store = None
    for tok in range(first, first + count):
        for k in range(t.K):
            p = k % 2
            ctx.scalar(1)  # GetValue of the routing weight
            if used[p] is not None:  # WaitFlag<V_MTE2>: the vector op on this buffer is done
                yield from ctx.wait(used[p])
            loads[p] = ctx.copy_in(ins[p], win, t.combined_tokens + (tok * t.K + k) * row, row)
            yield from ctx.wait(loads[p])

            def mac(src: Any = ins[p], wk: np.float32 = weights[tok * t.K + k],
                    first_k: bool = k == 0) -> None:
                v = src.view(mx.BF16, t.H).astype(np.float32) * wk
                a = acc.view(np.float32, t.H)
                if first_k:
                    a[:] = v
                else:
                    a += v
            steps = [("cast_f32", t.H, np.float32), ("muls", t.H, np.float32)]
            if k:
                steps.append(("add", t.H, np.float32))
            used[p] = hw.compute(ctx, ctx.vector_seq("weighted_sum", steps, reads=[ins[p]],
                                                     writes=[acc], fn=mac))
        if store is not None:
            yield from ctx.wait(store)

        def cast(_a: Any = acc, _o: Any = out) -> None:
            _o.view(mx.BF16, t.H)[:] = _a.view(np.float32, t.H).astype(mx.BF16)
        hw.compute(ctx, ctx.vector("cast_bf16", t.H, np.float32, reads=[acc], writes=[out],
                                   fn=cast))
        yield from ctx.pipe_barrier("vector")
        store = ctx.copy_out(y, tok * row, out, row)
    yield from ctx.pipe_barrier("mte3")

