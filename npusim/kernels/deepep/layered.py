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

This module holds the program and the kernel; the steps live in layered_send (Init,
ReorderTokens, SendDataToServer), layered_reduce_info, layered_ipc (Win2Ipc to CleanUp),
the window layout in layered_layout, the tiling in layered_tiling.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from npusim.kernels.deepep import layered_combine, layered_misfit, layered_tiling
from npusim.kernels.deepep import low_latency as ll
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.common import platform
from npusim.kernels.deepep.layered_ipc import (
    clean_up,
    ipc2out,
    set_ipc_flag,
    wait_ipc_flag,
    win2ipc,
)
from npusim.kernels.deepep.layered_layout import FLAG_SIZE, RUNS, SERVER_RANK_SIZE
from npusim.kernels.deepep.layered_reduce_info import (
    create_inner_reduce_info,
    create_outer_reduce_info,
)
from npusim.kernels.deepep.layered_send import init, reorder_tokens, send_data_to_server
from npusim.kernels.deepep.layered_tiling import LayeredTiling
from npusim.kernels.deepep.low_latency import LowLatency
from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Call, Kernel, Phase, TensorSpec, const
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.workload.shape import MoeShape

I32, I64, F32 = np.int32, np.int64, np.float32


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

    def fields(self, call: Call) -> dict[str, Any]:
        t, run = call.tiling, call.run
        return ll.bandwidth_fields([t.shape.BS * t.shape.K] * t.W,
                                   ll.token_bytes(t.shape.H, t.quant), run.end_ns - run.start_ns)


DISPATCH = LayeredDispatch()


class Layered(LowLatency):
    """``mode: low_latency`` over 2+ A2 servers (``comm_alg: hierarchy``): the layered
    kernels, with the low-latency checks before their own."""

    help = ("DeepEP-Ascend's low-latency mode over 2+ A2 servers: "
            "MoeDistributeDispatchV2Layered / CombineV2Layered")
    ops = (DISPATCH, layered_combine.COMBINE)
    runs = RUNS

    def tiling(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> LayeredTiling:
        return layered_tiling.tiling(shape, options, hardware, timing_only)

    def misfit(self, shape: MoeShape, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        """The low-latency checks, the A2 past one server
        (MoeDistributeDispatchA2GetIsSingle, then CheckCommAlg), the layered kernel's."""
        bad = self.low_latency_misfit(shape, options, hardware)
        if bad is not None:
            return bad
        p = platform(hardware)
        if p != "a2" or ll.is_single_server(shape):
            return Misfit("workload.comm_alg", "hierarchy: the layered kernels run on an A2 "
                          f"with more than {ll.RANK_NUM_PER_NODE_A2} ranks (one server or the "
                          "A3: the V2 kernels); allowed here: fullmesh")
        bad = ll.misfit(shape, options, hardware, op, p, v2=False)
        return bad if bad is not None else layered_misfit.misfit(shape, options, hardware, op)

    def tiling_misfit(self, tiling: LayeredTiling, shape: MoeShape, options: Mapping[str, Any],
                      hardware: Any, op: str) -> Misfit | None:
        return layered_misfit.tiling_misfit(tiling, shape, options, hardware, op)

    def op_inputs(self, kernel: str, tiling: LayeredTiling, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        """The dispatch: x and topk_idx. The combine: the experts' outputs are the received
        rows (INT8 ones dequantised, fp32(q) * scale to BF16), with the dispatch's
        layout_range: the simulated dispatch's, or the references' (mc2's V2 dispatch for
        the rows and counts, the family's for the reduce info)."""
        t = tiling
        ids = [a["topk_idx"].astype(I32) for a in inputs]
        if kernel == DISPATCH.name:
            return [{"x": a["x"], "topk_idx": i} for a, i in zip(inputs, ids, strict=True)]
        if previous is None:
            previous = self.reference_dispatch(t, inputs)
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

    def reference_outputs(self, kernel: str, tiling: LayeredTiling, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        return self.reference_dispatch(tiling, inputs) if kernel == DISPATCH.name else None

    def reference_dispatch(self, tiling: LayeredTiling, inputs: list[Arrays]) -> list[Arrays]:
        """The layered dispatch's outputs by the references: mc2's V2 dispatch for the rows,
        scales and counts (the same rows in the same order), the family's for the reduce
        info."""
        t = tiling
        got = super().reference_outputs(ll.DISPATCH.name, t.v2, inputs)
        assert got is not None
        idxs = [a["topk_idx"] for a in inputs]
        out = []
        for r, d in enumerate(got):
            lr = ref.layered_reduce_info(idxs, r, t.shape.L, t.global_bs, t.cores)
            lr[:t.shape.E] = d["layout_range"]
            out.append({s.name: d[s.name] for s in DISPATCH.outputs if s.name in d}
                       | {"layout_range": lr})
        return out

    def next_reads(self, kernel: str, tiling: LayeredTiling, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        """A digest of what the combine reads of the dispatch: its received rows (and INT8
        scales) and layout_range."""
        h = hashlib.sha256()
        for o in outputs:
            n = int(o["layout_range"][tiling.shape.E - 1])
            h.update(np.ascontiguousarray(o["packed_recv_x"][:n]).tobytes())
            if tiling.quant == "int8":
                h.update(np.ascontiguousarray(o["packed_recv_x_scales"][:n]).tobytes())
            h.update(np.ascontiguousarray(o["layout_range"], I32).tobytes())
        return h.digest()


LAYERED = Layered()
