"""The pyPTO combine (LOOPs send, receive of the cann-recipes-infer article
"NPU DeepSeek SHMEM通信优化实践") as tile tasks of a MIX launch.

- send: task per received row: the triple (GetTensorData x 3), ShmemPut of the expandX
  row to combine data row K * tokenId + kOffset on rankId, then ShmemSignal(ADD 1) on
  the token's signal there.
- receive: per token (tokens round robin over the blocks): WaitUntil(signal == topK) on
  the AICPU; the block's two AIVs each ShmemGet half of the K rows ([K/2, H] is the
  seed's Cast tile) and Cast them to fp32 into GM; the AIC runs the Matmul
  expertScales [1, K] x rows [K, H] in N tiles of nTileShape columns (GM -> L1 -> L0A /
  L0B, the cube, FixPipe fp32 to GM); AIV0 Casts the sum to bf16 and Assembles it into
  the output. The hand-overs between them are task dependencies the scheduling AICPU
  resolves (the completion, the successor's release, its dispatch): no flags between
  the cores.

Root functions (scheduler.py): one per send row (M, the rows this rank received), then one
per token. No receive task waits for a send task of its own rank: its predecessor is the
WaitUntil on the token's signal, which the other ranks' sends raise.

The cube takes the fp32 Matmul at the fp16 MAC rate per byte of K (K0 = 8 fp32 elements a
fractal): the preset has no fp32 cube rate; this is npusim's assumption.
"""

from __future__ import annotations

import numpy as np

from npusim.kernels.pypto_shmem.scheduler import Scheduler, Wait
from npusim.kernels.pypto_shmem.tiling import BF16, BLOCK, INFO, PyptoTiling
from npusim.runtime.conditions import AllEqual
from npusim.runtime.context import KernelContext, Strided
from npusim.runtime.cube import fractals
from npusim.units import ceil_div

I32, F32 = np.int32, np.float32
PHASES = ("send", "receive")
FRACTAL_MACS = 16 * 16 * 8  # one fp32 fractal: 16 x 16 x K0 (32 B of fp32)


def combine_program(t: PyptoTiling):
    sched = Scheduler(t.stitch, 3 * t.block_dim)  # every core of the MIX launch

    def program(ctx: KernelContext) -> Wait:
        yield from combine(ctx, t, sched)

    return program


def halves(K: int, sub: int) -> range:
    """The Cast tile of AIV `sub`: rows [0, ceil(K/2)) or the rest."""
    h = ceil_div(K, 2)
    return range(0, h) if sub == 0 else range(h, K)


def combine(ctx: KernelContext, t: PyptoTiling, sched: Scheduler) -> Wait:
    s = t.shape
    aic = ctx.core.kind.name == "aic"
    M = int(ctx.tensor("recv_counts").read(4 * (t.E - 1), 4).view(I32)[0])  # the host's
    with ctx.phase("send"):
        if not aic:
            yield from send(ctx, t, sched, M)
    with ctx.phase("receive"):
        bufs = CubeBufs(ctx, t) if aic else None
        for token in range(ctx.block_idx, s.BS, t.block_dim):
            if aic:
                yield from matmul(ctx, t, sched, M + token, token, bufs)
            else:
                yield from gather_cast(ctx, t, sched, M + token, token)
    yield from sched.close(ctx, M + s.BS)


class CubeBufs:
    """The AIC's L1 / L0 buffers of one N tile."""

    def __init__(self, ctx: KernelContext, t: PyptoTiling) -> None:
        kt, nt = t.k_tile, t.n_tile
        self.a1 = ctx.alloc("scales_l1", 4 * kt, buffer="l1")
        self.b1 = ctx.alloc("rows_l1", 4 * kt * nt, buffer="l1")
        self.a0 = ctx.alloc("scales_l0a", 4 * 16 * kt, buffer="l0a")
        self.b0 = ctx.alloc("rows_l0b", 4 * kt * nt, buffer="l0b")
        self.c0 = ctx.alloc("sum_l0c", 4 * 16 * nt, buffer="l0c")


def send(ctx: KernelContext, t: PyptoTiling, sched: Scheduler, M: int) -> Wait:
    s, win = t.shape, t.window
    row_buf = ctx.alloc("expandXTile", s.token_bytes)
    sig = ctx.alloc("signal", BLOCK)
    assist = ctx.tensor("assist_info_for_combine")
    for row in range(ctx.kind_index, M, t.aiv_num):
        yield from sched.start(ctx, row)
        rank, token, k = (int(ctx.gm_read_scalar(assist, 4 * (INFO * row + f), I32))
                          for f in range(INFO))
        ctx.scalar(3)  # topK * tokenId + kOffset, the views
        put = yield from ctx.shmem.mte_put_nbi(rank, win.combine_row(s.K * token + k),
                                               ctx.tensor("expand_x"), row * s.token_bytes,
                                               s.token_bytes, row_buf, s.token_bytes,
                                               name="ShmemPut")
        yield from ctx.wait(put)  # ShmemSignal depends on the put
        ctx.ub_write(sig, 0, np.array([1, 0, 0, 0, 0, 0, 0, 0], I32), ops=1)
        ctx.set_atomic_add(I32)
        ctx.shmem.put_ub(rank, win.combine_sig(token), sig, 4, name="ShmemSignal add")
        ctx.set_atomic_none()
        yield from ctx.drain()
        sched.finish(ctx, ("send", row), row)


