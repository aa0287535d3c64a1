"""MoeDistributeCombineV2Layered: DeepEP-Ascend's low-latency combine over 2+ A2 servers
(csrc/deepep/ops2/op_kernel/moe_distribute_combine_v2_layered_custom.h, tiling key 3000:
BF16, which deep_ep.cpp always passes), the reverse of the layered dispatch, with the
source's names. It reads the reduce info the dispatch left in layout_range.

- Init: the RDMA half (bufferChosen), each core's status toggle (its sumTarget), core 0
  the value its end-of-data post carries (readState), the magic;
- GM2IPC (cores split over the W source ranks): each received row, in (local expert,
  source) order, GM -> UB -> the own IPC slice of its source rank, one row at a time;
  SyncAll; cores 0..7 tell each local rank (GM2IPC_SYNC_FLAG + magic); SyncAll;
- WaitIPC: cores 0..7 wait for each local rank's word, then clear it; SyncAll;
- cores 0..31, 32 / serverNum per source server s: SumToWindow pulls, per token of the
  same-plane rank in server s (in innerCnt's order), its rows from the IPC slices of the
  ranks that hold them (HCCS reads) into windowsOut, then a flag with the count;
- cores 32..32 + serverNum - 1: AlltoAllServerDispatch, per server s, follows those flags
  in order and posts each token's rows as one RDMA WRITE to the same-plane rank of s (the
  own server: a local copy row by row), then the 32 B status (readState);
- core 0: the magic and bufferChosen stepped; Preload (cores 0..7, BS split): outerCnt,
  outerOffset, the per-server counts, the expert scales and ids;
- WaitDispatch: core s < serverNum of another server waits for its status; SyncAll;
- SumToServer (cores 0..7): per token, per server it went to, its rows from the own
  windowsIn weighted by their expert scales (Cast, Axpy in fp32, the server's experts in k
  order), one RINT cast to BF16 into combined_x.

npusim's simplifications (docs/kernels/deepep.md): windowsOut is a GM tensor of its own
(per server BS K rows, the rows of server s from s BS K H 2 B), not HCCL's windowsOut.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep.layered_layout import (
    COMBINE_REDUCE_CORES,
    IPC_DATA_OFFSET,
    NOTIFY_DATA_SIZE,
    RDMA_DATA_SIZE,
    SERVER_RANK_SIZE,
    STATE_OFFSET,
)
from npusim.kernels.deepep.layered_send import buffer_chosen
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.kernels.kernel import Call, Kernel, Phase, TensorSpec, const
from npusim.runtime.conditions import AtLeast, Condition, Wait
from npusim.runtime.context import KernelContext
from npusim.runtime.poll import Poll
from npusim.runtime.rdma import AivRdma
from npusim.units import KiB, align_up

I16, I32, U32, U64, F32 = np.int16, np.int32, np.uint32, np.uint64, np.float32

# the kernel's constants (moe_distribute_combine_v2_layered_custom.h)
UB_ALIGN = 32
SELF_STATE_OFFSET = 512 * KiB
MAGIC_OFFSET = 2 * 1024 * KiB - 32 * 32
IPC_REDUCE_USED_CORE_NUM = COMBINE_REDUCE_CORES
GM2IPC_SYNC_FLAG = 12345
RDMA_TOKEN_ARRIVED_FLAG = 123
RDMA_TOKEN_END_FLAG = 321
MAX_BS_NUM = 512
FLAG_SINGLE_CNT = 4  # uint64 words of a 32 B flag
FLAG_TOTAL_SIZE = MAX_BS_NUM * SERVER_RANK_SIZE * FLAG_SINGLE_CNT  # uint64 words per server
REDUCE_CORE = 8


class OneOf(Condition):
    """The first uint64 equals one of the values (a flag that says "data" or "end")."""

    def __init__(self, *values: int) -> None:
        self.values = values

    def __call__(self, data: np.ndarray) -> bool:
        return int(data[:8].view(U64)[0]) in self.values

    def describe(self, data: np.ndarray) -> str:
        return f"expects the uint64 flag in {list(self.values)}; now {int(data[:8].view(U64)[0])}"


def _ipc_slice(t: LayeredTiling) -> int:
    """ipcSliceSize: the IPC data area over W, 32 B aligned."""
    data = t.window.total_size - RDMA_DATA_SIZE - IPC_DATA_OFFSET - NOTIFY_DATA_SIZE
    return data // t.W // 32 * 32


def _rank_size_on_win(t: LayeredTiling) -> int:
    return t.window.win_size // t.W // 32 * 32


def _out_region(t: LayeredTiling, server: int) -> int:
    """Where server `server`'s rows start in npusim's windowsOut tensor."""
    return server * t.shape.BS * t.shape.K * 2 * t.shape.H


def combine_program(t: LayeredTiling):
    def program(ctx: KernelContext) -> Wait:
        S = t.server_num
        core = ctx.core_id
        with ctx.phase("init"):
            state = yield from init(ctx, t)
        with ctx.phase("gm2ipc"):
            yield from gm2ipc(ctx, t, state)
            yield from wait_ipc(ctx, t, state)
        with ctx.phase("sum_to_window"):
            if core < IPC_REDUCE_USED_CORE_NUM:
                yield from sum_to_window(ctx, t, state)
            elif core < IPC_REDUCE_USED_CORE_NUM + S:
                yield from all_to_all_server_dispatch(ctx, t, state)
            yield from ctx.drain()
            yield from ctx.sync_all()
            if core == 0:
                win, w = ctx.window(), t.window
                ctx.gm_write_scalar(win, w.ipc(MAGIC_OFFSET), state["magic"] + 1, U64)
                ctx.dcache.dcci_line(win, w.ipc(MAGIC_OFFSET))
                ctx.gm_write_scalar(win, w.buffer_chosen, state["buf"] ^ 1, U32)
                ctx.dcache.dcci_line(win, w.buffer_chosen)
        with ctx.phase("wait_dispatch"):
            pre = yield from preload(ctx, t)
            yield from wait_dispatch(ctx, t, state)
        with ctx.phase("sum_to_server"):
            yield from sum_to_server(ctx, t, state, pre)
            yield from ctx.drain()
            yield from ctx.sync_all()

    return program


def init(ctx: KernelContext, t: LayeredTiling) -> Wait:
    """The half, the core's status toggle (its sumTarget), readState, the magic."""
    buf = buffer_chosen(ctx, t)
    win, w = ctx.window(), t.window
    status = buf * w.half_win + w.win_size
    at = status + SELF_STATE_OFFSET + ctx.core_id * UB_ALIGN * 4
    old = int(ctx.gm_read_scalar(win, at, I32))
    value = 0 if old else 1
    ctx.gm_write_scalar(win, at, value, I32)
    if ctx.core_id == 0:
        rs = ctx.tensor("read_state")
        ctx.gm_write_scalar(rs, 0, value, I32)
        ctx.dcache.dcci_line(rs, 0)
    magic = int(ctx.gm_read_scalar(win, w.ipc(MAGIC_OFFSET), U64))
    yield from ctx.drain()
    return {"buf": buf, "target": value, "magic": magic}


