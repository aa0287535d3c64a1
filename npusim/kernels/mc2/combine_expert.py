"""ProcessExpert of the combine's receive: the fp32 sum of one token's weighted expert rows
(MoE experts from the window, special experts from GM, shared_expert_x)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.common.status import SPLIT_BLOCK_DATA_SIZE
from npusim.kernels.mc2 import quant_modes as qm
from npusim.kernels.mc2.combine_send import int8_send_bytes
from npusim.kernels.mc2.reference import const_expert_row
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.quant import int8_block_dequantize, token_dtype
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import align32, ceil_div

F32 = np.float32


def process_expert(
    ctx: KernelContext,
    t: Mc2Tiling,
    state: int,
    tok: int,
    ids: np.ndarray,
    es: np.ndarray | None,
    rows: list,
    acc,
    blocks: int,
    dt: np.dtype,
    scratch=None,
) -> Wait:
    """ProcessExpert: fp32 sum of the token's K weighted rows, special experts, S shared."""
    h, K, S, E = t.H, t.K, t.S, t.shape.E
    Z, C = t.shape.zero_experts, t.shape.copy_experts
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
        yield from process_moe_expert(ctx, t, state, tok, k, rows[p], loads, p, w, acc, blocks, dt)
        p ^= 1
    if t.shared_expert_x:
        yield from add_shared_expert_x(ctx, t, tok, rows[p], acc, dt)


def process_moe_expert(
    ctx: KernelContext,
    t: Mc2Tiling,
    state: int,
    tok: int,
    k: int,
    buf,
    loads: list[Any],
    p: int,
    w,
    acc,
    blocks: int,
    dt: np.dtype,
) -> Wait:
    """ProcessMoeExpert: slot k of the token from the window into row buffer p (its
    previous sum done first), dequantised, weighted and added to the fp32 sum."""
    h = t.H
    arch35 = t.arch == "arch35"
    win_r = ctx.window()
    if loads[p] is not None:
        yield from ctx.pipe_barrier("vector")  # the buffer's previous sum has read it
    off = t.window.combine_slot_offset(state, tok, k)
    if arch35:
        ld = ctx.copy_in(
            buf,
            win_r,
            off,
            0,
            name="copy_slot",
            strided=Strided(blocks, SPLIT_BLOCK_DATA_SIZE, src_gap=32),
        )
    else:
        nb = int8_send_bytes(h) if t.combine_quant == "int8" else 2 * h
        ld = ctx.copy_in(buf, win_r, off, nb, name="copy_slot")
    loads[p] = ld
    yield from ctx.wait(ld)
    mx = qm.COMBINE_MX.get(t.combine_quant)
    add = _add_row(t, buf, acc, w, mx, dt)
    if mx:  # DeQuantMxFp8: dequantisation, weight and sum in one VF
        ctx.vf(
            "sum_row",
            qm.combine_dequant_vf(h, w is not None),
            reads=[buf],
            writes=[acc],
            fn=None if t.timing_only else add,
        )
        return
    ctx.vector_seq(
        "sum_row",
        _sum_row_instrs(t, w is not None),
        reads=[buf],
        writes=[acc],
        fn=None if t.timing_only else add,
    )


def _add_row(t: Mc2Tiling, buf, acc, w, mx: str | None, dt: np.dtype) -> Callable[[], None]:
    """The numbers of the sum: the row dequantised (MXFP8, INT8 or none), times its weight,
    added to the fp32 sum."""
    h = t.H

    def add() -> None:
        if mx:
            r = qm.combine_dequantise(buf.bytes_at(0, buf.nbytes), h, mx)
            a = acc.view(F32, h)
            a[:] = a + (r if w is None else r * w)
            return
        if t.combine_quant == "int8":  # the 950's bytes start as A3's (more scales)
            raw = buf.bytes_at(0, int8_send_bytes(h))
            q = raw[: align32(h)].view(np.int8)
            s = raw[align32(h) :].view(dt)
            row = int8_block_dequantize(q[None, :], s[None, :], h, out_dtype=dt)[0]
        else:
            row = buf.bytes_at(0, 2 * h).view(dt)
        r = row.astype(F32)
        a = acc.view(F32, h)
        a[:] = a + (r if w is None else r * w)

    return add


