"""performance_info of the combine's receive (PerformanceInfoPerToken)."""

from __future__ import annotations

import numpy as np

from npusim.kernels.common.status import WIN_ADDR_ALIGN
from npusim.kernels.mc2.tiling import Mc2Tiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext, Poll, Strided
from npusim.units import align32

F32 = np.float32


class PerfInfo:
    """performance_info of the receive (PerformanceInfoPerToken): per (token, slot) the
    first sighting of its flag, in whole us from the loop's start, maxed per source rank.

    A3 looks at every probe (a token's slots are seen as their flags land); the 950 only
    once a token is complete, re-checking each awaited slot's flags (one strided read,
    CompareScalar, a scalar scan). The operator's AtomicMax over the cores is modelled
    as one row per core in performance_info_cores (the report takes their max)."""

    def __init__(self, ctx: KernelContext, t: Mc2Tiling, ids: np.ndarray, live: np.ndarray) -> None:
        self.ctx, self.t = ctx, t
        K, S = t.K, t.S
        rank = ctx.rank_id
        need = np.ones((ids.shape[0], K + S), bool)
        need[:, :K] = live & (ids < t.shape.E)
        self.need = need  # NeedWaitTokenSlot
        src = np.zeros((ids.shape[0], K + S), np.int64)
        src[:, :K] = np.where(need[:, :K], ids // t.L + t.shape.S_r, 0)
        for j in range(S):
            src[:, K + j] = t.shared_dst(rank, j)
        self.src = src
        self.first = np.full(need.shape, -1.0)  # time of the first sighting, ns
        self.t0 = ctx.t
        self.perf = np.zeros(t.W, np.int64)
        self._pending: list[tuple[int, float, np.ndarray]] = []
        blocks = t.window.combine_step // WIN_ADDR_ALIGN
        self.flags_buf = (
            ctx.alloc("perf_flags", align32(32 * blocks)) if t.arch == "arch35" else None
        )

    def _record(self, tok: int, k: int, at: float) -> None:
        if self.need[tok, k] and self.first[tok, k] < 0:
            self.first[tok, k] = at
            us = int((at - self.t0) // 1000)  # GetSystemCycle() / CYCLES_PER_US
            s = int(self.src[tok, k])
            self.perf[s] = max(self.perf[s], us)

    # ---- A3: every probe reads the token's (K + S) flags
    def a3_observer(self, pending: list[int], polls: list[Poll]):
        self._pending = []

        def observe(i: int, at: float, data: np.ndarray) -> None:
            self._pending.append((pending[i], at, data.view(F32)[::8] > 0.5))

        return observe

    def a3_settle(self) -> None:
        """The sightings of the round just ended (reads up to its winner's), in time order."""
        end = self.ctx.t
        for tok, at, up in sorted(self._pending, key=lambda x: x[1]):
            if at <= end:
                for k in np.flatnonzero(up):
                    self._record(tok, int(k), at)
        self._pending = []

    # ---- 950: a complete token's slots checked one by one
    def a5_record(self, tok: int, state: int, blocks: int) -> Wait:
        """CheckPackedTokenArrive per awaited slot: Duplicate, one strided read of its
        blocks' 32 B flags, CompareScalar, a scalar scan; then the slot's time."""
        ctx, t = self.ctx, self.t
        buf = self.flags_buf
        win = ctx.window()
        for k in range(t.K + t.S):
            ctx.scalar(3)  # NeedWaitTokenSlot
            if not self.need[tok, k]:
                continue
            ctx.vector("perf_dup_flags", 8 * blocks, F32, writes=[buf])
            yield from ctx.pipe_barrier("vector")
            yield from ctx.wait(
                ctx.copy_in(
                    buf,
                    win,
                    t.window.combine_slot_offset(state, tok, k) + 480,
                    0,
                    name="perf_check_flags",
                    strided=Strided(blocks, 32, src_gap=480),
                )
            )
            ctx.vector("perf_compare", 8 * blocks, F32, reads=[buf])
            yield from ctx.pipe_barrier("vector")
            ctx.scalar(4)  # the first-zero scan and GetSystemCycle
            self._record(tok, k, ctx.t)

    def write(self) -> Wait:
        ctx, W = self.ctx, self.t.W
        pbuf = ctx.alloc("perf", align32(8 * W))
        ctx.ub_write(pbuf, 0, self.perf, ops=1)
        yield from ctx.wait(
            ctx.copy_out(
                ctx.tensor("performance_info_cores"),
                8 * W * ctx.core_id,
                pbuf,
                8 * W,
                name="write_performance_info",
            )
        )