def gm2ipc(ctx: KernelContext, t: LayeredTiling, state: dict[str, int]) -> Wait:
    W, L, H = t.W, t.shape.L, t.shape.H
    w, win = t.window, ctx.window()
    r0, r1 = split_to_core(W, ctx.num_cores, ctx.core_id)
    counts = ctx.alloc("send_count", align_up(4 * t.shape.E, 32))
    row = ctx.alloc("in_ub", align_up(2 * H, 32))
    yield from ctx.wait(ctx.copy_in(counts, ctx.tensor("ep_recv_count"), 0, 4 * t.shape.E,
                                    name="send_count"))
    yield from ctx.drain()
    cum = ctx.ub_read(counts, I32, t.shape.E, ops=0)
    x = ctx.tensor("expand_x")
    sl = _ipc_slice(t)
    for dst in range(r0, r1):
        base = w.ipc(IPC_DATA_OFFSET) + dst * sl
        n_rank = 0
        for le in range(L):
            ctx.scalar(4)
            i = le * W + dst
            pre = int(cum[i - 1]) if i else 0
            for j in range(int(cum[i]) - pre):
                ctx.loop(1)
                yield from ctx.wait(ctx.copy_in(row, x, (pre + j) * 2 * H, 2 * H,
                                                name="gm2ipc_load"))
                yield from ctx.wait(ctx.copy_out(win, base + n_rank * 2 * H, row, 2 * H,
                                                 name="gm2ipc"))
                n_rank += 1
                yield from ctx.drain()
    yield from ctx.sync_all()
    if ctx.core_id < SERVER_RANK_SIZE:
        flag = ctx.alloc("gm2ipc_flag", UB_ALIGN)
        ctx.ub_write(flag, 0, np.array([GM2IPC_SYNC_FLAG + state["magic"], 0, 0, 0], U64))
        target = ctx.rank_id // SERVER_RANK_SIZE * SERVER_RANK_SIZE + ctx.core_id
        yield from ctx.drain()
        yield from ctx.wait(ctx.put(target, w.ipc(0) + ctx.rank_id % SERVER_RANK_SIZE * UB_ALIGN,
                                    flag, UB_ALIGN, name="gm2ipc_flag"))
        yield from ctx.drain()
    yield from ctx.sync_all()


