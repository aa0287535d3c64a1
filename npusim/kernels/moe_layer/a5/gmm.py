"""GroupedMatmul MX fp8 x fp8 -> bf16 on the 950 (ops-transformer gmm/grouped_matmul/
op_kernel/arch35/quant_adaptive_sliding_window_templates/gqmm_cube_on_the_fly.h,
GmmASWKernel; AIC only), as the A5 test's baseline calls it twice (split_item 2, group_type
0, group_list_type 1, per_token_scale = the activations' E8M0 scales, scale = the weights').

- Process (268-311): per group with rows, the base blocks of quant_block_sch.h
  (:func:`~npusim.kernels.moe_layer.a5.tiling.mx_blocks`);
- SetMMParaAndCompute (314-341): the Matmul API's MX Iterate over the block's K and
  GetTensorC: the fp32 L0C cast to bf16 by the FixPipe on its way to y.

The block is mega_moe's BlockMmad (npusim/kernels/mega_moe/cube.py): L1 K steps of 256 (two
sets, MTE2 double buffered), L0 K steps of 128 with their E8M0 scales, the cube's MX mmad
into L0C. It equals the host tiling's baseK 128, stepKa = stepKb = 2 (depth 4) that a
baseM-256 call gets; with fewer rows the host loads A in longer steps (stepKa up to K/128),
which moves the same bytes. Scales are kept [K/32, N] per expert ([ceil(K/64), N, 2] on the
device: the same bytes in another order).
"""

from __future__ import annotations

from typing import Any

from npusim.kernels.mega_moe.cube import BlockMmad
from npusim.kernels.moe_layer.a5.tiling import MxGmmTiling, mx_blocks
from npusim.kernels.moe_layer.gmm import group_counts
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext


def mx_gmm_program(t: MxGmmTiling, mode: str) -> Any:
    def program(ctx: KernelContext) -> Wait:
        counts = group_counts(ctx, t, "group_list")
        x, xs = ctx.tensor("x"), ctx.tensor("per_token_scale")
        w, ws, y = ctx.tensor("weight"), ctx.tensor("scale"), ctx.tensor("y")
        blocks = mx_blocks(t, counts, ctx.core_id)
        mmad = BlockMmad(ctx, t.base_m, mode)
        row_bytes = t.n * 2
        with ctx.phase("mm_compute"):
            for g, row0, rows, n0, cols in blocks:
                yield from mmad(ctx, (x, xs, row0, t.k), rows, (w, ws, g * t.k, n0, t.n),
                                cols, t.k)
                # GetTensorC: FixPipe L0C fp32 -> bf16 into y's rows
                mmad.out = ctx.fixpipe(y, mmad.l0c, rows, cols, "bfloat16",
                                       row0 * row_bytes + n0 * 2, name="get_tensor_c",
                                       dst_row_bytes=row_bytes)
            yield from ctx.wait(*[op for op in (mmad.out,) if op is not None])
    return program