def _sum_row_instrs(t: Mc2Tiling, weighted: bool) -> list[tuple[str, int, Any]]:
    """The vector instructions of one row's sum (INT8: its dequantisation first)."""
    h = t.H
    int8, arch35 = t.combine_quant == "int8", t.arch == "arch35"
    seq: list[tuple[str, int, Any]] = []
    if int8 and arch35:
        # Int8DequantProcessA5: Cast + Brcb of the scales, then one fused loop per
        # element: int8 -> half -> fp32, Mul, Cast RINT to the dtype and back, Muls, Add
        nb8 = ceil_div(h, 128) * 16
        seq += [
            ("cast_scale", nb8, np.float16),
            ("brcb", 8 * nb8, F32),
            ("cast_i8_f16", h, np.int8),
            ("cast_f16_f32", h, np.float16),
            ("mul", h, F32),
            ("cast_x", h, F32),
            ("cast_back", h, np.float16),
        ]
    elif int8:
        nb8 = ceil_div(h, 8)
        seq += [
            ("cast_scale", nb8, np.float16),
            ("cast_i8_f16", h, np.int8),
            ("cast_f16_f32", h, np.float16),
            ("brcb", h, F32),
            ("mul", h, F32),
            ("cast_x", h, F32),
        ]
    if not (int8 and arch35):
        seq.append(("cast_f32", h, np.float16))
    if weighted:
        seq.append(("muls", h, F32))
    seq.append(("add", h, F32))
    return seq


def add_shared_expert_x(ctx: KernelContext, t: Mc2Tiling, tok: int, buf, acc, dt: np.dtype) -> Wait:
    """AddSharedExpertX: the token's shared_expert_x row added to the fp32 sum."""
    h = t.H
    yield from ctx.pipe_barrier("vector")
    yield from ctx.wait(
        ctx.copy_in(buf, ctx.tensor("shared_expert_x"), tok * 2 * h, 2 * h, name="copy_shared_x")
    )

    def add_x() -> None:
        a = acc.view(F32, h)
        a[:] = a + buf.bytes_at(0, 2 * h).view(dt).astype(F32)

    ctx.vector_seq(
        "sum_shared_x",
        [("cast_f32", h, np.float16), ("add", h, F32)],
        reads=[buf],
        writes=[acc],
        fn=None if t.timing_only else add_x,
    )


def _special(
    ctx: KernelContext, t: Mc2Tiling, tok: int, c: int, copy: bool, w, acc, scratch
) -> Wait:
    """ProcessCopyExpert (scale * ori_x) or ProcessConstantExpert (a1' x + a2' v): the rows
    are copied in (timed); the numbers come from the same GM bytes."""
    h = t.H
    dt = token_dtype(t.shape.dtype)
    yield from ctx.pipe_barrier("vector")
    names = (
        ["ori_x"]
        if copy
        else ["ori_x", "const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v"]
    )
    rows = []
    for name in names:
        row = tok if name == "ori_x" else c
        yield from ctx.wait(
            ctx.copy_in(scratch, ctx.tensor(name), row * 2 * h, 2 * h, name=f"copy_{name}")
        )
        rows.append(scratch.bytes_at(0, 2 * h).view(dt).copy())
        yield from ctx.pipe_barrier("vector")
    if copy:
        val = rows[0].astype(F32)
        seq = [("cast_f32", h, np.float16)]
    else:
        val = const_expert_row(*rows)
        seq = [("cast_f32", h, np.float16)] + [
            ("cast_a", h, np.float16),
            ("mul", h, F32),
            ("sum", h, F32),
        ] * 2
        seq += [
            ("exp", 64, F32),
            ("cast_v", h, np.float16),
            ("muls_x", h, F32),
            ("muls_v", h, F32),
            ("add_xv", h, F32),
        ]
    if w is not None:
        seq.append(("muls", h, F32))
    seq.append(("add", h, F32))

    def add() -> None:
        a = acc.view(F32, h)
        a[:] = a + (val if w is None else val * w)

    ctx.vector_seq("special_expert", seq, writes=[acc], fn=None if t.timing_only else add)
    yield from ctx.pipe_barrier("vector")