def wait_ipc(ctx: KernelContext, t: LayeredTiling, state: dict[str, int]) -> Wait:
    if ctx.core_id < SERVER_RANK_SIZE:
        buf = ctx.alloc("wait_ipc", UB_ALIGN)
        at = t.window.ipc(0) + ctx.core_id * UB_ALIGN
        win = ctx.window()
        yield from ctx.wait_until(win, at, 8, AtLeast(U64, GM2IPC_SYNC_FLAG + state["magic"]),
                                  buf, name="wait_ipc")
        yield from ctx.drain()
        ctx.ub_write(buf, 0, np.zeros(4, U64))
        win.release(at, UB_ALIGN)
        yield from ctx.wait(ctx.copy_out(win, at, buf, UB_ALIGN, name="clear_ipc_flag"))
        yield from ctx.drain()
    yield from ctx.sync_all()


def _flag_at(t: LayeredTiling, server: int, token: int) -> int:
    return t.window.ipc(0) + ((server + 1) * FLAG_TOTAL_SIZE + token * FLAG_SINGLE_CNT) * 8


def sum_to_window(ctx: KernelContext, t: LayeredTiling, state: dict[str, int]) -> Wait:
    """BF16: each token's rows pulled into windowsOut, then its flag (count in word 1)."""
    S, K, H, g = t.server_num, t.shape.K, t.shape.H, t.global_bs
    per = IPC_REDUCE_USED_CORE_NUM // S  # coreNumPerServer
    server = ctx.core_id // per
    if server >= S:
        return
    mine = ctx.core_id % per
    lr = ctx.rank_id % SERVER_RANK_SIZE
    target_rank = lr + server * SERVER_RANK_SIZE
    max_local = min(g, MAX_BS_NUM)
    off = t.combine_offsets
    cnt_ub = ctx.alloc("count_reduce", align_up(2 * max_local, 32))
    idx_ub = ctx.alloc("offset_reduce", align_up(4 * max_local * K, 32))
    info = ctx.tensor("ep_recv_count")
    ctx.copy_in(cnt_ub, info, off["inner_cnt"] + g * server * 2, 2 * max_local)
    ctx.copy_in(idx_ub, info, off["inner_idx"] + g * K * server * 4, 4 * max_local * K)
    yield from ctx.drain()
    cnt = ctx.ub_read(cnt_ub, I16, max_local, ops=0).astype(np.int64)
    idx = ctx.ub_read(idx_ub, I32, max_local * K, ops=0)
    row = ctx.alloc("data_in", align_up(2 * H, 32))
    flag = ctx.alloc("rdma_flag", UB_ALIGN)
    sl = _ipc_slice(t)
    out = ctx.tensor("combine_windows_out")
    w = t.window
    processed = 0
    for i in range(max_local):
        if i % per != mine:
            continue
        ctx.scalar(6)
        pre = int(cnt[i - 1]) if i else 0
        n = int(cnt[i]) - pre
        if n <= 0:
            break
        for j in range(pre, pre + n):
            ctx.loop(1)
            ctx.scalar(6)
            o = int(idx[j])
            holder = ctx.rank_id // SERVER_RANK_SIZE * SERVER_RANK_SIZE + o // (g * K) % \
                SERVER_RANK_SIZE
            src_at = w.ipc(IPC_DATA_OFFSET) + target_rank * sl + o % (g * K) * 2 * H
            yield from ctx.wait(ctx.copy_in(row, ctx.window(holder), src_at, 2 * H,
                                            name="sum_to_window_pull"))
            yield from ctx.wait(ctx.copy_out(out, _out_region(t, server) + j * 2 * H, row,
                                             2 * H, name="sum_to_window"))
        token = per * processed + mine
        yield from ctx.drain()
        ctx.ub_write(flag, 0, np.array([RDMA_TOKEN_ARRIVED_FLAG + state["magic"], n, 0, 0],
                                       U64))
        yield from ctx.wait(ctx.copy_out(ctx.window(), _flag_at(t, server, token), flag,
                                         UB_ALIGN, name="token_flag"))
        yield from ctx.drain()
        processed += 1
    ctx.ub_write(flag, 0, np.array([RDMA_TOKEN_END_FLAG + state["magic"], 0, 0, 0], U64))
    yield from ctx.wait(ctx.copy_out(ctx.window(), _flag_at(t, server, per * processed + mine),
                                     flag, UB_ALIGN, name="end_flag"))


