"""MegaMoE's calls on the runtime's MIX-launch mechanisms (npusim.runtime: crosscore,
cube, the AIC's copy_in into L1, remote MTE2 pulls, AtomicAdd writes, GM spins and the
generation-counter rank barrier), under the names the kernel source uses, and the notes
the overlap figures are made from: every remote transfer (mask stores, pulls, write-backs)
and every cube or epilogue instruction a core issues is recorded on its context
(npusim.kernels.common.overlap).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.hw.memory import Region
from npusim.kernels.common.overlap import note_compute, note_remote
from npusim.runtime.conditions import AllEqual, AtLeast, Wait
from npusim.runtime.context import KernelContext, Strided

SYNC_AIC_AIV_MODE = 4  # the 950's CrossCoreSetFlag mode: AIV1's ids + 16 at the AIC
SPIN_DELAY_CYCLES = 100  # the AIC's wait loops: GetSystemCycle() - start < 100


def role(ctx: KernelContext) -> tuple[str, int, int]:
    """(kind, block, sub-block) of this core in the MIX launch."""
    return ctx.core.kind.name, ctx.block_idx, ctx.sub_block_idx


def set_flag(ctx: KernelContext, flag: int, pipe: str = "scalar") -> None:
    ctx.cross_core_set_flag(SYNC_AIC_AIV_MODE, flag, pipe)


def wait_flag(ctx: KernelContext, flag: int) -> Wait:
    yield from ctx.cross_core_wait_flag(flag)


def read_bypass(ctx: KernelContext, region: Region, offset: int) -> Generator[Any, Any, int]:
    """One ReadGmByPassDCache of an int32 (a spin that holds at the first read)."""
    raw = yield from ctx.spin_until(region, offset, AtLeast(np.int32, -2 ** 31), 4,
                                    name="read_gm_bypass_dcache")
    return int(np.asarray(raw).view(np.int32)[0])


def spin_equal(ctx: KernelContext, region: Region, offset: int, value: int
               ) -> Wait:
    """while (ReadGmByPassDCache(flag) != value) { 100-cycle delay }"""
    yield from ctx.spin_until(region, offset, AllEqual(np.int32, value), 4,
                              SPIN_DELAY_CYCLES, name="spin_ready")


def rank_barrier(ctx: KernelContext, base: int, generation: int) -> Wait:
    yield from ctx.rank_barrier(base, generation)


def store_bypass(ctx: KernelContext, pe: int, offset: int, value: int) -> None:
    """WriteGmByPassDCache of an int32 into rank pe's window."""
    ctx.store_remote(pe, offset, np.array([value], np.int32), name="write_gm_bypass_dcache")


def atomic_add(ctx: KernelContext, region: Region, offset: int, value: int, scratch: Any,
               at: int = 0) -> Wait:
    """AtomicAdd(gm + offset, value) of an int32: the value stored to 4 B of UB (scratch +
    at), one MTE3 write under SetAtomicAdd<int32_t>, SetAtomicNone, and the wait for it."""
    ctx.ub_write(scratch, at, np.array([value], np.int32))
    ctx.set_atomic_add(np.int32)
    op = ctx.copy_out(region, offset, scratch, 4, src_offset=at, name="atomic_add")
    ctx.set_atomic_none()
    yield from ctx.wait(op)


def remote_store(ctx: KernelContext, pe: int, offset: int, buf: Any, nbytes: int, name: str,
                 src_offset: int = 0) -> Any:
    """An MTE3 DataCopyPad through aclshmem_ptr into rank pe's window (a put)."""
    op = ctx.put(pe, offset, buf, nbytes, src_offset=src_offset, name=name)
    return note_remote(ctx, op) if pe != ctx.rank_id else op


def pull(ctx: KernelContext, buf: Any, src: int, offset: int, nbytes: int) -> Any:
    """A remote MTE2 DataCopy from rank src's window into UB."""
    op = ctx.copy_in(buf, ctx.window(src), offset, nbytes, name="pull_quantized_row")
    return note_remote(ctx, op) if src != ctx.rank_id else op


def load_l1(ctx: KernelContext, l1: Any, region: Region, offset: int, dst_offset: int,
            strided: Strided) -> Any:
    return ctx.copy_in(l1, region, offset, strided.nbytes, dst_offset=dst_offset,
                       name="gm_to_l1", strided=strided)


def compute(ctx: KernelContext, op: Any) -> Any:
    """Record a compute instruction's busy interval."""
    return note_compute(ctx, op)