def gather_cast(ctx: KernelContext, t: PyptoTiling, sched: Scheduler, root: int, token: int
                ) -> Wait:
    """AIV side of one token: WaitUntil, ShmemGet + Cast of its half of the rows to the
    fp32 workspace (a task, released by the WaitUntil), then on AIV0 the bf16 Cast of the
    sum and Assemble (a task, released by the Matmul)."""
    s, win, H = t.shape, t.window, t.shape.H
    rows = halves(s.K, ctx.sub_block_idx)
    n = len(rows)
    yield from sched.start(ctx, root, dispatch=False)
    ctx.ub.reset()  # a new task: its own UB tiles
    raw = ctx.alloc("shmemGetOut", max(n * s.token_bytes, BLOCK))
    f32 = ctx.alloc("shmemGetOutFp32", max(4 * n * H, BLOCK))
    yield from sched.wait_until(ctx, ctx.window(), win.combine_sig(token),
                                AllEqual(I32, s.K))
    work = ctx.tensor("rows_fp32")
    if n:
        load = ctx.copy_in(raw, ctx.window(), win.combine_row(s.K * token + rows[0]),
                           n * s.token_bytes, name="ShmemGet")
        yield from ctx.wait(load)

        def cast() -> None:
            f32.view(F32, n * H)[:] = raw.view(BF16, n * H).astype(F32)

        ctx.vector("Cast fp32", n * H, F32, reads=(raw,), writes=(f32,), fn=cast)
        yield from ctx.pipe_barrier("vector")
        ctx.copy_out(work, 4 * H * (s.K * token + rows[0]), f32, 4 * n * H)
    yield from ctx.drain()
    sched.finish(ctx, ("gather", token, ctx.sub_block_idx), root, [(("matmul", token), root)])
    if ctx.sub_block_idx:
        return
    yield from sched.start(ctx, root, ("cast", token), [("matmul", token)])
    ctx.ub.reset()  # the next task's tiles
    acc = ctx.alloc("matmulOutFp32", 4 * H)
    out = ctx.alloc("matmulOutFp16", s.token_bytes)
    load = ctx.copy_in(acc, ctx.tensor("sum_fp32"), 4 * H * token, 4 * H)
    yield from ctx.wait(load)

    def cast_bf16() -> None:
        out.view(BF16, H)[:] = acc.view(F32, H).astype(BF16)

    ctx.vector("Cast bf16", H, F32, reads=(acc,), writes=(out,), fn=cast_bf16)
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(ctx.tensor("out"), token * s.token_bytes, out, s.token_bytes,
                 name="Assemble")
    yield from ctx.drain()
    sched.finish(ctx, ("cast", token), root)


def matmul(ctx: KernelContext, t: PyptoTiling, sched: Scheduler, root: int, token: int,
           b: CubeBufs) -> Wait:
    """Matrix::Matmul(DT_FP32, expertScales[token] [1, K], rows [K, H]) in N tiles: a
    task released by both AIVs' gathers."""
    H, K = t.shape.H, t.shape.K
    nt = t.n_tile
    key = ("matmul", token)
    yield from sched.start(ctx, root, key, [("gather", token, 0), ("gather", token, 1)])
    aic = ctx.cfg.aic
    a1, b1, a0, b0, c0 = b.a1, b.b1, b.a0, b.b0, b.c0
    load = ctx.copy_in(a1, ctx.tensor("expert_scales"), 4 * K * token, 4 * K)
    yield from ctx.wait(load)
    work = ctx.tensor("rows_fp32")
    for n0 in range(0, H, nt):
        n = min(nt, H - n0)
        load = ctx.copy_in(b1, work, 4 * (K * token * H + n0), 4 * K * n,
                           strided=Strided(K, 4 * n, 4 * (H - n), 0), name="rows gm->l1")
        yield from ctx.wait(load)
        ctx.load_data(a0, a1, 4 * K)
        ctx.load_data(b0, b1, 4 * K * n)
        yield from ctx.pipe_barrier("mte1")
        cycles = aic.cube_issue_cycles + fractals(1, n, K, 4) * FRACTAL_MACS \
            / aic.cube_fp16_macs_per_cycle

        def mm(n: int = n) -> None:
            a = a0.view(F32, K)
            b = b0.view(F32, K * n).reshape(K, n)
            c0.view(F32, n)[:] = (a @ b).astype(F32)

        ctx.fixed("cube", "Matmul fp32", cycles * ctx.cycle_ns, (a0, b0), (c0,), mm)
        yield from ctx.pipe_barrier("cube")
        ctx.fixpipe(ctx.tensor("sum_fp32"), c0, 1, n, "float32", dst_offset=4 * (H * token + n0))
        yield from ctx.pipe_barrier("fixpipe")
    yield from ctx.drain()
    sched.finish(ctx, key, root, [(("cast", token), root)])
