"""The combine's send (ExpertAlltoAllDispatchCopyAdd): each core's share of the expert rows
back to the ranks that sent their tokens (docs/kernels/mc2.md).

A3: two rows per MTE3 barrier, then their two 32 B flags. 950: one row per step in a
permuted order, packed 480 B data + 32 B of 1.0 per 512 B block (the data is the flag).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.int8_quant import int8_quant_process
from npusim.kernels.common.split import split_to_core
from npusim.kernels.common.status import SPLIT_BLOCK_DATA_SIZE, WIN_ADDR_ALIGN
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.mc2.window import a5_int8_combine_bytes
from npusim.kernels.quant import int8_block_quantize, int8_block_scale_count, token_dtype
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import align32, ceil_div

F32 = np.float32


def int8_send_bytes(h: int) -> int:
    """tokenScaleCnt_ in bytes: Align32(H) int8 + Align16(H) / 8 scales in the token dtype."""
    return align32(h) + 2 * int8_block_scale_count(h)


def send(ctx: KernelContext, t: Mc2Tiling, state: int) -> Wait:
    """ExpertAlltoAllDispatchCopyAdd: SplitCoreCal over ep_recv_count's total, the core's
    assist_info triples, then every row to its (rank, token, k) slot."""
    counts = ctx.tensor("ep_recv_count")
    last = (t.W if t.is_shared_rank(ctx.rank_id) else t.W * t.L) - 1
    total = int(ctx.gm_read_scalar(counts, 4 * last, np.int32))  # DataCacheCleanAndInvalid
    r0, r1 = split_to_core(total, t.cores, ctx.core_id)
    n = r1 - r0
    if n == 0:
        return
    idx = ctx.alloc("expand_idx", align32(12 * n))
    yield from ctx.wait(
        ctx.copy_in(
            idx, ctx.tensor("assist_info_for_combine"), 12 * r0, 12 * n, name="copy_assist_info"
        )
    )
    trip = ctx.ub_read(idx, np.int32, 3 * n, ops=0).reshape(n, 3)
    rows = _SendRows(ctx, t, state, trip, r0)
    yield from ctx.pipe_barrier("vector")
    if t.arch == "arch35":
        yield from rows.copy_add_permuted()
    else:
        yield from rows.copy_add_in_pairs()
    yield from ctx.pipe_barrier("mte3")


class _SendRows:
    """The send's buffers (BuffInit: two row buffers, the 950's quantised and packed rows,
    the 32 B flag of 1.0) and the put still reading each row buffer."""

    def __init__(
        self, ctx: KernelContext, t: Mc2Tiling, state: int, trip: np.ndarray, r0: int
    ) -> None:
        self.ctx, self.t, self.state, self.trip, self.r0 = ctx, t, state, trip, r0
        h = t.H
        self.arch35 = arch35 = t.arch == "arch35"
        self.blocks = blocks = t.window.combine_step // WIN_ADDR_ALIGN
        self.int8 = int8 = t.combine_quant == "int8"
        self.mx = mx = qm.COMBINE_MX.get(t.combine_quant)  # the 950's MXFP8, else None
        row_in = blocks * SPLIT_BLOCK_DATA_SIZE if arch35 and not int8 else align32(2 * h)
        if mx:
            row_in = qm.input_bytes(h)  # hExpandXAlignSize_: Align128(H) elements
        self.ins = [ctx.alloc(f"row{p}", row_in) for p in range(2)]
        self.quants = self.ins  # what the 950 packs: the row, or its INT8 / MXFP8 bytes
        if arch35:
            if int8 or mx:
                self.quants = [
                    ctx.alloc(f"quant{p}", blocks * SPLIT_BLOCK_DATA_SIZE) for p in range(2)
                ]
            for b in self.quants:  # the packing Copy reads blocks * 480 B: keep the tail defined
                ctx.vector(
                    "dup_zero",
                    b.nbytes,
                    np.uint8,
                    writes=[b],
                    fn=lambda b=b: b.view(np.uint8).fill(0),
                )
            self.outs = [ctx.alloc(f"packed{p}", t.window.combine_step) for p in range(2)]
        elif int8:
            self.outs = [ctx.alloc(f"quant{p}", align32(int8_send_bytes(h))) for p in range(2)]
        else:
            self.outs = self.ins
        self.flag = flag = ctx.alloc("flag", 32)
        ctx.vector("dup_flag", 8, F32, writes=[flag], fn=lambda: flag.view(F32).fill(1.0))
        self.puts: list[Any] = [None, None]

    def copy_add_permuted(self) -> Wait:
        """The 950: one row per step, permuted order (stride n/2 + 1, coprime with n)."""
        ctx, n = self.ctx, len(self.trip)
        stride = 1 if n <= 2 else n // 2 + 1
        if n > 2 and n % 2 == 0 and stride % 2 == 0:
            stride += 1
        i = ctx.rank_id * n // self.t.W % n
        for step in range(n):
            ctx.scalar(6)
            yield from self.inner_copy_add(step % 2, i)
            i = (i + stride) % n

    def copy_add_in_pairs(self) -> Wait:
        """A3: two rows (DeepEP's fork: one), one MTE3 barrier, then their flags."""
        ctx, t, n = self.ctx, self.t, len(self.trip)
        loop = 0
        while loop < n:
            pair = [(loop + j + ctx.rank_id) % n for j in range(min(t.combine_send_rows, n - loop))]
            ctx.scalar(6 * len(pair))
            sent = []
            for p, i in enumerate(pair):
                sent.append((yield from self.inner_copy_add(p, i)))
            ctx.mte_fence("mte3")  # PipeBarrier<PIPE_MTE3>
            for dst, token, k in sent:
                t.window.put(ctx, dst, t.window.combine_flag(self.state, token, k), self.flag,
                             32, name="put_flag")
            loop += len(pair)

    def inner_copy_add(self, p: int, i: int) -> Wait:
        """ExpertAlltoAllDispatchInnerCopyAdd: row i into buffer p, quantised (and on the
        950 packed), put into its slot. Returns the row's (rank, token, k)."""
        ctx, t, h = self.ctx, self.t, self.t.H
        dst, token, k = (int(v) for v in self.trip[i])
        if self.puts[p] is not None:
            yield from ctx.wait(self.puts[p])
        buf, out = self.ins[p], self.outs[p]
        if self.mx:  # Duplicate(QUANT_PADDING_VALUE) over Align128(H) elements
            qm.zero_fill(ctx, buf, h, t.timing_only)
        if self.arch35:
            yield from ctx.pipe_barrier("vector")
        yield from ctx.wait(
            ctx.copy_in(buf, ctx.tensor("expand_x"), (self.r0 + i) * 2 * h, 2 * h, name="load_row")
        )
        nbytes = 2 * h
        if self.arch35:
            if self.int8:  # QuantProcess, PipeBarrier<PIPE_V>, then the packing
                _quant_int8(ctx, t, buf, self.quants[p], a5_int8_combine_bytes(h))
                yield from ctx.pipe_barrier("vector")
            elif self.mx:
                _quant_mx(ctx, t, buf, self.quants[p], self.mx)
                yield from ctx.pipe_barrier("vector")
            _pack(ctx, self.quants[p], out, self.blocks)
            yield from ctx.pipe_barrier("vector")
            nbytes = t.window.combine_step
        elif self.int8:
            _quant_int8(ctx, t, buf, out, int8_send_bytes(h))
            yield from ctx.pipe_barrier("vector")
            nbytes = int8_send_bytes(h)
        self.puts[p] = t.window.put(ctx, dst, t.window.combine_slot_offset(self.state, token, k),
                                    out, nbytes, name="put_row")
        return dst, token, k


def _pack(ctx: KernelContext, src, out, blocks: int) -> None:
    """Duplicate 1.0 over the slot, two strided Copy: 480 B of data into every 512 B block."""

    def dup() -> None:
        out.view(F32).fill(1.0)

    def copy() -> None:
        o = out.view(np.uint8).reshape(blocks, WIN_ADDR_ALIGN)
        o[:, :SPLIT_BLOCK_DATA_SIZE] = src.view(np.uint8).reshape(blocks, SPLIT_BLOCK_DATA_SIZE)

    ctx.vector("dup_flags", out.nbytes // 4, F32, writes=[out], fn=dup)
    ctx.vector_seq(
        "pack_copy",
        [("copy_a", 64 * blocks, F32), ("copy_b", 56 * blocks, F32)],
        reads=[src],
        writes=[out],
        fn=copy,
    )


def _quant_int8(ctx: KernelContext, t: Mc2Tiling, src, out, nbytes: int) -> None:
    """Int8QuantProcess: per 8 fp32 a max, scale = max / 127 in the token dtype, q = rint.
    `nbytes`: Align32(H) int8 and the scales (A3: Align16(H) / 8 of them; the 950:
    Align128(H) / 8, those past H of zero-padded blocks 0)."""
    h = t.H
    dt = token_dtype(t.shape.dtype)

    def effect() -> None:
        q, s = int8_block_quantize(
            src.bytes_at(0, 2 * h).view(dt)[None, :], recip=True, scale_dtype=dt
        )
        o = out.bytes_at(0, nbytes)
        o[: align32(h)] = q[0].view(np.uint8)
        sb = s[0].view(np.uint8)
        o[align32(h) : align32(h) + sb.size] = sb
        o[align32(h) + sb.size :] = 0

    int8_quant_process(ctx, src, out, h, ceil_div(h, 8), None if t.timing_only else effect)


def _quant_mx(ctx: KernelContext, t: Mc2Tiling, src, out, fp8: str) -> None:
    """QuantMxFp8 (the 950): ComputeMaxExp, ComputeScale, ComputeFp8Data into `out`."""
    h = t.H
    dt = token_dtype(t.shape.dtype)

    def effect() -> None:
        qm.combine_quantise(src.bytes_at(0, 2 * h).view(dt), fp8, out.bytes_at(0, out.nbytes))

    ctx.vf(
        "mxfp8_quant",
        qm.combine_quant_vfs(h, dt == np.float16),
        reads=[src],
        writes=[out],
        fn=None if t.timing_only else effect,
    )
