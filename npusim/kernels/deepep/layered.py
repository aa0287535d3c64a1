"""MoeDistributeDispatchV2Layered: DeepEP-Ascend's low-latency dispatch over 2+ A2 servers
(csrc/deepep/ops2/op_kernel/moe_distribute_dispatch_v2_layered_custom.h, tiling key
2100001000, +2 for INT8), as a per-core program with the source's names.

DeepEP picks it on the A2 with more than 8 ranks when HCCL_INTRA_PCIE_ENABLE=1 and
HCCL_INTRA_ROCE_ENABLE=0 (``comm_alg: hierarchy``). Tokens cross servers once, by RDMA
WRITEs the AIV posts itself, to the rank with the same local index in each server ("plane");
that rank relays them over HCCS (the IPC area of its server's windows) to the ranks of the
experts. Process, with every core's role:

- Init: the RDMA half (bufferChosen), core 0 arms the end-of-write flag in windowsOut, every
  core steps its call counter (magic) in the own IPC area;
- ReorderTokens (all cores, BS split): per token a struct | flag 32 B | token | expert ids
  Align8(K) x 4 B | scale 32 B | built in UB (INT8: QuantProcess), the servers it goes to
  as a bit mask in the workspace (tokenAddrFlagStruct), the structs to windowsOut; SyncAll;
- core s < serverNum: SendDataToServer(s) for another server (one AIVRDMAPostSend per token
  that goes there, then the 64 B end flag), then CreateInnerReduceInfo(s): waits for server
  s's tokens and writes the combine's intra-server reduce info into ep_recv_count;
- core serverNum: CreateOuterReduceInfo, the inter-server reduce info of the own tokens;
- the other cores: Win2Ipc, (cores - serverNum - 1) / serverNum per source server: they wait
  for its tokens (GetArrivedTokenInfo; the own server's come from windowsOut) and copy each
  to the IPC area of the rank of every expert it has in this server, then the counts;
- SyncAll, SetIpcFlag / WaitIpcFlag (cores < 8, the magic, one per local rank), SyncAll;
- Ipc2Out: cores per local expert copy their (expert, source) blocks to expand_x and the
  scales; core 0 writes ep_recv_count's cumsum and expert_token_nums;
- CleanUp (cores < serverNum): flip bufferChosen, clear the end flags and token flags.

npusim's simplifications (docs/kernels/deepep.md, "A2 low latency"): windowsOut and the
workspace are GM tensors of their own (scratch), not HCCL's windowsOut; GetArrivedTokenInfo's
three 64 B reads per try are two polls taken in turn (the next token's flag, the end flag).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from npusim.kernels.common.align import align_up
from npusim.kernels.common.split import split_to_core
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep import reference as ref
from npusim.kernels.family import Arrays, Kernel, Misfit, Phase, TensorSpec, const
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.kernels.shape import MoeShape, OnShape
from npusim.runtime.conditions import AllEqual, AtLeast
from npusim.runtime.context import KernelContext
from npusim.runtime.poll import Poll
from npusim.runtime.rdma import AivRdma
from npusim.runtime.transfer import Strided

Wait = Generator[Any, Any, Any]
I16, I32, I64, U32, U64, F32 = np.int16, np.int32, np.int64, np.uint32, np.uint64, np.float32
MiB = 1 << 20

# the kernel's constants (moe_distribute_dispatch_v2_layered_custom.h)
STATE_OFFSET = 512
STATUS_SIZE_LAYERED = MiB
RDMA_BUFFER_ALIGN = 4096
SERVER_RANK_SIZE = 8
UB_32B_ALIGN = 32
EXP_TOKEN_COUNT_FLAG_CNT = 8
IPC_DATA_OFFSET = 4 * MiB
RDMA_DATA_SIZE = 800 * MiB
IPC_FLAG_OFFSET = MiB
IPC_TOKEN_CNT_OFFSET = 2 * MiB
IPC_MAGIC_OFFSET = IPC_TOKEN_CNT_OFFSET - 128 * 32
IPC_BUFF_ALIGN = 512
MAX_BS_NUM = 512
SHOULD_SEND_FLAG_VALUE = 0x0F0F0F0F
END_OF_WRITE_FLAG_VALUE = 0xFFFFFFFF
FLAG_SIZE = 64
EXTRA_TOKEN_INFO_NUM = 4
NOTIFY_DATA_SIZE = 400 * MiB
TBUF_SIZE = 190 * 1024
TBUF_TEMP_OFFSET = 8 * 1024
KERNEL = "moe_distribute_dispatch_v2_layered_custom.h"
# the layered combine's (moe_distribute_combine_v2_layered_custom.h): IPC_REDUCE_USED_CORE_NUM,
# and FLAG_TOTAL_SIZE uint64 words of token flags per server, in bytes
COMBINE_REDUCE_CORES = 32
COMBINE_FLAGS_PER_SERVER = MAX_BS_NUM * SERVER_RANK_SIZE * 4 * 8

RUNS = {"dispatch": ("low_latency_dispatch_layered",),
        "dispatch_combine": ("low_latency_dispatch_layered", "low_latency_combine_layered"),
        "combine": ("low_latency_combine_layered",)}


def win_size_min(shape: MoeShape) -> int:
    """Init's assert: moeExpertNum * BS * (H * sizeof(XType) + 4 * Align8(K) * 4) + IPC_DATA_OFFSET
    + RDMA_DATA_SIZE + NOTIFY_DATA_SIZE (the most a rank can receive, however unbalanced)."""
    align_k = align_up(shape.K, 8)
    return (shape.E * shape.BS * (shape.H * 2 + EXTRA_TOKEN_INFO_NUM * align_k * 4)
            + IPC_DATA_OFFSET + RDMA_DATA_SIZE + NOTIFY_DATA_SIZE)


@dataclass(frozen=True)
class LayeredWindow:
    """Where the kernel keeps things in a rank's window (windowsIn, HCCL_BUFFSIZE bytes)."""

    W: int
    L: int
    cores: int
    total_size: int  # winSize

    @property
    def server_num(self) -> int:
        return self.W // SERVER_RANK_SIZE

    @property
    def half_win(self) -> int:
        return RDMA_DATA_SIZE // 2

    @property
    def win_size(self) -> int:
        """WIN_SIZE: a half's token area, before its status MiB."""
        return self.half_win - STATUS_SIZE_LAYERED

    @property
    def buffer_chosen(self) -> int:
        return self.win_size + self.W * STATE_OFFSET

    @property
    def server_size_on_win(self) -> int:
        return self.win_size // self.server_num // RDMA_BUFFER_ALIGN * RDMA_BUFFER_ALIGN

    @property
    def rank_size_on_ipc(self) -> int:
        free = self.total_size - RDMA_DATA_SIZE - IPC_DATA_OFFSET - NOTIFY_DATA_SIZE
        return free // (self.L * self.W) // IPC_BUFF_ALIGN * IPC_BUFF_ALIGN

    def rdma_tokens(self, buf: int, server: int) -> int:
        return buf * self.half_win + server * self.server_size_on_win

    def rdma_status(self, buf: int, server: int) -> int:
        return buf * self.half_win + self.win_size + server * STATE_OFFSET

    def ipc(self, offset: int) -> int:
        """shareAddrs[i] + offset: the IPC area starts after the RDMA area."""
        return RDMA_DATA_SIZE + offset

    def ipc_data(self, le: int, src: int) -> int:
        return self.ipc(IPC_DATA_OFFSET) + (le * self.W + src) * self.rank_size_on_ipc

    @property
    def end(self) -> int:
        return self.ipc_data(self.L, 0)

    def regions(self, state: int = 0) -> dict[str, tuple[int, int]]:
        """The layered dispatch's and combine's areas (one layout for both kernels): per
        RDMA half its data and its status MiB (bufferChosen, the end flags, the combine's
        status and per-core toggles), then the IPC area's parts."""
        z = {}
        for b in (0, 1):
            z[f"rdma_data{b}"] = (self.rdma_tokens(b, 0), b * self.half_win + self.win_size)
            z[f"rdma_status{b}"] = (self.rdma_status(b, 0), (b + 1) * self.half_win)
        z["ipc_combine_flags"] = (self.ipc(0), self.ipc(IPC_FLAG_OFFSET))
        z["ipc_flags_magic"] = (self.ipc(IPC_FLAG_OFFSET), self.ipc(IPC_TOKEN_CNT_OFFSET))
        z["ipc_token_cnt"] = (self.ipc(IPC_TOKEN_CNT_OFFSET), self.ipc(IPC_DATA_OFFSET))
        z["ipc_data"] = (self.ipc(IPC_DATA_OFFSET),
                         max(self.end, self.total_size - NOTIFY_DATA_SIZE))
        return z


