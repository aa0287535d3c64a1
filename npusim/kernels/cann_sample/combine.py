"""The MoE combine kernel of the CANN sample (MoeDistributeCombineShmem), per core.

Send: the rows this rank received in dispatch are split evenly over all cores; each
row (optionally INT8 block-quantised) is copied straight into its source rank's
receive slot (token*K + k), then, after the MTE3 pipe has drained, a 32 B flag of
8 x 1.0 is put beside it. Receive: this rank's tokens are split over the cores; for
each token the core polls its K flags, resets them, and accumulates the K rows
(dequantised) times their routing weights in fp32, then writes x[token].

Shared experts (ops-transformer CombineV2; the sample has none): a token has K + S slots
and flags, shared expert j's result in slot K + j (the third triplet field). A shared
rank sends its rows back with the same code as a MoE rank; the receiver waits for K + S
flags and, after the K weighted rows, adds the S shared rows with weight 1 (no Muls).

GM tensors on every rank: expand_x [A,H], assist_info_for_combine [A,3] int32,
ep_recv_count [W*L] int32 ([W] on a shared rank), expert_ids [BS,K] int32,
expert_scales [BS,K] fp32 (inputs); x [BS,H] (output). Combine never flips the window
state: slots from offset 0, flags at 1022 MiB + 64 KiB.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels import quant as q
from npusim.kernels.cann_sample.tiling import MoeTiling
from npusim.kernels.common.int8_quant import int8_quant_process
from npusim.kernels.common.split import split_to_core
from npusim.runtime.conditions import SumEquals, Wait
from npusim.runtime.context import KernelContext
from npusim.units import align32, align256, ceil_div


def combine_program(tiling: MoeTiling):
    # INT8 quantised / dequantised rows by their input bytes: pure functions, so a row
    # seen again (a token's K expert rows are often equal, e.g. identity experts) is
    # computed once. Bit-identical to recomputing; the vector unit is charged every time.
    quant_memo: dict[bytes, np.ndarray] = {}
    dequant_memo: dict[bytes, np.ndarray] = {}

    def program(ctx: KernelContext) -> Wait:
        with ctx.phase("send_data"):
            yield from send_rows(ctx, tiling, quant_memo)
        ctx.ub.reset()
        yield from receive_and_combine(ctx, tiling, dequant_memo)

    return program


# --------------------------------------------------------------------------- send
def _init_send(ctx: KernelContext, t: MoeTiling) -> tuple[int, int, Any, list, list]:
    """Init: one scalar GM read of the received row count ep_recv_count[W*L - 1]
    (ep_recv_count[W - 1] on a shared rank), this core's rows of it, and the UB buffers
    (the flag, two row slots, with INT8 two send slots and the quantisation's scratch)."""
    h = t.H
    wl = t.status_count(ctx.rank_id)
    n = int(ctx.gm_read_scalar(ctx.tensor("ep_recv_count"), 4 * (wl - 1), np.int32))
    r0, r1 = split_to_core(n, ctx.num_cores, ctx.core_id)
    flag = ctx.alloc("flag", 32)
    in_slots = [ctx.alloc(f"in{p}", align32(2 * h)) for p in range(2)]
    out_slots = []
    if t.combine_quant == "int8":
        out_slots = [ctx.alloc(f"xout{p}", align32(t.combine_record.send_bytes))
                     for p in range(2)]
        ctx.alloc("x_abs", align256(4 * h))
        ctx.alloc("x_max", align32(4 * h) // 8)
        ctx.alloc("x_scale_mul", align32(4 * h))
        ctx.alloc("x_float", align32(4 * h))
    return r0, r1 - r0, flag, in_slots, out_slots


def send_rows(ctx: KernelContext, t: MoeTiling, memo: dict[bytes, np.ndarray]) -> Wait:
    """Every received row back to its source's combine slot, then its flag (the rows of
    this core, from a rank-staggered start, double-buffered)."""
    h = t.H
    lay = t.window
    crec = t.combine_record
    dt = q.token_dtype(t.dtype)
    r0, rows, flag, in_slots, out_slots = _init_send(ctx, t)
    int8 = t.combine_quant == "int8"
    if rows == 0:
        return
    triplets = ctx.alloc("triplets", align32(12 * rows))
    yield from ctx.drain()  # PipeBarrier<PIPE_ALL>
    ctx.copy_in(
        triplets, ctx.tensor("assist_info_for_combine"), 12 * r0, 12 * rows, name="load_triplets"
    )
    ctx.vector("dup_flag", 8, np.float32, writes=[flag], fn=lambda: flag.view(np.float32).fill(1.0))
    yield from ctx.pipe_barrier("mte2")  # SyncFunc<MTE2_S>
    info = ctx.ub_read(triplets, np.int32, 3 * rows, ops=0).reshape(rows, 3)
    expand_x = ctx.tensor("expand_x")
    order = [(loop + ctx.rank_id) % rows for loop in range(rows)]  # rank-staggered start
    last_use: list[Any] = [None, None]  # the data put that last read each slot pair
    loads: list[Any] = [None] * rows

    def load_row(loop: int) -> Wait:
        """AllocTensor + DataCopy: the load waits until the slot's last put has read it."""
        p = loop % 2
        if last_use[p] is not None:
            yield from ctx.wait(last_use[p])
        loads[loop] = ctx.copy_in(
            in_slots[p], expand_x, (r0 + order[loop]) * 2 * h, 2 * h, name="load_row"
        )

    yield from load_row(0)
    for loop in range(rows):
        src, token, k = (int(v) for v in info[order[loop]])
        ctx.scalar(3)
        p = loop % 2
        slot_in = in_slots[p]
        yield from ctx.wait(loads[loop])  # EnQue/DeQue
        dst_off = lay.combine_slot(token, k)
        if int8:
            out = out_slots[p]
            _int8_quantise(ctx, t, slot_in, out, dt, memo)
            if loop + 1 < rows:  # the scalar runs ahead: the next row loads meanwhile
                yield from load_row(loop + 1)
            yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
            last_use[p] = ctx.put(src, dst_off, out, crec.send_bytes, name="copy_row")
        else:
            last_use[p] = ctx.put(src, dst_off, slot_in, 2 * h, name="copy_row")
            if loop + 1 < rows:
                yield from load_row(loop + 1)
        ctx.mte_fence("mte3")  # PipeBarrier<PIPE_MTE3>: the flag follows the landed row
        ctx.put(src, lay.combine_flag(token, k), flag, 32, name="put_flag")
    yield from ctx.pipe_barrier("mte3")  # SyncFunc<MTE3_S>


def _int8_quantise(
    ctx: KernelContext, t: MoeTiling, slot, out, dt: np.dtype, memo: dict[bytes, np.ndarray]
) -> None:
    """Int8QuantProcess: blocks of 8 fp32, scale = max * (1/127), int8 + token-dtype scales."""
    h = t.H
    crec = t.combine_record

    def effect() -> None:
        row = slot.bytes_at(0, 2 * h)
        key = row.tobytes()
        packed = memo.get(key)
        if packed is None:
            qv, scales = q.int8_block_quantize(row.view(dt), recip=t.combine_recip, scale_dtype=dt)
            packed = np.empty(crec.send_bytes, np.uint8)
            packed[: crec.scale_offset] = qv[0, : crec.scale_offset].view(np.uint8)
            packed[crec.scale_offset :] = scales[0].view(np.uint8)
            memo[key] = packed
        out.view(np.uint8)[: crec.send_bytes] = packed

    int8_quant_process(ctx, slot, out, h, crec.scale_count, None if t.timing_only else effect)


# --------------------------------------------------------------------------- receive
def receive_and_combine(ctx: KernelContext, t: MoeTiling, memo: dict[bytes, np.ndarray]) -> Wait:
    """Each core's tokens in order: wait for a token's K + S slot flags (reset them), then
    the weighted fp32 sum of its rows, cast and written to x."""
    rx = _Receive(ctx, t, memo)
    t0, t1 = split_to_core(t.BS, ctx.num_cores, ctx.core_id)
    if t1 <= t0:
        return
    yield from ctx.wait(
        ctx.copy_in(
            rx.scales_buf, ctx.tensor("expert_scales"), 0, 4 * t.BS * t.K, name="load_scales"
        )
    )
    rx.weights = ctx.ub_read(rx.scales_buf, np.float32, t.BS * t.K, ops=0)
    for token in range(t0, t1):
        with ctx.phase("wait_status"):
            yield from rx.wait_dispatch(token)
        with ctx.phase("combine"):
            yield from rx.combine_token(token)
    yield from ctx.pipe_barrier("mte3")


class _Receive:
    """The receive's buffers and the state carried from token to token: which row buffer
    is next (parity), the vector op last reading each, the last output copy."""

    def __init__(self, ctx: KernelContext, t: MoeTiling, memo: dict[bytes, np.ndarray]) -> None:
        self.ctx, self.t, self.memo = ctx, t, memo
        h = t.H
        self.dt = q.token_dtype(t.dtype)
        self.n_slots = n_slots = t.window.slots_per_token  # K + S
        self.scales_buf = ctx.alloc("expert_scales", 4 * t.BS * t.K)
        self.token_buf = ctx.alloc("token", align32(2 * h))
        self.row_f32 = ctx.alloc("row_f32", align32(4 * h))
        self.mul_buf = ctx.alloc("mul", align32(4 * h))
        self.acc = ctx.alloc("sum", align32(4 * h))
        self.rows = [ctx.alloc(f"moe_sum{p}", align32(2 * h)) for p in range(2)]
        self.flags = ctx.alloc("state", 32 * n_slots)
        self.reset = reset = ctx.alloc("state_reset", 32 * n_slots)
        ctx.vector(
            "dup_reset",
            8 * n_slots,
            np.float32,
            writes=[reset],
            fn=lambda: reset.view(np.float32).fill(0),
        )
        self.weights = np.zeros(0, np.float32)
        self.parity = 0
        self.last_row_use: list[Any] = [None, None]
        self.out_op: Any = None

    def wait_dispatch(self, token: int) -> Wait:
        """Poll the token's K + S slot flags until all are 1.0, then reset them."""
        ctx, n_slots = self.ctx, self.n_slots
        win = ctx.window()
        flag_off = self.t.window.combine_flag(token, 0)
        yield from ctx.wait_until(
            win,
            flag_off,
            32 * n_slots,
            SumEquals(np.float32, 8.0 * n_slots, tolerance=0.5),
            self.flags,
            name="wait_flags",
            check_ns=ctx.check_ns(max(1, ceil_div(8 * n_slots, 64))),
        )
        ctx.copy_out(win, flag_off, self.reset, 32 * n_slots, name="reset_flags")

    def valid_slots(self, token: int) -> list[tuple[int, float | None]]:
        """The expert ids (scalar GetValue): (slot, weight) of each MoE slot, (slot, None)
        of each shared one; special experts (id >= E) are skipped and do not advance the
        weight index."""
        ctx, t = self.ctx, self.t
        ids_gm = ctx.tensor("expert_ids")
        valid: list[tuple[int, float | None]] = []
        widx = token * t.K
        for k in range(self.n_slots):
            if k < t.K:  # MoE slot: id check, weight
                eid = int(ctx.gm_read_scalar(ids_gm, 4 * (token * t.K + k), np.int32))
                if 0 <= eid < t.E:
                    valid.append((k, self.weights[widx]))
                    widx += 1
            else:  # shared expert k - K: weight 1, a plain Add
                valid.append((k, None))
        return valid

    def load_slot(self, token: int, valid: list, loads: list, j: int, parity: int) -> Wait:
        """Two-slot queue: a slot is refilled once the vector unit is done with it."""
        ctx, t = self.ctx, self.t
        p = (parity + j) % 2
        if self.last_row_use[p] is not None:
            yield from ctx.wait(self.last_row_use[p])
        loads[j] = ctx.copy_in(
            self.rows[p],
            ctx.window(),
            t.window.combine_slot(token, valid[j][0]),
            t.combine_record.send_bytes,
            name="load_slot",
        )

    def combine_token(self, token: int) -> Wait:
        """The token's rows loaded two ahead, dequantised (INT8), weighted and summed in
        fp32; the sum cast to the token dtype and written to x."""
        ctx, t, h, dt = self.ctx, self.t, self.t.H, self.dt
        acc, token_buf = self.acc, self.token_buf
        functional = not t.timing_only
        if self.out_op is not None:
            yield from ctx.wait(self.out_op)  # SyncFunc<MTE3_V>: token buffer free again
        ctx.vector(
            "dup_acc", h, np.float32, writes=[acc], fn=lambda: acc.view(np.float32, h).fill(0)
        )
        valid = self.valid_slots(token)
        loads: list[Any] = [None] * len(valid)
        parity = self.parity
        for j in range(min(2, len(valid))):
            yield from self.load_slot(token, valid, loads, j, parity)
        for j, (_, w) in enumerate(valid):
            buf = self.rows[(parity + j) % 2]
            yield from ctx.wait(loads[j])  # DeQue: the vector unit waits for the row
            if t.combine_quant == "int8":
                _int8_dequantise(ctx, t, buf, dt, self.memo)
            self.last_row_use[(parity + j) % 2] = _accumulate(
                ctx, h, dt, buf, w, self.row_f32, self.mul_buf, acc, functional
            )
            if j + 2 < len(valid):  # the load two ahead, into the slot just consumed
                yield from self.load_slot(token, valid, loads, j + 2, parity)
        self.parity = (parity + len(valid)) % 2

        def cast_out() -> None:
            token_buf.view(dt, h)[:] = acc.view(np.float32, h).astype(dt)

        ctx.vector(
            "cast_out",
            h,
            np.float32,
            reads=[acc],
            writes=[token_buf],
            fn=cast_out if functional else None,
        )
        yield from ctx.pipe_barrier("vector")  # SyncFunc<V_MTE3>
        self.out_op = ctx.copy_out(ctx.tensor("x"), token * 2 * h, token_buf, 2 * h, name="write_x")


def _accumulate(
    ctx: KernelContext, h: int, dt: np.dtype, buf, w, row_f32, mul_buf, acc, functional: bool
):
    """acc += fp32(row) * w (Cast, Muls, Add), or acc += fp32(row) for a shared expert
    (w is None: Cast, Add). The product is rounded to fp32 before the add (no FMA)."""
    if w is None:

        def add_shared() -> None:
            a = acc.view(np.float32, h)
            np.add(a, buf.view(dt, h).astype(np.float32), out=a)

        return ctx.vector_seq(
            "shared_add",
            [("cast_f32", h, np.float32), ("add", h, np.float32)],
            reads=[buf, row_f32],
            writes=[row_f32, acc],
            fn=add_shared if functional else None,
        )

    def accumulate() -> None:
        prod = mul_buf.view(np.float32, h)
        np.multiply(buf.view(dt, h), np.float32(w), out=prod, dtype=np.float32)
        a = acc.view(np.float32, h)
        np.add(a, prod, out=a)

    return ctx.vector_seq(
        "weighted_add",
        [("cast_f32", h, np.float32), ("muls_weight", h, np.float32), ("add", h, np.float32)],
        reads=[buf, row_f32, mul_buf],
        writes=[row_f32, mul_buf, acc],
        fn=accumulate if functional else None,
    )


def _int8_dequantise(
    ctx: KernelContext, t: MoeTiling, buf, dt: np.dtype, memo: dict[bytes, np.ndarray]
) -> None:
    """Int8 dequant in place: fp16(fp32(q) * fp32(scale)) per block of 8."""
    h = t.H
    crec = t.combine_record
    n_in = crec.send_bytes  # the INT8 row and its scales in the token dtype

    def effect() -> None:
        raw = buf.view(np.uint8)
        key = raw[:n_in].tobytes()
        row = memo.get(key)
        if row is None:
            qv = raw[: crec.scale_offset].view(np.int8)
            scales = raw[crec.scale_offset : n_in].view(dt)
            with np.errstate(invalid="ignore"):  # inf * 0 -> NaN, as on the device
                row = q.int8_block_dequantize(qv[None, :], scales[None, :], h, out_dtype=dt)[0]
            memo[key] = row
        buf.view(dt, h)[:] = row

    f32 = np.float32
    ctx.vector_seq(
        "int8_dequant",
        [
            ("cast_scales", crec.scale_count, f32),
            ("cast_i8_f16", h, np.float16),
            ("cast_f16_f32", h, f32),
            ("brcb", h, f32),
            ("mul", h, f32),
            ("cast_back", h, f32),
        ],
        reads=[buf],
        writes=[buf],
        fn=None if t.timing_only else effect,
    )
