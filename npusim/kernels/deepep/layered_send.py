"""The layered dispatch's sending side: Init, ReorderTokens (with QuantProcess for INT8)
and SendDataToServer, the RDMA WRITEs to the same-plane rank of another server."""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep.layered_layout import (
    END_OF_WRITE_FLAG_VALUE,
    FLAG_SIZE,
    IPC_MAGIC_OFFSET,
    SERVER_RANK_SIZE,
    SHOULD_SEND_FLAG_VALUE,
    UB_32B_ALIGN,
)
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.runtime.rdma import AivRdma
from npusim.runtime.transfer import Strided
from npusim.units import align_up

I32, U32, U64, F32 = np.int32, np.uint32, np.uint64, np.float32


def buffer_chosen(ctx: KernelContext, t: LayeredTiling) -> int:
    """bufferChosen: which half of the RDMA area this call uses (its word in half 0)."""
    return int(ctx.gm_read_scalar(ctx.window(), t.window.buffer_chosen, U32))


def init(ctx: KernelContext, t: LayeredTiling) -> Wait:
    """bufferChosen, the end-of-write flag (core 0), the core's magic in the own IPC area."""
    win, w = ctx.window(), t.window
    buf_id = buffer_chosen(ctx, t)
    if ctx.core_id == 0:
        status = ctx.tensor("send_status")
        ctx.gm_write_scalar(status, 0, END_OF_WRITE_FLAG_VALUE, U64)
        ctx.dcache.dcci_line(status, 0)
    tmp = ctx.alloc("magic", UB_32B_ALIGN)
    at = w.ipc(IPC_MAGIC_OFFSET) + ctx.core_id * UB_32B_ALIGN
    yield from ctx.wait(ctx.copy_in(tmp, win, at, UB_32B_ALIGN, name="magic"))
    yield from ctx.drain()
    magic = int(ctx.ub_read(tmp, U64, 1, ops=1)[0]) + 1
    ctx.ub_write(tmp, 0, np.array([magic], U64))
    yield from ctx.wait(ctx.copy_out(win, at, tmp, UB_32B_ALIGN, name="magic"))
    ctx.ub.reset()
    return buf_id, magic


