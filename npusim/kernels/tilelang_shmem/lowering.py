"""What the TileLang primitives the kernels use lower to, as npusim runtime calls.

TileLang-Ascend's code generator (src/target/codegen_ascend.cc, src/tl_templates/ascend/
common.h) turns `T.copy` GM -> UB into a DataCopy on MTE2 and UB -> GM into one on MTE3,
`T.shmem_ub_put_nbi` into aclshmemx_mte_put_nbi (one MTE3 UB -> remote-GM copy), `T.sync_all`
into SyncAll<false> (every core of the MIX launch, AIC and AIV), `T.barrier_all` into
PipeBarrier<PIPE_ALL>, `T.set_flag(src, dst)` + `T.wait_flag` into SetFlag / WaitFlag (the
destination pipe waits for the source pipe), and the `T.tile.*` vector calls into one
vector instruction each. Nothing here adds a cost of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import ceil_div

PIPE_OF = {"mte2": "mte2", "mte3": "mte3", "v": "vector"}


def sync_func(ctx: KernelContext, src: str, dst: str) -> Wait:
    """T.set_flag(src, dst) + T.wait_flag(src, dst): `dst` waits for what `src` issued.
    A flag from the scalar unit orders nothing the model has not already ordered (the
    scalar issues in program order); one towards the scalar waits for the source pipe."""
    if src in PIPE_OF:
        yield from ctx.pipe_barrier(PIPE_OF[src])


def barrier_all(ctx: KernelContext) -> Wait:
    """T.barrier_all: PipeBarrier<PIPE_ALL>."""
    yield from ctx.drain()


def sync_all(ctx: KernelContext) -> Wait:
    """T.sync_all: AscendC::SyncAll<false>, over the AIC and the AIV cores of the launch."""
    yield from ctx.sync_all(all_kinds=True)


def tile_op(ctx: KernelContext, name: str, elements: int, dtype: Any, reads: tuple = (),
            writes: tuple = (), fn: Callable[[], None] | None = None) -> Any:
    """One T.tile.* vector call over `elements` of `dtype`."""
    return ctx.vector(name, max(elements, 0), dtype, reads=reads, writes=writes, fn=fn)


def fill(ctx: KernelContext, buf: Any, value: float, dtype: Any, count: int | None = None
         ) -> Any:
    """T.tile.fill(buf, value): a Duplicate over the buffer."""
    n = buf.nbytes // np.dtype(dtype).itemsize if count is None else count

    def effect() -> None:
        buf.view(dtype, n)[:] = value

    return tile_op(ctx, "fill", n, dtype, writes=(buf,), fn=effect)


def vector_check_ns(ctx: KernelContext, elements: int, dtype: Any) -> float:
    """The cost of one vector reduction in a polling loop (issue + repeats), as ctx.vector
    charges it, plus the scalar load and compare of its result."""
    v = ctx.cfg.vector
    repeats = ceil_div(elements * np.dtype(dtype).itemsize, v.bytes_per_cycle)
    return (v.issue_cycles + repeats * v.cycles_per_repeat) * ctx.cycle_ns + 3 * ctx.issue_ns
