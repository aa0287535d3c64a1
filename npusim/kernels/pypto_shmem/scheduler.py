"""pyPTO's machine as its public docs describe it, reduced to what the timing needs.

A DYNAMIC_LOOP compiles to control flow on `kernel_aicpu`; its body becomes tile tasks
(`kernel_aicore`) that the scheduling AICPUs hand to idle AIC / AIV cores once the tasks
they depend on have completed (hicann/pypto docs/zh/tutorials/appendix/faq/
loop-principle.md; the recipes' pyPTO operator guide, "runtime"). A WaitUntil is a task of
the AICPU itself: it polls the signal (framework/src/machine/device/distributed/
shmem_wait_until.cpp, SignalTileOp::PollCompleted) and releases its successors.

npusim's assumptions, stated in docs/kernels/pypto_shmem.md:

- `aicpu.cores` scheduling AICPUs per die; core row c of the launch is served by AICPU
  c mod cores, which hands out one task at a time, `aicpu.task_dispatch_ns` each: a task
  starts when its core is free, its predecessors have completed and its AICPU has
  dispatched it;
- the tasks of a loop are placed round robin over the cores of their kind, in loop order
  (device_sched_mode 0, one shared FIFO ready queue);
- a dependency from every task of one loop to the next is the rank's SyncAll of the
  cores that ran them (the completions reaching the AICPU), then each successor's dispatch;
- a WaitUntil is polled every `aicpu.poll_ns`: npusim times it as a spin with that
  period on the core that runs the successor task (that core is idle meanwhile).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from npusim.runtime.conditions import Condition
from npusim.runtime.context import KernelContext

Wait = Generator[Any, Any, Any]

# The scheduling AICPUs are npusim.hw.cores' aicpu kind; no program of this family runs
# on them (their work is the dispatch and the polls below).


class Scheduler:
    """The scheduling AICPUs of every rank in one launch: when each is next free."""

    def __init__(self) -> None:
        self.free: dict[tuple[int, int], float] = {}

    def dispatch(self, ctx: KernelContext) -> None:
        """The core's next task is handed over: it starts once the core's AICPU has
        dispatched it (the core idles until then)."""
        a = ctx.cfg.aicpu
        key = (ctx.rank_id, ctx.core_id % a.cores)
        start = max(ctx.t, self.free.get(key, 0.0))
        self.free[key] = start + a.task_dispatch_ns
        ctx.t = start + a.task_dispatch_ns

    def wait_until(self, ctx: KernelContext, region: Any, offset: int, cond: Condition,
                   nbytes: int = 4, name: str = "WaitUntil") -> Wait:
        """WaitUntil, polled by the AICPU every `aicpu.poll_ns`; its successor is then
        dispatched to this core."""
        delay = ctx.cfg.aicpu.poll_ns / ctx.cycle_ns
        seen = yield from ctx.spin_until(region, offset, cond, nbytes, delay, name)
        self.dispatch(ctx)
        return seen
