"""GroupedMatmul (ops-transformer gmm/grouped_matmul/op_kernel) as the A3 runs the baseline's
two calls, split_item 2, group_type 0 (split M), group_list_type 1 (counts):

- GMMProcess::Process and MNBlockIdxCompute (grouped_matmul.h): which base tiles each AIC
  takes, in which order, carried over the groups (gmm_walk.py);
- a block (the Matmul API's Iterate over K): MTE2 loads x's rows and the weight's rows into
  L1 in steps of stepKa / stepKb base-K slices, two of each (depthA1 = depthB1 = 2 steps);
  per baseK slice MTE1 moves A and B into L0A / L0B (ping-pong) and the cube accumulates
  int8 x int8 into L0C (int32); GetTensorC is a FixPipe out of L0C (dbL0C = 1);
- GMM1 (output int32, no scales): the cube-only kernel (grouped_matmul.cpp 567-585,
  QUANT_A8W8O32: GMM_CUBE_IMP, KERNEL_TYPE_AIC_ONLY), each block straight into y;
- GMM2 (scale + per_token_scale, bf16 out; grouped_matmul_quant_mixcore.h): a MIX launch.
  The AIC's FixPipe writes each int32 base tile (a block's in turn when singleN > baseN)
  into a workspace ring of PIPELINE_NUM = 4 slots per core (MMCompute 176-215: wait
  SYNC_AIV_AIC_FLAG once 4 tiles are out, set SYNC_AIC_AIV_FLAG after the FixPipe); both
  AIVs (VectorCompute / Dequant 218-380) wait for the tile, take alternate chunks of
  ubCalSize / baseN rows (the first to AIV1), each: per-channel bf16 scale and per-token
  scales in, AscendDequant, the per-token Mul, Cast to bf16 (RINT), out to y; then set
  SYNC_AIV_AIC_FLAG on MTE2. PostCompute: the AIC waits the last min(tiles, 4) flags.

The weights are NZ on the device (npu_format_cast 29): the tiling takes the strategy NZ selects
(tiling.py, SetWorkspscesPerTokenQuant's singleN), and the B tile's MTE2 load is charged as
the ND copy, which moves the same whole 32 B bursts in one instruction (docs/kernels/
moe_layer.md, "The NZ weights' layout"), so the bytes stay ND (npusim.runtime.cube).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.kernels.moe_layer.gmm_walk import Block, blocks_of
from npusim.kernels.moe_layer.tiling import PIPELINE_NUM, GmmTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Strided
from npusim.units import ceil_div

SYNC_AIV_AIC_FLAG = 3  # grouped_matmul_utils.h:171
SYNC_AIC_AIV_FLAG = 5  # grouped_matmul_utils.h:172
SYNC_MODE2 = 2
F32, I32 = np.float32, np.int32


def group_counts(ctx: KernelContext, t: GmmTiling, name: str) -> list[int]:
    """group_list (int64 counts), read by the scalar unit."""
    region = ctx.tensor(name)
    return [int(ctx.gm_read_scalar(region, 8 * g, np.int64)) for g in range(t.groups)]


class CubeBlock:
    """One AIC's L1 / L0 buffers and a block's K loop over them."""

    def __init__(self, ctx: KernelContext, t: GmmTiling,
                 note: Callable[[Any], Any] | None = None) -> None:
        self.t = t
        self.note = note  # called with each mmad (a fused kernel's overlap notes)
        b_set = t.step_kb * t.base_k * t.base_n
        chunks = min(t.step_ka, t.l0_steps)  # A: one buffer per base-K slice of a step
        self.l1a = [[ctx.alloc(f"l1_a{p}_{c}", t.base_m * t.base_k, "l1")
                     for c in range(chunks)] for p in range(2)]
        self.l1b = [ctx.alloc(f"l1_b{p}", b_set, "l1") for p in range(2)]
        self.l0a = [ctx.alloc(f"l0a{i}", t.base_m * t.base_k, "l0a") for i in range(2)]
        self.l0b = [ctx.alloc(f"l0b{i}", t.base_k * t.base_n, "l0b") for i in range(2)]
        self.l0c = ctx.alloc("l0c", t.base_m * t.base_n * 4, "l0c")
        self.a_readers: list[Any] = [None, None]
        self.b_readers: list[Any] = [None, None]
        self.l0_readers: list[Any] = [None, None]
        self.out: Any = None  # the FixPipe still reading L0C

    def _load_a(self, ctx: KernelContext, x: Any, row0: int, rows: int, step: int) -> list:
        t, p = self.t, step % 2
        first = step * t.step_ka
        ops = []
        for c in range(first, min(first + t.step_ka, t.l0_steps)):
            ck = min(t.base_k, t.k - c * t.base_k)
            ops.append(ctx.copy_in(self.l1a[p][c - first], x, row0 * t.k + c * t.base_k,
                                   rows * ck, name="copy_gm_to_l1_a",
                                   strided=Strided(rows, ck, t.k - ck, 0)))
        return ops

    def _load_b(self, ctx: KernelContext, w: Any, g: int, n0: int, cols: int, step: int
                ) -> list:
        t, p = self.t, step % 2
        k0 = step * t.step_kb * t.base_k
        kk = min(t.step_kb * t.base_k, t.k - k0)
        at = (g * t.k + k0) * t.n + n0
        return [ctx.copy_in(self.l1b[p], w, at, kk * cols, name="copy_gm_to_l1_b",
                            strided=Strided(kk, cols, t.n - cols, 0))]

    def run(self, ctx: KernelContext, x: Any, w: Any, blk: Block) -> Wait:
        """L0C = x[rows] @ w[g][:, n0:n0 + cols] over the whole K."""
        t = self.t
        g, row0, rows, n0, cols = blk
        if self.out is not None:
            yield from ctx.wait(self.out)
        steps_a, steps_b = ceil_div(t.l0_steps, t.step_ka), ceil_div(t.l0_steps, t.step_kb)
        a_loads: dict[int, list] = {}
        b_loads: dict[int, list] = {}
        for s in range(min(2, steps_a)):
            yield from self._free(ctx, self.a_readers, s % 2)
            a_loads[s] = self._load_a(ctx, x, row0, rows, s)
        for s in range(min(2, steps_b)):
            yield from self._free(ctx, self.b_readers, s % 2)
            b_loads[s] = self._load_b(ctx, w, g, n0, cols, s)
        for c in range(t.l0_steps):
            sa, sb = c // t.step_ka, c // t.step_kb
            ck = min(t.base_k, t.k - c * t.base_k)
            yield from ctx.wait(*a_loads.get(sa, ()), *b_loads.get(sb, ()))
            i = c % 2
            if self.l0_readers[i] is not None:
                yield from ctx.wait(self.l0_readers[i])
            la = ctx.load_data(self.l0a[i], self.l1a[sa % 2][c - sa * t.step_ka], rows * ck,
                               name="load_l0a")
            lb = ctx.load_data(self.l0b[i], self.l1b[sb % 2], ck * cols,
                               src_offset=(c - sb * t.step_kb) * t.base_k * cols,
                               name="load_l0b")
            yield from ctx.wait(la, lb)
            op = ctx.mmad(self.l0c, self.l0a[i], self.l0b[i], rows, cols, ck, "int8",
                          accumulate=c > 0, name="mmad_int8")
            if self.note is not None:
                self.note(op)
            self.l0_readers[i] = self.a_readers[sa % 2] = self.b_readers[sb % 2] = op
            if (c + 1) % t.step_ka == 0 and sa + 2 < steps_a:
                yield from self._free(ctx, self.a_readers, sa % 2)
                a_loads[sa + 2] = self._load_a(ctx, x, row0, rows, sa + 2)
            if (c + 1) % t.step_kb == 0 and sb + 2 < steps_b:
                yield from self._free(ctx, self.b_readers, sb % 2)
                b_loads[sb + 2] = self._load_b(ctx, w, g, n0, cols, sb + 2)
        yield from ctx.wait(*[r for r in self.l0_readers if r is not None])

    @staticmethod
    def _free(ctx: KernelContext, readers: list, p: int) -> Wait:
        if readers[p] is not None:
            yield from ctx.wait(readers[p])


def gmm1_program(t: GmmTiling) -> Any:
    """GMM1: int32 blocks straight into y [rows, n]."""
    def program(ctx: KernelContext) -> Wait:
        counts = group_counts(ctx, t, "group_list")
        x, w, y = ctx.tensor("x"), ctx.tensor("weight"), ctx.tensor("y")
        cube = CubeBlock(ctx, t)
        with ctx.phase("mm_compute"):
            for blk in blocks_of(t, counts, ctx.core_id):
                yield from cube.run(ctx, x, w, blk)
                _, row0, rows, n0, cols = blk
                cube.out = ctx.fixpipe(y, cube.l0c, rows, cols, "int32",
                                       dst_offset=(row0 * t.n + n0) * 4,
                                       dst_row_bytes=t.n * 4, name="get_tensor_c")
            if cube.out is not None:
                yield from ctx.wait(cube.out)
    return program


def gmm2_program(t: GmmTiling) -> Any:
    """GMM2: the AIC's blocks through the workspace ring, the AIVs' dequant to bf16."""
    def program(ctx: KernelContext) -> Wait:
        counts = group_counts(ctx, t, "group_list")
        core = ctx.block_idx
        blocks = list(blocks_of(t, counts, core))
        if ctx.core.kind.name == "aic":
            yield from _gmm2_aic(ctx, t, core, blocks)
        else:
            yield from _gmm2_aiv(ctx, t, core, blocks)
    return program


def _slot(t: GmmTiling, core: int, cube_num: int) -> int:
    """Byte offset of a block's int32 slot (sequentialWrite workSpaceOffset)."""
    return t.base_m * t.base_n * (core + (cube_num % PIPELINE_NUM) * t.cores) * 4