def all_to_all_server_dispatch(ctx: KernelContext, t: LayeredTiling,
                               state: dict[str, int]) -> Wait:
    H = t.shape.H
    server = ctx.core_id - IPC_REDUCE_USED_CORE_NUM
    me = ctx.rank_id
    dst_rank = me % SERVER_RANK_SIZE + SERVER_RANK_SIZE * server
    w, win = t.window, ctx.window()
    rsw = _rank_size_on_win(t)
    dst_base = state["buf"] * w.half_win + me // SERVER_RANK_SIZE * rsw * SERVER_RANK_SIZE
    out = ctx.tensor("combine_windows_out")
    src_base = _out_region(t, server)
    check = ctx.alloc("check_rdma", UB_ALIGN)
    rdma = AivRdma(ctx, ctx.alloc("ub_local", UB_ALIGN)) if dst_rank != me else None
    row = ctx.alloc("tmp_low_ub", align_up(2 * H, 32)) if dst_rank == me else None
    arrived = RDMA_TOKEN_ARRIVED_FLAG + state["magic"]
    end = RDMA_TOKEN_END_FLAG + state["magic"]
    sent = 0
    token = 0
    while True:
        yield from ctx.poll_round_robin(
            [Poll(win, _flag_at(t, server, token), OneOf(arrived, end), check, UB_ALIGN)], 0,
            name="check_rdma_flag")
        words = ctx.ub_read(check, U64, 2, ops=1)
        ctx.scalar(3)
        if int(words[0]) == end:
            break
        n = int(words[1])
        token += 1
        if rdma is not None:
            yield from rdma.post_send(dst_rank, dst_base + sent * 2 * H, out,
                                      src_base + sent * 2 * H, n * 2 * H, name="rdma_rows")
        else:
            for k in range(n):
                ctx.loop(1)
                at = (sent + k) * 2 * H
                yield from ctx.wait(ctx.copy_in(row, out, src_base + at, 2 * H,
                                                name="local_rows_load"))
                yield from ctx.wait(ctx.copy_out(win, dst_base + at, row, 2 * H,
                                                 name="local_rows"))
                yield from ctx.drain()
        sent += n
    if rdma is not None:
        yield from rdma.post_send(dst_rank, state["buf"] * w.half_win + w.win_size
                                  + me // SERVER_RANK_SIZE * STATE_OFFSET,
                                  ctx.tensor("read_state"), 0, 32, name="rdma_status")


