"""The AIC -> AIV soft sync of both grouped GEMMs (fused_deep_moe_utils.h): one int32
counter per AIC in the status space, the AIC's EncreaseSyncFlag after each block's
fixpipe (and GMM1's once per group), the AIV's CheckSyncFlag spinning until the counter
reaches its running target. Also the status space's other scalar reads and writes."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.kernels.moe_layer.fused_deep_moe_a5.window import A5Window
from npusim.runtime.conditions import AllEqual, AtLeast, Wait
from npusim.runtime.context import KernelContext

SLEEP_CYCLES = 50  # SPIN_WAIT_CYCLES: Nop<SLEEP_CYCLE> (fused_deep_moe_a5_base.h 23-28)


def read_int(ctx: KernelContext, offset: int) -> Generator[Any, Any, int]:
    """FlushAndGetValue of an int32 of the own window (a read that holds at once)."""
    raw = yield from ctx.spin_until(ctx.window(), offset, AtLeast(np.int32, -2 ** 31), 4,
                                    name="flush_and_get_value")
    return int(np.asarray(raw).view(np.int32)[0])


def write_int(ctx: KernelContext, offset: int, value: int) -> None:
    """SetValueAndFlush of an int32 of the own window."""
    ctx.store_remote(ctx.rank_id, offset, np.array([value], np.int32),
                     name="set_value_and_flush")


def spin_word(ctx: KernelContext, offset: int, value: int, nbytes: int = 4
              ) -> Generator[Any, Any, np.ndarray]:
    """Spin until the int32 at offset equals value; the bytes read (nbytes from offset)."""
    raw = yield from ctx.spin_until(ctx.window(), offset,
                                    AllEqual(np.int32, value, stride=nbytes), nbytes,
                                    SLEEP_CYCLES, name="spin_flag")
    return np.asarray(raw).view(np.int32)


class SoftSync:
    """One AIC's counter of one GEMM, as the AIC raises it (`count` mirrors its value)."""

    def __init__(self, gemm: int, core: int) -> None:
        self.offset = A5Window.soft_sync(gemm, core)
        self.count = 0

    def increase(self, ctx: KernelContext) -> Wait:
        """EncreaseSyncFlag: PipeBarrier<PIPE_ALL>, read, write value + 1."""
        yield from ctx.drain()
        value = yield from read_int(ctx, self.offset)
        self.count = value + 1
        write_int(ctx, self.offset, self.count)
        yield from ctx.drain()


def check_sync(ctx: KernelContext, gemm: int, core: int, target: int) -> Wait:
    """CheckSyncFlag: PipeBarrier<PIPE_ALL>, spin until the counter >= target."""
    yield from ctx.drain()
    yield from ctx.spin_until(ctx.window(), A5Window.soft_sync(gemm, core),
                              AtLeast(np.int32, target), 4, SLEEP_CYCLES,
                              name="check_sync_flag")
