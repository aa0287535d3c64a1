"""The OnesLike kernel DeepEP-Ascend's baseline timing counts first
(test_fused_deep_moe.py 553-567 sums `aclnnInplaceOne_OnesLikeAiCore_OnesLike` with the
chain's kernels). It is not launched by the chain itself: bench_kineto's profiling barrier
(tests/python/deepep/utils.py 280-283) runs `dist.all_reduce(torch.ones(1,
dtype=torch.float, device="npu"))` before the baseline calls, and torch.ones on the NPU is
aclnnInplaceOne (ops-math math/ones_like/op_api/aclnn_ones.cpp 84-112: OnesLike on the
contiguous self; ones_like.cpp 38-52 takes the AI Core kernel on ascend910_93). So: one
fp32 element set to 1.

The ascend910_93 OnesLike binary's source is not public; the public AscendC OnesLike is
ops-math's experimental/math/ones_like (AddConfig ascend910b, the A3's vector core
generation), modelled here step by step as an assumption for the A3:
- tiling (op_host/ones_like_tiling.cpp 116-139): blockNum = the AIV, fewer when the bytes
  are under MIN_CHUNK_SIZE 4096 a core (ceil(bytes / 4096)); formerNum cores of
  ceil(total / blockNum) elements, the rest one fewer; tiles of at most UB / 2 bytes;
- kernel (op_kernel/ones_like.h 81-123): one Duplicate of 1 over a tile, then per tile a
  V -> MTE3 sync and a DataCopy out (DataCopyPad when the tile is not 32 B aligned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.kernel import Phase, TensorSpec, const
from npusim.kernels.vector_sample import TaskKernel
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div

MIN_CHUNK_SIZE = 4096  # ones_like_tiling.cpp:28, bytes a core at least
UB_USAGE_DIV = 2  # ones_like_tiling.cpp:29
ELEMENTS = 1  # torch.ones(1) in bench_kineto's barrier
F32 = np.float32


@dataclass(frozen=True)
class OnesLikeTiling:
    total: int  # elements
    item: int  # bytes an element
    cores: int  # blockNum
    former_num: int
    former_length: int
    tail_length: int
    former_tile: int
    tail_tile: int


def ones_like_tiling(total: int, item: int, aiv_cores: int, ub_bytes: int) -> OnesLikeTiling:
    cores = aiv_cores
    if total * item < MIN_CHUNK_SIZE * aiv_cores:
        cores = ceil_div(total * item, MIN_CHUNK_SIZE)
    block = total // cores
    former_num = cores if total % cores == 0 else total % cores
    tail_num = cores - former_num
    former_length = block + (1 if tail_num else 0)
    max_tile = ub_bytes // item // UB_USAGE_DIV
    return OnesLikeTiling(total, item, cores, former_num, former_length, block,
                          min(max_tile, former_length), min(max_tile, block))


def ones_like_program(t: OnesLikeTiling) -> Any:
    def program(ctx: KernelContext) -> Wait:
        b = ctx.core_id
        former = b < t.former_num
        length = t.former_length if former else t.tail_length
        tile = t.former_tile if former else t.tail_tile
        start = (t.former_length * b if former else
                 t.former_length * t.former_num + t.tail_length * (b - t.former_num))
        y = ctx.tensor("y")
        buf = ctx.alloc("y", max(tile, 1) * t.item)
        with ctx.phase("fill"):
            if length <= 0:
                return
            op = ctx.vector_seq("duplicate", [("duplicate", tile, F32)], writes=[buf],
                                fn=lambda: _fill(buf, tile))
            yield from ctx.wait(op)
            stores = []
            for at in range(0, length, tile):
                n = min(tile, length - at)
                name = "data_copy" if n * t.item % 32 == 0 else "data_copy_pad"
                stores.append(ctx.copy_out(y, (start + at) * t.item, buf, n * t.item,
                                           name=name))
            yield from ctx.wait(*stores)
    return program


def _fill(buf: Any, n: int) -> None:
    buf.view(F32, n)[:] = F32(1.0)


class OnesLike(TaskKernel):
    """aclnnInplaceOne's OnesLike on bench_kineto's barrier tensor ([1] fp32)."""

    name = "ones_like"
    phases = (Phase("fill", "blockNum AIVs: Duplicate 1 over a tile, copy it out per tile"),)
    inputs = (TensorSpec("x", const(F32), lambda t, r: (ELEMENTS,),
                         "[1] fp32 (torch.ones' uninitialised self)"),)
    outputs = (TensorSpec("y", const(F32), lambda t, r: (ELEMENTS,), "[1] fp32 ones"),)

    def program(self, tiling: Any) -> Any:
        return ones_like_program(tiling.ones_like)

    def cores(self, tiling: Any) -> int | None:
        return tiling.ones_like.cores
