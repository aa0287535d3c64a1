"""RunFirstProjection and RunSecondProjection (shmem_mega_moe_catlass_pipeline.h): the
AIC's Catlass MmadMx tiles and AIV0's side of each.

An AIC tile is BlockMmadTla over L1 tiles of K = 256 and L0 tiles of K = 128: per L1 K
step MTE2 loads A (rows x 256 FP8, E8M0 per 32) and B (256 x columns) into L1, double
buffered; per L0 K step MTE1 moves the chunk into L0A/L0B (ping-pong) and the cube's MX
mmad accumulates into L0C (fp32); FixPipe writes the tile as bf16 into AIV0's UB. GEMM1
(tile 256 x 256 over (m, F/2), the gate and then the up columns, one pair in flight)
waits for each 256-row wave's input_ready; GEMM2 (128 x 256 over (m, H), K = F/2) waits
once for activation_ready == GEMM1's tile count and ping-pongs two UB outputs (flag ids
4 + b, 6 + b), the AIC blocking once two tiles are outstanding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from npusim.kernels.mega_moe import mx
from npusim.kernels.mega_moe import sync as hw
from npusim.kernels.mega_moe.tiling import (
    L0_K,
    META,
    TILE_K,
    TILE_M1,
    TILE_M2,
    TILE_N,
    MegaTiling,
    swizzle,
)
from npusim.kernels.quant import fp8_format, mx_quantize_bf16
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import ceil_div

CHUNKS = TILE_K // L0_K


def tiles(t: MegaTiling, b: int, m_loops: int, n_loops: int, start: int
          ) -> list[tuple[int, int]]:
    """This block's tiles: from (b - start) mod AIC, every AIC-th of the swizzled order."""
    first = b + t.block_dim - start if b < start else b - start
    return [swizzle(i, m_loops, n_loops) for i in range(first, m_loops * n_loops, t.block_dim)]


def block_tiles(t: MegaTiling, b: int, st: Any, m: int, tile_m: int, n: int
                ) -> Iterator[tuple[int, int, int, int]]:
    """Block b's tiles of an [m, n] output in tile_m x TILE_N tiles, as (mi, ni, rows,
    cols); once walked, the next walk starts where this one ended (st.start_block): the
    projections hand the tiles on over the AICs."""
    m_loops, n_loops = ceil_div(m, tile_m), ceil_div(n, TILE_N)
    for mi, ni in tiles(t, b, m_loops, n_loops, st.start_block):
        yield mi, ni, min(tile_m, m - mi * tile_m), min(TILE_N, n - ni * TILE_N)
    st.start_block = (st.start_block + m_loops * n_loops) % t.block_dim