def _gmm2_aic(ctx: KernelContext, t: GmmTiling, core: int, blocks: list[Block]) -> Wait:
    x, w, ws = ctx.tensor("x"), ctx.tensor("weight"), ctx.tensor("workspace")
    cube = CubeBlock(ctx, t)
    with ctx.phase("mm_compute"):
        for num, blk in enumerate(blocks):
            yield from cube.run(ctx, x, w, blk)
            if num >= PIPELINE_NUM:
                yield from ctx.cross_core_wait_flag(SYNC_AIV_AIC_FLAG)
            _, _, rows, _, cols = blk
            cube.out = ctx.fixpipe(ws, cube.l0c, rows, cols, "int32",
                                   dst_offset=_slot(t, core, num), name="get_tensor_c")
            ctx.cross_core_set_flag(SYNC_MODE2, SYNC_AIC_AIV_FLAG, "fixpipe")
        for _ in range(min(len(blocks), PIPELINE_NUM)):  # PostCompute
            yield from ctx.cross_core_wait_flag(SYNC_AIV_AIC_FLAG)


def _gmm2_aiv(ctx: KernelContext, t: GmmTiling, core: int, blocks: list[Block]) -> Wait:
    ws, y = ctx.tensor("workspace"), ctx.tensor("y")
    scale_gm, token_gm = ctx.tensor("scale"), ctx.tensor("per_token_scale")
    vr, bn = t.vec_rows, t.base_n
    acc = ctx.alloc("vec_in", vr * bn * 4)
    out = ctx.alloc("vec_out", vr * bn * 2)
    scale = ctx.alloc("scale_in", bn * 2)
    token = ctx.alloc("per_token_scale_in", max(vr * 4, 32))
    sub = ctx.sub_block_idx
    store = None
    with ctx.phase("vector_compute"):
        for num, (g, row0, rows, n0, cols) in enumerate(blocks):
            ld = ctx.copy_in(scale, scale_gm, (g * t.n + n0) * 2, cols * 2,
                             name="data_copy_scale")
            yield from ctx.cross_core_wait_flag(SYNC_AIC_AIV_FLAG)
            yield from ctx.wait(ld)  # the scale's DeQue, chunks or none
            for chunk, m0 in enumerate(range(0, rows, vr)):
                if (chunk + 1) % 2 != sub:
                    continue
                r = min(vr, rows - m0)
                if store is not None:
                    yield from ctx.wait(store)
                ops = [ctx.copy_in(acc, ws, _slot(t, core, num) + m0 * cols * 4, r * cols * 4,
                                   name="copy_mm_out"),
                       ctx.copy_in(token, token_gm, (row0 + m0) * 4, r * 4,
                                   name="data_copy_per_token_scale")]
                yield from ctx.wait(*ops)
                n = r * cols

                def dequant(n: int = n, r: int = r, cols: int = cols) -> None:
                    import ml_dtypes
                    c = acc.view(I32, n).reshape(r, cols).astype(F32)
                    s = scale.view(ml_dtypes.bfloat16, cols).astype(F32)
                    v = (c * s[None, :]).astype(F32)
                    v = (v * token.view(F32, r)[:, None]).astype(F32)
                    out.view(ml_dtypes.bfloat16, n)[:] = v.reshape(-1).astype(ml_dtypes.bfloat16)
                op = ctx.vector_seq("dequant_per_token", [
                    ("cast_scale", cols, np.uint16), ("brcb", r * 8, F32),
                    ("cast_f32", n, I32), ("mul_scale", n, F32), ("mul_token", n, F32),
                    ("cast_bf16", n, F32)], reads=[acc, scale, token], writes=[out],
                    fn=dequant)
                yield from ctx.wait(op)
                store = ctx.copy_out(y, ((row0 + m0) * t.n + n0) * 2, out, n * 2,
                                     name="data_copy_out",
                                     strided=Strided(r, cols * 2, 0, (t.n - cols) * 2))
            ctx.cross_core_set_flag(SYNC_MODE2, SYNC_AIV_AIC_FLAG, "mte2")
        if store is not None:
            yield from ctx.wait(store)