@dataclass(frozen=True)
class LayeredTiling(OnShape):
    """What the host hands one layered call; `v2` is the same call as the V2 kernels see
    it (its tensors' capacities and the reference's terms)."""

    shape: Any  # v2's shape (mc2's, with global_bs and the rows' capacity)
    v2: Mc2Tiling
    window: LayeredWindow
    quant: str  # bf16 | int8
    cores: int  # aivNum
    timing_only: bool

    @property
    def server_num(self) -> int:
        return self.W // SERVER_RANK_SIZE

    @property
    def global_bs(self) -> int:
        return self.shape.global_bs

    @property
    def out_dtype(self) -> np.dtype:
        return np.dtype(np.int8) if self.quant == "int8" else self.shape.np_dtype

    # ---- the token struct: | flag 32 B | token | expert ids | scale 32 B |
    @property
    def align_k(self) -> int:
        return align_up(self.shape.K, 8)

    @property
    def token_len(self) -> int:
        return self.shape.H * self.out_dtype.itemsize

    @property
    def exp_len(self) -> int:
        return self.align_k * 4

    @property
    def token_offset(self) -> int:
        return UB_32B_ALIGN

    @property
    def exp_offset(self) -> int:
        return self.token_offset + self.token_len

    @property
    def scale_offset(self) -> int:
        return self.exp_offset + self.exp_len

    @property
    def struct_len(self) -> int:
        return self.scale_offset + UB_32B_ALIGN

    # ---- ep_recv_count: E counts, then the combine's reduce info (byte offsets)
    @cached_property
    def combine_offsets(self) -> dict[str, int]:
        S, g, K, BS = self.server_num, self.global_bs, self.shape.K, self.shape.BS
        inner_cnt = self.shape.L * S * SERVER_RANK_SIZE * 4
        inner_idx = inner_cnt + g * S * 2
        outer_cnt = inner_idx + g * K * S * 4
        outer_idx = outer_cnt + BS * 4
        per_server = outer_idx + BS * S * 4
        return {"inner_cnt": inner_cnt, "inner_idx": inner_idx, "outer_cnt": outer_cnt,
                "outer_idx": outer_idx, "per_server": per_server,
                "end": per_server + BS * S * 4}

    @property
    def recv_count_ints(self) -> int:
        """deep_ep.cpp's recv_count_tensor_size: num_experts + 2 global_bs K server_num."""
        return self.shape.E + 2 * self.global_bs * self.shape.K * self.server_num

    @property
    def token_ub_size(self) -> int:
        """tokenUbSize_: TBUF_SIZE - TBUF_TEMP_OFFSET - the int16 expert ids."""
        ids = align_up(self.shape.BS * self.shape.K * 2, UB_32B_ALIGN)
        return TBUF_SIZE - TBUF_TEMP_OFFSET - ids