class BlockMmad:
    """One AIC's L1 / L0 buffers and its MmadMx over them (Catlass BlockMmadTla)."""

    def __init__(self, ctx: KernelContext, rows: int, mode: str) -> None:
        self.dtype = fp8_format(mode)[0].name
        self.a = [[ctx.alloc(f"l1_a{p}{c}", rows * L0_K, "l1") for c in range(CHUNKS)]
                  for p in range(2)]
        self.sa = [[ctx.alloc(f"l1_sa{p}{c}", rows * L0_K // 32, "l1") for c in range(CHUNKS)]
                   for p in range(2)]
        self.b = [[ctx.alloc(f"l1_b{p}{c}", L0_K * TILE_N, "l1") for c in range(CHUNKS)]
                  for p in range(2)]
        self.sb = [[ctx.alloc(f"l1_sb{p}{c}", L0_K // 32 * TILE_N, "l1") for c in range(CHUNKS)]
                   for p in range(2)]
        self.l0a = [ctx.alloc(f"l0a{i}", rows * L0_K, "l0a") for i in range(2)]
        self.l0b = [ctx.alloc(f"l0b{i}", L0_K * TILE_N, "l0b") for i in range(2)]
        self.l0c = ctx.alloc("l0c", rows * TILE_N * 4, "l0c")
        self.set_readers: list[Any] = [None, None]  # the last mmad reading L1 set p's scales
        self.l0_readers: list[Any] = [None, None]  # the mmad still reading L0A/B set i
        self.out: Any = None  # the FixPipe still reading L0C

    def __call__(self, ctx: KernelContext, a: tuple[Any, Any, int, int], rows: int,
                 b: tuple[Any, Any, int, int, int], cols: int, k_total: int) -> Wait:
        """L0C = A[rows, k_total] x B[k_total, cols] in MXFP8: a = (codes, scales, first
        row, row pitch) of A [M, K] in GM; b = (codes, scales, first K row, first column,
        row pitch) of B [K, N]; E8M0 scales per 32 of K ([M, K/32] and [K/32, N])."""
        if self.out is not None:
            yield from ctx.wait(self.out)  # FixPipe has read L0C
        steps = ceil_div(k_total, TILE_K)
        loads = []
        for p in range(min(2, steps)):
            yield from self._free(ctx, p)
            loads.append(self._load(ctx, p, a, rows, b, cols, p * TILE_K, k_total))
        chunk = 0
        for s in range(steps):
            p = s % 2
            yield from ctx.wait(*loads[s])
            kk = min(TILE_K, k_total - s * TILE_K)
            for c in range(ceil_div(kk, L0_K)):
                ck = min(L0_K, kk - c * L0_K)
                i = chunk % 2
                if self.l0_readers[i] is not None:
                    yield from ctx.wait(self.l0_readers[i])
                la = ctx.load_data(self.l0a[i], self.a[p][c], rows * ck, name="load_l0a")
                lb = ctx.load_data(self.l0b[i], self.b[p][c], ck * cols, name="load_l0b")
                yield from ctx.wait(la, lb)
                op = ctx.mmad(self.l0c, self.l0a[i], self.l0b[i], rows, cols, ck, self.dtype,
                              accumulate=chunk > 0, a_scale=self.sa[p][c],
                              b_scale=self.sb[p][c], name="mmad_mx")
                hw.compute(ctx, op)
                self.l0_readers[i] = self.set_readers[p] = op
                chunk += 1
            if s + 2 < steps:  # refill this L1 set with step s + 2
                yield from self._free(ctx, p)
                loads.append(self._load(ctx, p, a, rows, b, cols, (s + 2) * TILE_K, k_total))
        yield from ctx.wait(*[r for r in self.l0_readers if r is not None])

    def _free(self, ctx: KernelContext, p: int) -> Wait:
        """Wait for the mmad that last read L1 set p (its scales stay in L1)."""
        if self.set_readers[p] is not None:
            yield from ctx.wait(self.set_readers[p])

    def _load(self, ctx: KernelContext, p: int, a: tuple[Any, Any, int, int], rows: int,
              b: tuple[Any, Any, int, int, int], cols: int, k0: int, k_total: int) -> list[Any]:
        """MTE2 GM -> L1 of one L1 K step, chunk by chunk (A's rows x 128 codes and their
        4 scales per row; B's 128 rows of `cols` codes and their 4 scale rows)."""
        a_codes, a_scales, a_row, a_pitch = a
        b_codes, b_scales, b_k0, b_col, b_pitch = b
        kk = min(TILE_K, k_total - k0)
        ops = []
        for c in range(ceil_div(kk, L0_K)):
            c0 = k0 + c * L0_K
            ck = min(L0_K, k_total - c0)
            ops.append(hw.load_l1(ctx, self.a[p][c], a_codes, a_row * a_pitch + c0, 0,
                                  Strided(rows, ck, a_pitch - ck, 0)))
            sp = a_pitch // 32
            ops.append(hw.load_l1(ctx, self.sa[p][c], a_scales, a_row * sp + c0 // 32, 0,
                                  Strided(rows, ck // 32, sp - ck // 32, 0)))
            ops.append(hw.load_l1(ctx, self.b[p][c], b_codes, (b_k0 + c0) * b_pitch + b_col, 0,
                                  Strided(ck, cols, b_pitch - cols, 0)))
            ops.append(hw.load_l1(ctx, self.sb[p][c], b_scales,
                                  (b_k0 // 32 + c0 // 32) * b_pitch + b_col, 0,
                                  Strided(ck // 32, cols, b_pitch - cols, 0)))
        return ops

    def fixpipe(self, ctx: KernelContext, dst: Any, rows: int, cols: int) -> Any:
        self.out = ctx.fixpipe(dst, self.l0c, rows, cols, "bfloat16", name="fixpipe_to_ub")
        return self.out


# -------------------------------------------------------------------- first projection
def first_projection_aic(ctx: KernelContext, t: MegaTiling, b: int, e: int, m: int,
                         before: int, st: Any) -> Wait:
    recv, recv_s = ctx.tensor("received_token_data"), ctx.tensor("received_token_scales")
    w1, w1s = ctx.tensor("weight1"), ctx.tensor("weight1_scale")
    ready = ctx.tensor("input_ready")
    last_wave = -1
    for mi, ni, rows, cols in block_tiles(t, b, st, m, TILE_M1, t.F2):
        if mi != last_wave:
            yield from hw.spin_equal(ctx, ready, (e * t.wave_slots + mi) * 4, rows)
            last_wave = mi
        if st.vsync:
            yield from hw.wait_flag(ctx, 6)  # WaitForVector: the pair before is consumed
        if st.mmad is None:
            st.mmad = BlockMmad(ctx, TILE_M1, t.mode)
        for half, name in enumerate(("gemm1_gate", "gemm1_up")):
            col0 = half * t.F2 + ni * TILE_N
            yield from st.mmad(ctx, (recv, recv_s, before + mi * TILE_M1, t.H), rows,
                               (w1, w1s, e * t.H, col0, t.F), cols, t.H)
            st.mmad.fixpipe(ctx, ctx.peer_buffer(0, name), rows, cols)
        hw.set_flag(ctx, 4, "fixpipe")  # NotifyVector
        st.vsync = 1


def first_projection_aiv(ctx: KernelContext, t: MegaTiling, b: int, e: int, m: int,
                         before: int, st: Any) -> Wait:
    """AIV0's SwiGLU epilogue per tile: WaitForCube, silu(gate) * up in fp32 to bf16,
    MXFP8 requant, MTE3 to activatedTokenData/Scales, AtomicAdd(activationReady[e], 1),
    NotifyCube."""
    act, act_s = ctx.tensor("activated_token_data"), ctx.tensor("activated_token_scales")
    ready = ctx.tensor("activation_ready")
    gate, up = st.gemm1_buffers(ctx)
    for mi, ni, rows, cols in block_tiles(t, b, st, m, TILE_M1, t.F2):
        n = rows * cols
        yield from hw.wait_flag(ctx, 4)  # WaitForCube

        def epilogue(rows: int = rows, cols: int = cols, n: int = n) -> None:
            g = gate.view(mx.BF16, n).reshape(rows, cols)
            u = up.view(mx.BF16, n).reshape(rows, cols)
            codes, scales = mx_quantize_bf16(mx.swiglu(g, u), t.mode)
            raw = gate.view(np.uint8, n + n // 32)
            raw[:n] = codes.reshape(-1)
            raw[n:] = scales.reshape(-1)
        op = ctx.vector_seq("swiglu_epilogue",
                            [("cast_f32", n, mx.BF16), ("cast_f32", n, mx.BF16),
                             ("muls", n, np.float32), ("exp", n, np.float32),
                             ("adds", n, np.float32), ("div", n, np.float32),
                             ("mul", n, np.float32), ("cast_bf16", n, np.float32),
                             ("compute_max_exp", n, mx.BF16),
                             ("compute_scale", n // 32, np.uint16),
                             ("compute_fp8_data", n, np.float32)],
                            reads=[gate, up], writes=[gate], fn=epilogue)
        hw.compute(ctx, op)
        yield from ctx.pipe_barrier("vector")
        row0 = before + mi * TILE_M1
        col0 = ni * TILE_N
        ctx.copy_out(act, row0 * t.F2 + col0, gate, n, name="store_activation",
                     strided=Strided(rows, cols, 0, t.F2 - cols))
        ctx.copy_out(act_s, row0 * (t.F2 // 32) + col0 // 32, gate, n // 32, src_offset=n,
                     name="store_activation_scales",
                     strided=Strided(rows, cols // 32, 0, t.F2 // 32 - cols // 32))
        yield from ctx.pipe_barrier("mte3")
        yield from hw.atomic_add(ctx, ready, e * 16 * 4, 1, gate, gate.nbytes - 32)
        hw.set_flag(ctx, 6, "mte3")  # NotifyCube
        st.vsync = 1


# ------------------------------------------------------------------- second projection
def second_projection_aic(ctx: KernelContext, t: MegaTiling, b: int, e: int, m: int,
                          before: int, st: Any) -> Wait:
    act, act_s = ctx.tensor("activated_token_data"), ctx.tensor("activated_token_scales")
    w2, w2s = ctx.tensor("weight2"), ctx.tensor("weight2_scale")
    ready = ctx.tensor("activation_ready")
    for i, (mi, ni, rows, cols) in enumerate(block_tiles(t, b, st, m, TILE_M2, t.H)):
        if i == 0:
            yield from hw.spin_equal(ctx, ready, e * 16 * 4, t.gemm1_tiles(m))
        if st.done_tiles >= 2:
            yield from hw.wait_flag(ctx, 6 + st.buffer)  # WaitForVector(bufferIndex)
        if st.mmad is None:
            st.mmad = BlockMmad(ctx, TILE_M2, t.mode)
        yield from st.mmad(ctx, (act, act_s, before + mi * TILE_M2, t.F2), rows,
                           (w2, w2s, e * t.F2, ni * TILE_N, t.H), cols, t.F2)
        st.mmad.fixpipe(ctx, ctx.peer_buffer(0, f"gemm2_out{st.buffer}"), rows, cols)
        hw.set_flag(ctx, 4 + st.buffer, "fixpipe")  # NotifyVector(bufferIndex)
        st.done_tiles += 1
        st.buffer ^= 1


def second_projection_aiv(ctx: KernelContext, t: MegaTiling, b: int, e: int, m: int,
                          before: int, st: Any, local: Any = None) -> Wait:
    """AIV0 per GEMM2 tile: WaitForCube(buffer), the tile rows' routing metadata (UB at
    200 KiB), CombineTokens: per row one MTE3 store of its columns (512 B) into the
    source rank's combinedTokens at ((token * K + k) * H + column) * 2; NotifyCube.
    With `local` (a GM tensor [rows, H] bf16: the unfused path's grouped-matmul output)
    the tile is one strided MTE3 store there instead."""
    meta_t = ctx.tensor("routing_metadata") if local is None else None
    outs, meta = st.gemm2_buffers(ctx)
    for mi, ni, rows, cols in block_tiles(t, b, st, m, TILE_M2, t.H):
        out = outs[st.buffer]
        yield from hw.wait_flag(ctx, 4 + st.buffer)
        row0 = before + mi * TILE_M2
        if local is not None:
            ctx.copy_out(local, (row0 * t.H + ni * TILE_N) * 2, out, rows * cols * 2,
                         name="store_expert_output",
                         strided=Strided(rows, cols * 2, 0, (t.H - cols) * 2))
            yield from ctx.pipe_barrier("mte3")
            hw.set_flag(ctx, 6 + st.buffer, "mte3")
            st.done_tiles += 1
            st.buffer ^= 1
            continue
        yield from ctx.wait(ctx.copy_in(meta, meta_t, row0 * META, rows * META,
                                        name="load_routing_metadata"))
        rec = ctx.ub_read(meta, np.int32, rows * 8, ops=3 * rows).reshape(rows, 8)
        for r in range(rows):
            src, tok, k = (int(v) for v in rec[r, :3])
            at = t.combined_tokens + ((tok * t.K + k) * t.H + ni * TILE_N) * 2
            hw.remote_store(ctx, src, at, out, cols * 2, "combine_tokens",
                            src_offset=r * cols * 2)
        yield from ctx.pipe_barrier("mte3")  # MTE3_V: the buffer may be refilled
        hw.set_flag(ctx, 6 + st.buffer, "mte3")  # NotifyCube(bufferIndex)
        st.done_tiles += 1
        st.buffer ^= 1