def preload(ctx: KernelContext, t: LayeredTiling) -> Wait:
    BS, K, S = t.shape.BS, t.shape.K, t.server_num
    if ctx.core_id >= REDUCE_CORE:
        return None
    start, end = split_to_core(BS, REDUCE_CORE, ctx.core_id)
    off, info = t.combine_offsets, ctx.tensor("ep_recv_count")
    n = end - start
    bufs = {}
    for name, at, count in (("count_outer", off["outer_cnt"], BS),
                            ("offset_outer", off["outer_idx"], BS * S),
                            ("count_per_server", off["per_server"], BS * S)):
        bufs[name] = ctx.alloc(name, align_up(4 * count, 32))
        ctx.copy_in(bufs[name], info, at, 4 * count, name=name)
    if n:
        bufs["scales"] = ctx.alloc("expand_scales", align_up(4 * n * K, 32))
        bufs["ids"] = ctx.alloc("expert_ids", align_up(4 * n * K, 32))
        ctx.copy_in(bufs["scales"], ctx.tensor("expand_scales"), 4 * start * K, 4 * n * K)
        ctx.copy_in(bufs["ids"], ctx.tensor("expert_ids"), 4 * start * K, 4 * n * K)
    yield from ctx.drain()
    got = {"start": start, "end": end,
           "count": ctx.ub_read(bufs["count_outer"], I32, BS, ops=0),
           "offset": ctx.ub_read(bufs["offset_outer"], I32, BS * S, ops=0),
           "per_server": ctx.ub_read(bufs["count_per_server"], I32, BS * S, ops=0)}
    if n:
        got["scales"] = ctx.ub_read(bufs["scales"], F32, n * K, ops=0).reshape(n, K)
        got["ids"] = ctx.ub_read(bufs["ids"], I32, n * K, ops=0).reshape(n, K)
    return got


def wait_dispatch(ctx: KernelContext, t: LayeredTiling, state: dict[str, int]) -> Wait:
    c = ctx.core_id
    if c < t.server_num and c != ctx.rank_id // SERVER_RANK_SIZE:
        buf = ctx.alloc("status", UB_ALIGN)
        at = state["buf"] * t.window.half_win + t.window.win_size + c * STATE_OFFSET
        yield from ctx.wait_until(ctx.window(), at, 4, AtLeast(I32, state["target"]), buf,
                                  name="wait_dispatch")
    yield from ctx.drain()
    yield from ctx.sync_all()