def tiling(shape: MoeShape, options: Mapping[str, Any], hardware: Any,
           timing_only: bool) -> LayeredTiling:
    v2 = ll.tiling(shape, {**options, "hccl_buffsize": 0}, hardware, timing_only)
    mb = options["hccl_buffsize"] or -(-win_size_min(shape) // MiB)
    win = LayeredWindow(shape.W, shape.L, hardware.chip.aiv_cores, mb * MiB)
    return LayeredTiling(v2.shape, v2, win, options["quant"], hardware.chip.aiv_cores, timing_only)


def misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any, op: str
           ) -> Misfit | None:
    """What the layered dispatch refuses beyond the A2 tiling's bounds."""
    if op not in RUNS:
        return Misfit("workload.op", f"{op}: get_dispatch_layout belongs to the normal mode; "
                      f"allowed with comm_alg hierarchy: {', '.join(RUNS)}")
    if hardware.rdma is None:
        return Misfit("hardware.rdma", f"{hardware.name}: the layered kernels post RDMA "
                      "WRITEs to the other servers; the preset has no RDMA NIC")
    need = win_size_min(shape)
    mb = options["hccl_buffsize"]
    if mb and mb * MiB < need:
        return Misfit("workload.hccl_buffsize", f"The HCCL_BUFFSIZE is {mb}MB, the min value "
                      f"should be {need // MiB}MB ({KERNEL} Init); allowed: at least "
                      f"{-(-need // MiB)}")
    return None