def _servers(ids: np.ndarray, t: LayeredTiling) -> int:
    """sendServerInfo: one bit per server the token has an expert in."""
    mask = 0
    for e in ids:
        mask |= 1 << (int(e) // (SERVER_RANK_SIZE * t.shape.L))
    return mask


def reorder_tokens(ctx: KernelContext, t: LayeredTiling) -> Wait:
    BS, K, H = t.shape.BS, t.shape.K, t.shape.H
    start, end = split_to_core(BS, ctx.num_cores, ctx.core_id)
    if end <= start:
        return
    ids_buf = ctx.alloc("expert_ids", align_up(4 * BS * K, 32))
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * BS * K))
    ctx.vector("cast_i16", BS * K, I32)  # expertIdsI16Tensor_
    yield from ctx.pipe_barrier("vector")
    ids = ctx.ub_read(ids_buf, I32, BS * K, ops=0).reshape(BS, K)
    item = t.shape.np_dtype.itemsize
    quant = t.quant == "int8"
    rec = t.struct_len
    # quantTokenUBSize: quantising, the tokens are loaded into the structs' own buffer (as
    # bf16, so a token's slot is the larger of the two) and cast from there to fp32
    slot = max(rec, H * item) if quant else rec
    per_ub = max(1, t.token_ub_size // (slot + (4 * H if quant else 0)))
    x, flags, out = ctx.tensor("x"), ctx.tensor("token_addr_flag_struct"), \
        ctx.tensor("windows_out")
    tok = start
    while tok < end:
        n = min(per_ub, end - tok)
        ctx.ub.reset()
        structs = ctx.alloc("token_struct", align_up(n * slot, 32))
        # the expert ids' padding and the scale lane hold whatever UB held; zeros here, or
        # the loaded tokens' bytes when quantising
        ctx.ub_write(structs, 0, np.zeros(n * rec, np.uint8), ops=0)
        if quant:
            yield from ctx.wait(ctx.copy_in(structs, x, tok * H * item, n * H * item,
                                            name="load_token"))
            yield from ctx.drain()
            quant_process(ctx, t, structs, structs, n)
        else:
            ctx.copy_in(structs, x, tok * H * item, n * H * item, dst_offset=t.token_offset,
                        name="load_token", strided=Strided(n, H * item, 0, rec - H * item))
        yield from ctx.drain()
        ctx.copy_in(structs, ctx.tensor("expert_ids"), tok * K * 4, n * K * 4,
                    dst_offset=t.exp_offset, name="load_expert_ids",
                    strided=Strided(n, K * 4, 0, rec - K * 4))
        yield from ctx.drain()
        for i in range(n):
            ctx.loop(1)
            ctx.ub_write(structs, i * rec, np.array([SHOULD_SEND_FLAG_VALUE], U64))
            ctx.scalar(3 * K)  # expId, dstServerId, the bit
            mask = _servers(ids[tok + i], t)
            yield from ctx.drain()
            ctx.gm_write_scalar(flags, FLAG_SIZE * (tok + i), mask, U64)
            ctx.dcache.dcci_line(flags, FLAG_SIZE * (tok + i))
            yield from ctx.drain()
        yield from ctx.wait(ctx.copy_out(out, tok * rec, structs, n * rec,
                                         name="token_struct"))
        tok += n


def quant_process(ctx: KernelContext, t: LayeredTiling, src: Any, structs: Any, n: int) -> None:
    """QuantProcess: Cast to fp32, then per token ReduceMax, ReduceMin, Abs, ReduceMax,
    127 / max, Muls, the casts to int32 (RINT), half, int8 into the struct; 1 / scale after
    the expert ids."""
    H, rec = t.shape.H, t.struct_len
    dt = t.shape.np_dtype
    ctx.alloc("token_cast", 4 * H * n)
    ctx.vector("cast_f32", n * H, F32, reads=[src])
    for i in range(n):
        def effect(i: int = i) -> None:
            xf = src.bytes_at(i * H * dt.itemsize, H * dt.itemsize).view(dt).astype(F32)
            d = F32(127.0) / np.max(np.abs(xf))
            q = np.rint(xf * d).astype(np.int8)
            structs.bytes_at(i * rec + t.token_offset, H)[:] = q.view(np.uint8)
            structs.bytes_at(i * rec + t.scale_offset, 4)[:] = np.array(
                [F32(1.0) / d], F32).view(np.uint8)

        ctx.vector_seq("reduce_max", [("reduce_max", H, F32), ("reduce_min", H, F32),
                                      ("abs", 2, F32), ("reduce_max", 2, F32)])
        ctx.scalar(3)  # SyncFunc<V_S>, the scale, SyncFunc<S_V>
        ctx.vector_seq("quant", [("muls", H, F32), ("cast_i32", H, F32), ("cast_f16", H, I32),
                                 ("cast_i8", H, np.float16)], writes=[structs],
                       fn=None if t.timing_only else effect)
        ctx.scalar(1)  # the scale's SetValue


def send_data_to_server(ctx: KernelContext, t: LayeredTiling, buf_id: int, dest: int) -> Wait:
    """One AIVRDMAPostSend per token that has an expert in server `dest`, to the rank of the
    same local index there, then the 64 B end-of-write flag."""
    BS, rec, w = t.shape.BS, t.struct_len, t.window
    me = ctx.rank_id
    server_id = me // SERVER_RANK_SIZE
    dst_rank = me % SERVER_RANK_SIZE + dest * SERVER_RANK_SIZE
    rdma = AivRdma(ctx, ctx.alloc("ub_local", UB_32B_ALIGN))
    info = ctx.alloc("send_token_info", BS * FLAG_SIZE)
    yield from ctx.wait(ctx.copy_in(info, ctx.tensor("token_addr_flag_struct"), 0,
                                    BS * FLAG_SIZE, name="send_token_info"))
    yield from ctx.drain()
    masks = ctx.ub_read(info, U64, BS * FLAG_SIZE // 8, ops=0)[::FLAG_SIZE // 8]
    dst = w.rdma_tokens(buf_id, server_id)
    out = ctx.tensor("windows_out")
    for tok in range(BS):
        ctx.loop(1)
        ctx.scalar(2)
        if int(masks[tok]) >> dest & 1:
            yield from rdma.post_send(dst_rank, dst, out, tok * rec, rec, name="rdma_token")
            dst += rec
            yield from ctx.drain()
    yield from rdma.post_send(dst_rank, w.rdma_status(buf_id, server_id),
                              ctx.tensor("send_status"), 0, FLAG_SIZE, name="rdma_end_flag")
    yield from ctx.drain()