def sum_to_server(ctx: KernelContext, t: LayeredTiling, state: dict[str, int],
                  pre: dict[str, Any] | None) -> Wait:
    if pre is None or pre["end"] <= pre["start"]:
        return
    BS, K, H, S = t.shape.BS, t.shape.K, t.shape.H, t.server_num
    per_server = SERVER_RANK_SIZE * t.shape.L
    w, win = t.window, ctx.window()
    rsw = _rank_size_on_win(t)
    base = state["buf"] * w.half_win
    row = ctx.alloc("data_in", align_up(2 * H, 32))
    acc_ub = ctx.alloc("sum_float", 4 * H)
    ctx.alloc("cast_fp32", 4 * H)
    out_ub = ctx.alloc("sum_bf16", align_up(2 * H, 32))
    dt = t.shape.np_dtype
    cnt = pre["count"]
    index = int(cnt[pre["start"] - 1]) if pre["start"] else 0
    out = ctx.tensor("x_out")
    for i in range(pre["start"], pre["end"]):
        ctx.loop(1)
        n = int(cnt[i]) - (int(cnt[i - 1]) if i else 0)
        if not n:
            break
        ids = pre["ids"][i - pre["start"]]
        ctx.scalar(4 * K)
        order = {s: [k for k in range(K) if int(ids[k]) // per_server == s] for s in range(S)}
        acc = np.zeros(H, F32)
        ctx.vector("duplicate", H, F32, writes=[acc_ub])
        for _ in range(n):
            ctx.scalar(6)
            count = int(pre["per_server"][index])
            o = int(pre["offset"][index])
            server = o // (BS * K)
            at = base + server * rsw * SERVER_RANK_SIZE + o % (BS * K) * 2 * H
            for j in range(count):
                ctx.loop(1)
                k = order[server][j]
                weight = F32(pre["scales"][i - pre["start"]][k])
                yield from ctx.wait(ctx.copy_in(row, win, at + j * 2 * H, 2 * H,
                                                name="sum_to_server_load"))
                vals = row.bytes_at(0, 2 * H).view(dt).astype(F32)
                acc = (acc + vals * weight).astype(F32)
                ctx.vector_seq("axpy", [("cast_f32", H, dt), ("axpy", H, F32)],
                               reads=[row], writes=[acc_ub])
                yield from ctx.pipe_barrier("vector")
            index += 1

        def effect(acc: np.ndarray = acc) -> None:
            out_ub.bytes_at(0, 2 * H)[:] = acc.astype(dt).view(np.uint8)

        ctx.vector("cast_rint", H, F32, reads=[acc_ub], writes=[out_ub],
                   fn=None if t.timing_only else effect)
        yield from ctx.pipe_barrier("vector")
        yield from ctx.wait(ctx.copy_out(out, i * 2 * H, out_ub, 2 * H, name="x_out"))


class LayeredCombine(Kernel):
    """MoeDistributeCombineV2Layered under DeepEP's names."""

    name = "low_latency_combine_layered"
    engines = ("rdma",)
    phases = (
        Phase("init", "every core: its status toggle; core 0 readState"),
        Phase("gm2ipc", "cores split over the source ranks: the rows into the own IPC "
              "slices; cores 0..7 the sync words, then wait for the local ranks'"),
        Phase("sum_to_window", "cores 0..31: each token's rows pulled from its ranks' IPC "
              "slices (HCCS) into windowsOut; cores 32..: one RDMA WRITE per token to the "
              "same-plane rank of each server, then the status"),
        Phase("wait_dispatch", "cores 0..7 Preload; core s < serverNum waits for server s"),
        Phase("sum_to_server", "cores 0..7: per token its rows weighted in fp32, one cast"),
    )
    inputs = (TensorSpec("x", lambda t: t.shape.np_dtype,
                         lambda t, r: (t.shape.rows_capacity(r), t.shape.H),
                         "[A, H] the experts' outputs, packed_recv_x's order", gm="expand_x"),
              TensorSpec("topk_idx", const(I32), lambda t, r: (t.shape.BS, t.shape.K),
                         "[BS, K] as int32", gm="expert_ids"),
              TensorSpec("topk_weights", const(F32), lambda t, r: (t.shape.BS, t.shape.K),
                         "[BS, K]", gm="expand_scales"),
              TensorSpec("layout_range", const(I32), lambda t, r: (t.recv_count_ints,),
                         "the dispatch's counts and reduce info", gm="ep_recv_count"))
    outputs = (TensorSpec("combined_x", lambda t: t.shape.np_dtype,
                          lambda t, r: (t.shape.BS, t.shape.H), "[BS, H]", gm="x_out"),)
    scratch = (TensorSpec("combine_windows_out", const(np.uint8),
                          lambda t, r: (t.server_num * t.shape.BS * t.shape.K * 2 * t.shape.H,),
                          "per server the rows to send (HCCL's windowsOut)"),
               TensorSpec("read_state", const(np.uint8), lambda t, r: (32,),
                          "the status word posted after the rows"))

    def program(self, tiling: LayeredTiling) -> Any:
        return combine_program(tiling)

    def fields(self, call: Call) -> dict[str, Any]:
        s, run = call.tiling.shape, call.run
        return ll.bandwidth_fields([s.BS * s.K] * call.tiling.W, ll.token_bytes(s.H, "bf16"),
                                   run.end_ns - run.start_ns)


COMBINE = LayeredCombine()