def tiling_misfit(t: LayeredTiling, shape: MoeShape, options: Mapping[str, Any],
                  hardware: Any, op: str) -> Misfit | None:
    """What the layered kernels refuse of their window and cores, from the run's tiling."""
    mb = options["hccl_buffsize"]
    if t.window.rank_size_on_ipc < t.shape.BS * t.struct_len:
        return Misfit("workload.hccl_buffsize", f"{mb}: the IPC area leaves "
                      f"{t.window.rank_size_on_ipc} B per (expert, source), less than BS "
                      f"token structs ({t.shape.BS * t.struct_len} B)")
    size = max(t.window.total_size, t.window.end)
    if size > hardware.window.bytes:
        return Misfit("hardware.window.bytes", f"{hardware.window.bytes} B cannot hold the "
                      f"HCCL_BUFFSIZE {t.window.total_size // MiB} MB window the layered "
                      f"kernel needs; allowed: at least {size}")
    if "combine" in op:
        flags_end = (t.server_num + 1) * COMBINE_FLAGS_PER_SERVER
        if t.cores < COMBINE_REDUCE_CORES + t.server_num or flags_end > IPC_FLAG_OFFSET:
            most = SERVER_RANK_SIZE * (IPC_FLAG_OFFSET // COMBINE_FLAGS_PER_SERVER - 1)
            return Misfit("workload.ep_world_size", f"{shape.W}: the layered combine needs "
                          f"{COMBINE_REDUCE_CORES} + serverNum AIV cores ({t.cores} here) "
                          "and its per-server token flags ((serverNum + 1) x 128 KiB) below "
                          f"the IPC flags at 1 MiB; allowed: at most {most}")
    if t.cores < 2 * t.server_num + 1 or t.cores < t.shape.L or t.cores < SERVER_RANK_SIZE:
        return Misfit("workload.ep_world_size", f"{shape.W}: {t.cores} AIV cores cannot give "
                      "every server a sender and a Win2Ipc core and every local expert an "
                      "Ipc2Out core")
    return None


# ---------------------------------------------------------------- the program
def layered_program(t: LayeredTiling):
    def program(ctx: KernelContext) -> Wait:
        S = t.server_num
        core = ctx.core_id
        with ctx.phase("init"):
            buf_id, magic = yield from init(ctx, t)
        with ctx.phase("reorder_tokens"):
            yield from reorder_tokens(ctx, t)
            yield from ctx.drain()
            yield from ctx.sync_all()
        server_id = ctx.rank_id // SERVER_RANK_SIZE
        if core < S:
            if core != server_id:
                with ctx.phase("send_data_to_server"):
                    yield from send_data_to_server(ctx, t, buf_id, core)
            with ctx.phase("reduce_info"):
                yield from create_inner_reduce_info(ctx, t, buf_id, core)
        elif core == S:
            with ctx.phase("reduce_info"):
                yield from create_outer_reduce_info(ctx, t)
        else:
            with ctx.phase("win2ipc"):
                yield from win2ipc(ctx, t, buf_id)
        with ctx.phase("ipc_sync"):
            yield from ctx.drain()
            yield from ctx.sync_all()
            yield from set_ipc_flag(ctx, t, magic)
            yield from wait_ipc_flag(ctx, t, magic)
            yield from ctx.drain()
            yield from ctx.sync_all()
        with ctx.phase("ipc2out"):
            yield from ipc2out(ctx, t)
            if core < S:
                yield from ctx.drain()
                yield from clean_up(ctx, t, buf_id)
            yield from ctx.drain()
            yield from ctx.sync_all()

    return program


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
    one = t.struct_len + (max(t.struct_len, H * item) - t.struct_len + 4 * H if quant else 0)
    per_ub = max(1, t.token_ub_size // one)
    rec = t.struct_len
    x, flags, out = ctx.tensor("x"), ctx.tensor("token_addr_flag_struct"), \
        ctx.tensor("windows_out")
    tok = start
    while tok < end:
        n = min(per_ub, end - tok)
        ctx.ub.reset()
        structs = ctx.alloc("token_struct", align_up(n * rec, 32))
        # the expert ids' padding and the scale lane hold whatever UB held; zeros here
        ctx.ub_write(structs, 0, np.zeros(n * rec, np.uint8), ops=0)
        if quant:
            src = ctx.alloc("token_in", align_up(n * H * item, 32))
            yield from ctx.wait(ctx.copy_in(src, x, tok * H * item, n * H * item,
                                            name="load_token"))
            yield from ctx.drain()
            quant_process(ctx, t, src, structs, n)
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


class _Arrivals:
    """GetSelfServerTokenInfo / GetArrivedTokenInfo: the tokens of one source server in
    their order, each as its struct's bytes (or only its expert ids)."""

    def __init__(self, ctx: KernelContext, t: LayeredTiling, buf_id: int, server: int) -> None:
        self.ctx, self.t, self.server = ctx, t, server
        self.own = server == ctx.rank_id // SERVER_RANK_SIZE
        self.base = t.window.rdma_tokens(buf_id, server)
        self.end_at = t.window.rdma_status(buf_id, server)
        self.flag = ctx.alloc("status", FLAG_SIZE)
        self.end_flag = ctx.alloc("end_status", FLAG_SIZE)
        self.self_idx = 0

    def next(self, token: int, just_exp: bool, into: Any) -> Wait:
        """The next token's bytes in `into` and True, or False when the server is done."""
        ctx, t = self.ctx, self.t
        rec = t.struct_len
        if self.own:
            flags = ctx.tensor("token_addr_flag_struct")
            while self.self_idx < t.shape.BS:
                i = self.self_idx
                self.self_idx += 1
                yield from ctx.wait(ctx.copy_in(self.flag, flags, i * FLAG_SIZE, FLAG_SIZE,
                                                name="send_token_info"))
                yield from ctx.drain()
                ctx.scalar(2)
                if int(ctx.ub_read(self.flag, U64, 1, ops=0)[0]) >> self.server & 1:
                    yield from self._copy(ctx.tensor("windows_out"), i * rec, just_exp, into)
                    return True
            return False
        win = ctx.window()
        at = self.base + token * rec
        polls = [Poll(win, at + rec, AllEqual(U64, SHOULD_SEND_FLAG_VALUE), self.flag, 8),
                 Poll(win, self.end_at, AllEqual(U64, END_OF_WRITE_FLAG_VALUE),
                      self.end_flag, 8)]
        which = yield from ctx.poll_round_robin(polls, 0, name="get_arrived_token_info")
        ctx.scalar(3)
        if which == 1:  # the end flag: this token is there if its own flag is
            yield from ctx.wait(ctx.copy_in(self.flag, win, at, FLAG_SIZE, name="token_flag"))
            yield from ctx.drain()
            if int(ctx.ub_read(self.flag, U64, 1, ops=1)[0]) != SHOULD_SEND_FLAG_VALUE:
                return False
        yield from self._copy(win, at, just_exp, into)
        return True

    def _copy(self, region: Any, at: int, just_exp: bool, into: Any) -> Wait:
        t = self.t
        if just_exp:
            op = self.ctx.copy_in(into, region, at + t.exp_offset, t.exp_len, name="token_exp")
        else:
            op = self.ctx.copy_in(into, region, at, t.struct_len, name="token_struct")
        yield from self.ctx.wait(op)
        yield from self.ctx.drain()


def inner_reduce_info(ids: np.ndarray, t: LayeredTiling, server_id: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """CreateInnerReduceInfo's arithmetic on the arrived tokens' expert ids [realBS, K]:
    (innerCnt, the inclusive cumsum of each token's hits in this server, tokens ordered by
    their first expert here; innerOffset, each hit's place in the combine's layout)."""
    L, K, g = t.shape.L, t.shape.K, t.global_bs
    per_server = SERVER_RANK_SIZE * L
    lo = server_id * per_server
    n = ids.shape[0]
    cnt = np.zeros(per_server, np.int64)
    lists: list[list[int]] = [[] for _ in range(per_server)]
    place = np.zeros((n, K), np.int64)
    for tok in range(n):
        for k in range(K):
            e = int(ids[tok, k])
            if lo <= e < lo + per_server:
                j = e % per_server
                place[tok, k] = cnt[j]
                cnt[j] += 1
                lists[j].append(tok)
    pre = cnt.copy()
    for j in range(per_server):
        if j % L:
            pre[j] += pre[j - 1]
    seen = np.zeros(n, bool)
    hits: list[int] = []
    offsets: list[int] = []
    for j in range(per_server):
        for tok in lists[j]:
            if seen[tok]:
                continue
            seen[tok] = True
            h = 0
            for k in range(K):
                e = int(ids[tok, k])
                if lo <= e < lo + per_server:
                    jj = e % per_server
                    base = 0 if jj % L == 0 else int(pre[jj - 1])
                    offsets.append(base + (jj // L) * g * K + int(place[tok, k]))
                    h += 1
            hits.append(h)
    return np.cumsum(np.array(hits, np.int64)), np.array(offsets, np.int64)


def create_inner_reduce_info(ctx: KernelContext, t: LayeredTiling, buf_id: int,
                             server: int) -> Wait:
    ctx.ub.reset()
    arrivals = _Arrivals(ctx, t, buf_id, server)
    exp_buf = ctx.alloc("local_ub", align_up(MAX_BS_NUM * t.exp_len, 32))
    ids: list[np.ndarray] = []
    while True:
        tok = len(ids)
        got = yield from arrivals.next(tok, True, exp_buf)
        yield from ctx.drain()
        if not got:
            break
        ids.append(exp_buf.bytes_at(0, 4 * t.shape.K).view(I32).copy())
    real = len(ids)
    g, K = t.global_bs, t.shape.K
    out = ctx.tensor("ep_recv_count")
    off = t.combine_offsets
    n_cnt = min(real + t.cores, g) if real else min(t.cores, g)
    cnt_buf = ctx.alloc("inner_cnt", align_up(2 * (real + t.cores), 32))
    cnt = np.zeros(real + t.cores, I16)
    if real:
        arr = np.array(ids, I32)
        ctx.scalar(6 * real * K + 2 * SERVER_RANK_SIZE * t.shape.L + 8 * real * K + 2 * real)
        c, o = inner_reduce_info(arr, t, ctx.rank_id // SERVER_RANK_SIZE)
        cnt[:len(c)] = c
    ctx.vector("duplicate", real + t.cores, I16, writes=[cnt_buf])
    yield from ctx.drain()
    ctx.ub_write(cnt_buf, 0, cnt, ops=0)
    yield from ctx.drain()
    yield from ctx.wait(ctx.copy_out(out, off["inner_cnt"] + g * server * 2, cnt_buf,
                                     2 * n_cnt, name="combine_inner_cnt"))
    if real:
        offs = np.zeros(real * K, I32)
        offs[:len(o)] = o
        idx_buf = ctx.alloc("inner_offset", align_up(4 * real * K, 32))
        ctx.ub_write(idx_buf, 0, offs, ops=0)
        yield from ctx.wait(ctx.copy_out(out, off["inner_idx"] + g * K * server * 4, idx_buf,
                                         4 * real * K, name="combine_inner_offset"))


def outer_reduce_info(ids: np.ndarray, t: LayeredTiling
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CreateOuterReduceInfo's arithmetic on the own tokens' expert ids [BS, K]: per token
    the inclusive cumsum of the servers it goes to (outerCnt), and per (token, server) in
    that order its place in the combine's layout and its hits there."""
    BS, K, S, E = t.shape.BS, t.shape.K, t.server_num, t.shape.E
    per_server = SERVER_RANK_SIZE * t.shape.L
    hits = np.zeros((BS, S), np.int64)
    low = np.full((BS, S), E, np.int64)
    acc = np.zeros(E, np.int64)
    idx = np.zeros((BS, S), np.int64)
    for tok in range(BS):
        for k in range(K):
            e = int(ids[tok, k])
            s = e // per_server
            hits[tok, s] += 1
            low[tok, s] = min(low[tok, s], e)
        for s in range(S):
            if low[tok, s] != E:
                idx[tok, s] = acc[low[tok, s]]
                acc[low[tok, s]] += hits[tok, s]
    acc = np.cumsum(acc)
    cnt = np.zeros(BS, np.int64)
    offsets: list[int] = []
    per: list[int] = []
    for tok in range(BS):
        for s in range(S):
            e = int(low[tok, s])
            if e == E:
                continue
            cnt[tok] += 1
            per.append(int(hits[tok, s]))
            pre_server = 0 if s == 0 else int(acc[s * per_server - 1])
            pre_token = 0 if e == 0 else int(acc[e - 1])
            offsets.append(pre_token - pre_server + int(idx[tok, s]) + s * BS * K)
    return np.cumsum(cnt), np.array(offsets, np.int64), np.array(per, np.int64)


def create_outer_reduce_info(ctx: KernelContext, t: LayeredTiling) -> Wait:
    ctx.ub.reset()
    BS, K, S = t.shape.BS, t.shape.K, t.server_num
    ids_buf = ctx.alloc("expert_ids", align_up(4 * BS * K, 32))
    yield from ctx.wait(ctx.copy_in(ids_buf, ctx.tensor("expert_ids"), 0, 4 * BS * K))
    ctx.vector("duplicate", 5 * BS * S + t.shape.E + BS, I32)
    yield from ctx.drain()
    ids = ctx.ub_read(ids_buf, I32, BS * K, ops=0).reshape(BS, K)
    ctx.scalar(8 * BS * K + 4 * BS * S + t.shape.E + 10 * BS * S + BS)
    cnt, offs, per = outer_reduce_info(ids, t)
    off, out = t.combine_offsets, ctx.tensor("ep_recv_count")
    for name, key, values, n in (("combine_outer_cnt", "outer_cnt", cnt, BS),
                                 ("combine_outer_offset", "outer_idx", offs, BS * S),
                                 ("combine_outer_cnt_per_server", "per_server", per, BS * S)):
        buf = ctx.alloc(name, align_up(4 * n, 32))
        full = np.zeros(n, I32)
        full[:len(values)] = values
        ctx.ub_write(buf, 0, full, ops=0)
        yield from ctx.drain()
        yield from ctx.wait(ctx.copy_out(out, off[key], buf, 4 * n, name=name))


def win2ipc(ctx: KernelContext, t: LayeredTiling, buf_id: int) -> Wait:
    S, L, W = t.server_num, t.shape.L, t.W
    cps = (t.cores - S - 1) // S  # coresPerServer
    logic = ctx.core_id - S - 1
    if logic >= cps * S:
        return
    from_server = logic // cps
    server_id = ctx.rank_id // SERVER_RANK_SIZE
    lr = ctx.rank_id % SERVER_RANK_SIZE
    per_server = SERVER_RANK_SIZE * L
    exp_start = server_id * per_server
    ctx.ub.reset()
    counts = np.zeros(per_server, np.int64)
    cnt_buf = ctx.alloc("token_num_per_exp", per_server * EXP_TOKEN_COUNT_FLAG_CNT * 4)
    ctx.vector("duplicate", per_server * EXP_TOKEN_COUNT_FLAG_CNT, I32, writes=[cnt_buf])
    one = ctx.alloc("local_ub", align_up(t.struct_len, IPC_BUFF_ALIGN))
    arrivals = _Arrivals(ctx, t, buf_id, from_server)
    w = t.window
    tok = 0
    while True:
        just_exp = tok % cps != logic % cps
        got = yield from arrivals.next(tok, just_exp, one)
        if not got:
            break
        ids = one.bytes_at(0 if just_exp else t.exp_offset, 4 * t.shape.K).view(I32)
        for k in range(t.shape.K):
            ctx.loop(1)
            ctx.scalar(3)
            e = int(ids[k])
            if not exp_start <= e < exp_start + per_server:
                continue
            j = e % per_server
            slot = int(counts[j])
            counts[j] += 1
            if just_exp:
                continue
            ctx.scalar(6)
            target = server_id * SERVER_RANK_SIZE + j // L
            at = w.ipc_data(e % L, from_server * SERVER_RANK_SIZE + lr) + slot * t.struct_len
            yield from ctx.drain()
            yield from ctx.wait(ctx.put(target, at, one, t.struct_len, name="win2ipc"))
            yield from ctx.drain()
        tok += 1
    flat = np.zeros((per_server, EXP_TOKEN_COUNT_FLAG_CNT), I32)
    flat[:, 0] = counts
    yield from ctx.drain()
    ctx.ub_write(cnt_buf, 0, flat.ravel(), ops=0)
    batches = -(-per_server // cps)
    for b in range(batches):
        e = exp_start + b * cps + logic % cps
        if e >= exp_start + per_server:
            break
        ctx.scalar(6)
        j = e % per_server
        target = server_id * SERVER_RANK_SIZE + j // L
        at = (w.ipc(IPC_TOKEN_CNT_OFFSET) + ((e % L) * W + from_server * SERVER_RANK_SIZE + lr)
              * UB_32B_ALIGN)
        yield from ctx.drain()
        yield from ctx.wait(ctx.put(target, at, cnt_buf, UB_32B_ALIGN, src_offset=j * 32,
                                    name="win2ipc_count"))
        yield from ctx.drain()


def set_ipc_flag(ctx: KernelContext, t: LayeredTiling, magic: int) -> Wait:
    if ctx.core_id >= SERVER_RANK_SIZE:
        return
    buf = ctx.alloc("ipc_flag", UB_32B_ALIGN)
    ctx.ub_write(buf, 0, np.array([magic, 0, 0, 0], U64))  # the rest: whatever UB held
    target = ctx.rank_id // SERVER_RANK_SIZE * SERVER_RANK_SIZE + ctx.core_id
    at = t.window.ipc(IPC_FLAG_OFFSET) + ctx.rank_id % SERVER_RANK_SIZE * UB_32B_ALIGN
    yield from ctx.wait(ctx.put(target, at, buf, UB_32B_ALIGN, name="set_ipc_flag"))
    yield from ctx.drain()


def wait_ipc_flag(ctx: KernelContext, t: LayeredTiling, magic: int) -> Wait:
    if ctx.core_id >= SERVER_RANK_SIZE:
        return
    buf = ctx.alloc("ipc_wait", UB_32B_ALIGN)
    at = t.window.ipc(IPC_FLAG_OFFSET) + ctx.core_id * UB_32B_ALIGN
    yield from ctx.wait_until(ctx.window(), at, UB_32B_ALIGN,
                              AtLeast(U64, magic, stride=UB_32B_ALIGN), buf,
                              name="wait_ipc_flag")


def ipc2out(ctx: KernelContext, t: LayeredTiling) -> Wait:
    L, W, rec, H = t.shape.L, t.W, t.struct_len, t.shape.H
    cpe = t.cores // L  # coresPerExp
    if ctx.core_id >= cpe * L:
        return
    ctx.ub.reset()
    w, win = t.window, ctx.window()
    cur, local = ctx.core_id // cpe, ctx.core_id % cpe
    per, rem = W // cpe, W % cpe
    mine = per + (1 if local < rem else 0)
    first = cur * W + local * per + min(local, rem)
    cnt_ub = ctx.alloc("token_cnt", align_up(L * W * UB_32B_ALIGN, 32))
    yield from ctx.wait(ctx.copy_in(cnt_ub, win, w.ipc(IPC_TOKEN_CNT_OFFSET),
                                    L * W * UB_32B_ALIGN, name="token_cnt"))
    yield from ctx.drain()
    raw = ctx.ub_read(cnt_ub, I32, L * W * EXP_TOKEN_COUNT_FLAG_CNT, ops=0)[::8]
    ctx.scalar(2 * L * W + 3 * L)
    cum = np.cumsum(raw.astype(np.int64))
    per_exp = np.array([cum[(i + 1) * W - 1] - (cum[i * W - 1] if i else 0) for i in range(L)],
                       np.int64)
    item = t.out_dtype.itemsize
    stage = ctx.alloc("local_ub", t.token_ub_size)
    in_ub = max(1, t.token_ub_size // rec)
    rows = ctx.tensor("expand_x")
    total = int(cum[first - 1]) if first else 0
    for sr in range(first, first + mine):
        ctx.loop(1)
        n = int(cum[sr] - (cum[sr - 1] if sr else 0))
        if n == 0:
            continue
        le, src = sr // W, sr % W
        for b in range(-(-n // in_ub)):
            m = min(in_ub, n - b * in_ub)
            yield from ctx.wait(ctx.copy_in(stage, win, w.ipc_data(le, src) + b * in_ub * rec,
                                            m * rec, name="ipc_tokens"))
            row = total + b * in_ub
            ops = [ctx.copy_out(rows, row * H * item, stage, m * H * item,
                                src_offset=t.token_offset, name="expand_x",
                                strided=Strided(m, H * item, rec - H * item, 0))]
            if t.quant == "int8":
                ops.append(ctx.copy_out(ctx.tensor("dynamic_scales"), 4 * row, stage, 4 * m,
                                        src_offset=t.scale_offset, name="dynamic_scales",
                                        strided=Strided(m, 4, rec - 4, 0)))
            yield from ctx.wait(*ops)
        total += n
    if ctx.core_id == 0:
        cnt_out = ctx.alloc("ep_recv_counts", align_up(4 * L * W, 32))
        ctx.ub_write(cnt_out, 0, cum.astype(I32), ops=0)
        nums = ctx.alloc("expert_token_nums", align_up(8 * L, 32))
        ctx.ub_write(nums, 0, per_exp.astype(I64), ops=0)
        yield from ctx.wait(ctx.copy_out(ctx.tensor("ep_recv_count"), 0, cnt_out, 4 * L * W,
                                         name="ep_recv_count"),
                            ctx.copy_out(ctx.tensor("expert_token_nums"), 0, nums, 8 * L,
                                         name="expert_token_nums"))


def clean_up(ctx: KernelContext, t: LayeredTiling, buf_id: int) -> Wait:
    """Core 0 flips bufferChosen; core serverNum - 1 clears the end flags; core s clears
    the token flags of server s's area."""
    ctx.ub.reset()
    win, w = ctx.window(), t.window
    if ctx.core_id == 0:
        ctx.gm_write_scalar(win, w.buffer_chosen, buf_id ^ 1, U32)
        ctx.dcache.dcci_line(win, w.buffer_chosen)
    size = max(MAX_BS_NUM * FLAG_SIZE, t.server_num * STATE_OFFSET)
    zero = ctx.alloc("clean_temp", size)
    ctx.vector("duplicate", size // 4, I32, writes=[zero])
    yield from ctx.drain()
    ops = []
    if ctx.core_id == t.server_num - 1:
        at = w.rdma_status(buf_id, 0)
        win.release(at, t.server_num * STATE_OFFSET)
        ops.append(ctx.copy_out(win, at, zero, t.server_num * STATE_OFFSET, name="clean_status"))
    at = w.rdma_tokens(buf_id, ctx.core_id)
    span = MAX_BS_NUM * t.struct_len
    win.release(at, span)
    ops.append(ctx.copy_out(win, at, zero, MAX_BS_NUM * UB_32B_ALIGN, name="clean_flags",
                            strided=Strided(MAX_BS_NUM, UB_32B_ALIGN, 0,
                                            t.struct_len - UB_32B_ALIGN)))
    yield from ctx.wait(*ops)


# ---------------------------------------------------------------- the kernel
def _rows(t: LayeredTiling, r: int) -> int:
    return t.shape.rows_capacity(r)


class LayeredDispatch(Kernel):
    """MoeDistributeDispatchV2Layered under DeepEP's names (packed_recv_x, ...)."""

    name = RUNS["dispatch"][0]
    variant = "quant"
    engines = ("rdma",)
    phases = (
        Phase("init", "every core: bufferChosen, its magic; core 0 the end flag"),
        Phase("reorder_tokens", "every core: its tokens as structs into windowsOut, the "
              "servers each goes to"),
        Phase("send_data_to_server", "core s < serverNum, s another server: an RDMA WRITE "
              "per token to the same-plane rank there, then the end flag"),
        Phase("reduce_info", "cores 0..serverNum: the combine's reduce info (the senders wait "
              "for their server's tokens)"),
        Phase("win2ipc", "the other cores, per source server: each arrived token to the IPC "
              "area of its experts' ranks (HCCS), then the counts"),
        Phase("ipc_sync", "cores 0..7: the magic to each local rank, then wait for theirs"),
        Phase("ipc2out", "cores per local expert: its (expert, source) blocks to expand_x; "
              "core 0 the counts; cores < serverNum CleanUp"),
    )
    inputs = (TensorSpec("x", lambda t: t.shape.np_dtype, lambda t, r: (t.shape.BS, t.shape.H),
                         "[BS, H] tokens"),
              TensorSpec("topk_idx", const(I32), lambda t, r: (t.shape.BS, t.shape.K),
                         "[BS, K] expert ids (topk_idx.int())", gm="expert_ids"))
    outputs = (TensorSpec("packed_recv_x", lambda t: t.out_dtype,
                          lambda t, r: (_rows(t, r), t.shape.H),
                          "[A, H] received rows by (local expert, source rank, token)",
                          gm="expand_x"),
               TensorSpec("packed_recv_x_scales", const(F32), lambda t, r: (_rows(t, r),),
                          "[A] INT8 scales", gm="dynamic_scales"),
               TensorSpec("packed_recv_count", const(I64), lambda t, r: (t.shape.L,),
                          "[L] rows per local expert", gm="expert_token_nums"),
               TensorSpec("layout_range", const(I32), lambda t, r: (t.recv_count_ints,),
                          "[E + 2 global_bs K serverNum] the cumsum over (local expert, "
                          "source), then the combine's reduce info", gm="ep_recv_count"))
    scratch = (TensorSpec("windows_out", const(np.uint8), lambda t, r: (t.shape.BS * t.struct_len,),
                          "the token structs (HCCL's windowsOut)"),
               TensorSpec("send_status", const(np.uint8), lambda t, r: (FLAG_SIZE,),
                          "the end-of-write flag (windowsOut + WIN_SIZE)"),
               TensorSpec("token_addr_flag_struct", const(np.uint8),
                          lambda t, r: (t.shape.BS * FLAG_SIZE,),
                          "per token the servers it goes to (workspace)"))

    def program(self, tiling: LayeredTiling) -> Any:
        return layered_program(tiling)

    def timing_fields(self, tiling: LayeredTiling, run: Any, cores: Any) -> dict[str, Any]:
        return ll.bandwidth_fields([tiling.shape.BS * tiling.shape.K] * tiling.W,
                                   ll.token_bytes(tiling.shape.H, tiling.quant),
                                   run.end_ns - run.start_ns)


DISPATCH = LayeredDispatch()


def op_inputs(kernel: str, t: LayeredTiling, inputs: list[Arrays],
              previous: list[Arrays] | None) -> list[Arrays]:
    """The dispatch: x and topk_idx. The combine: the experts' outputs are the received
    rows (INT8 ones dequantised, fp32(q) * scale to BF16), with the dispatch's layout_range:
    the simulated dispatch's, or the references' (mc2's V2 dispatch for the rows and
    counts, the family's for the reduce info)."""
    ids = [a["topk_idx"].astype(I32) for a in inputs]
    if kernel == DISPATCH.name:
        return [{"x": a["x"], "topk_idx": i} for a, i in zip(inputs, ids, strict=True)]
    if previous is None:
        previous = reference_dispatch(t, inputs)
    dt = t.shape.np_dtype
    res = []
    for a, i, d in zip(inputs, ids, previous, strict=True):
        rows = d["packed_recv_x"]
        if t.quant == "int8":  # the valid rows only: the rest stays untouched zero pages
            n = int(d["layout_range"][t.shape.E - 1])
            q = rows
            rows = np.zeros(q.shape, dt)
            rows[:n] = (q[:n].astype(F32) * d["packed_recv_x_scales"][:n, None]).astype(dt)
        res.append({"x": rows, "topk_idx": i, "topk_weights": a["topk_weights"],
                    "layout_range": d["layout_range"]})
    return res


def reference_dispatch(t: LayeredTiling, inputs: list[Arrays]) -> list[Arrays]:
    """The layered dispatch's outputs by the references: mc2's V2 dispatch for the rows,
    scales and counts (the same rows in the same order), the family's for the reduce
    info."""
    got = ll.reference_outputs(ll.DISPATCH.name, t.v2, inputs)
    assert got is not None
    idxs = [a["topk_idx"] for a in inputs]
    out = []
    for r, d in enumerate(got):
        lr = ref.layered_reduce_info(idxs, r, t.shape.L, t.global_bs, t.cores)
        lr[:t.shape.E] = d["layout_range"]
        out.append({s.name: d[s.name] for s in DISPATCH.outputs if s.name in d}
                   | {"layout_range": lr})
    return out


def next_reads(t: LayeredTiling, outputs: list[Arrays]) -> bytes:
    """A digest of what the combine reads of the dispatch: its received rows (and INT8
    scales) and layout_range."""
    h = hashlib.sha256()
    for o in outputs:
        n = int(o["layout_range"][t.shape.E - 1])
        h.update(np.ascontiguousarray(o["packed_recv_x"][:n]).tobytes())
        if t.quant == "int8":
            h.update(np.ascontiguousarray(o["packed_recv_x_scales"][:n]).tobytes())
        h.update(np.ascontiguousarray(o["layout_range"], I32).tobytes())
    return h.digest()
