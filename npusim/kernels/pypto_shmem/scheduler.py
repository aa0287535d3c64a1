"""pyPTO's machine as its public sources describe it, reduced to what the timing needs
(hicann/pypto @883e7dfb0; docs/kernels/pypto_shmem.md says which parts are assumptions).

- A LOOP's iteration calls the loop body's root function; straight-line code between
  loops is a root function of its own. The control-flow AICPU stitches consecutive root
  functions into one device task, up to `stitch_function_max_num` of them (a LOOP barrier,
  the end, or the workspace closes one earlier: framework/src/machine/device/dynamic/
  context/device_execute_context.cpp, CallRootFunctionStitch), and submits it to the
  scheduling AICPUs.
- Inside a device task the leaf tasks carry data-driven dependencies: the stitch links a
  consumer to the producers of the tensors it reads (device_stitch_context.h,
  HandleOneStitch; the tile ops' `pred` arguments). A completed task costs its AICPU
  `aicpu.completion_ns`, then `aicpu.resolve_ns` per successor, released one after the
  other; a ready task is dispatched by its core's AICPU, `aicpu.task_dispatch_ns`
  (pyPTO's cost model: machine/AICPUMachine.cpp, ResolveDependence, WakeupSuccessors,
  DispatchTasksInNormalMode).
- Between device tasks the scheduling AICPUs wait for every core's last task and for each
  other (aicore_manager.h, RunTask: WAIT_TAIL_TASK_FINISH, WAIT_ALL_SCH_FINISH): the next
  device task starts `aicpu.submit_ns` after the last core of the rank is done with this one.
- A WaitUntil is a task of the AICPU (framework/src/machine/device/distributed/
  shmem_wait_until.cpp, SignalTileOp::PollCompleted): npusim times it as a spin with the
  period `aicpu.poll_ns` on the core that runs its successor (idle meanwhile).

Placement stays static: a loop's tasks round robin over the cores of their kind, in loop
order (device_sched_mode 0: one FIFO ready queue); core row c is served by AICPU c mod
`aicpu.cores`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

from npusim.hw.pipe import Op
from npusim.kernels.kernel import CoreTiming
from npusim.runtime.conditions import Condition, Wait
from npusim.runtime.context import KernelContext

Key = tuple[Any, ...]  # a leaf task: (loop, index, ...)


class Timeline:
    """One scheduling AICPU's busy spans. Requests reach it in the simulator's order, not
    in time order (each core runs ahead on its own clock): each takes the earliest gap at
    or after its time that fits it."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def reserve(self, earliest: float, duration: float) -> float:
        """Book `duration` at the first free moment from `earliest`; return its start."""
        t = earliest
        i = bisect.bisect_right(self.ends, t)
        while i < len(self.starts) and self.starts[i] < t + duration:
            t = max(t, self.ends[i])
            i += 1
        self.starts.insert(i, t)
        self.ends.insert(i, t + duration)
        return t


class Gate:
    """The start of one device task on one rank: every launched core arrives once it is
    done with the previous device task; the last arrival plus `submit_ns` opens it."""

    def __init__(self, ctx: KernelContext, d: int) -> None:
        self.arrived = 0
        self.latest = 0.0
        self.open = Op(ctx.env, f"device task {d}", "aicpu")


class Scheduler:
    """The control-flow and scheduling AICPUs of every rank in one launch."""

    def __init__(self, stitch: int, parties: int) -> None:
        self.stitch = stitch  # stitch_function_max_num: root functions per device task
        self.parties = parties  # the launched cores that run the program, per rank
        self.aicpus: dict[tuple[int, int], Timeline] = {}
        self.done: dict[tuple[int, Key], Op] = {}  # a task's completion, seen by its AICPU
        self.released: dict[tuple[int, Key, Key], float] = {}  # (rank, pred, succ) -> ready
        self.gates: dict[tuple[int, int], Gate] = {}
        self.entered: dict[tuple[int, int], int] = {}  # (rank, core) -> its device task

    def device_task(self, root: int) -> int:
        """The device task root function `root` (0, 1, ... in program order) is stitched
        into."""
        return root // self.stitch

    def _aicpu(self, ctx: KernelContext) -> Timeline:
        key = (ctx.rank_id, ctx.core_id % ctx.cfg.aicpu.cores)
        return self.aicpus.setdefault(key, Timeline())

    def completion(self, ctx: KernelContext, key: Key) -> Op:
        """Task `key`'s completion on this core's rank, as its AICPU sees it."""
        op = self.done.get((ctx.rank_id, key))
        if op is None:
            op = self.done[(ctx.rank_id, key)] = Op(ctx.env, f"task {key}", "aicpu")
        return op

    def start(self, ctx: KernelContext, root: int, key: Key = (), preds: Iterable[Key] = (),
              dispatch: bool = True) -> Wait:
        """A leaf task of root function `root` on this core: its device task open, its
        predecessors' completions resolved to it, then (unless a WaitUntil hands it over)
        its dispatch."""
        yield from self.enter(ctx, self.device_task(root))
        for p in preds:
            yield from self.known(ctx, p)
            ctx.t = max(ctx.t, self.released.get((ctx.rank_id, p, key),
                                                  self.completion(ctx, p).done_at))
        if dispatch:
            self.dispatch(ctx)

    def known(self, ctx: KernelContext, key: Key) -> Wait:
        """Wait until task `key` has run (its successors, and when each is released, are
        known then), without taking its end as this core's clock."""
        op = self.completion(ctx, key)
        if op.done_at is None:
            yield from ctx.wait(op)

    def finish(self, ctx: KernelContext, key: Key, root: int,
               successors: Sequence[tuple[Key, int]] = ()) -> None:
        """The core is done with task `key` of root function `root` (its pipes drained):
        its AICPU reads the completion, then releases, in order, the successors (key,
        root) stitched into the same device task; a later device task's tasks need no
        release (the sync between device tasks orders them)."""
        a = ctx.cfg.aicpu
        here = self.device_task(root)
        linked = [k for k, r in successors if self.device_task(r) == here]
        at = self._aicpu(ctx).reserve(ctx.t, a.completion_ns + len(linked) * a.resolve_ns)
        for i, k in enumerate(linked):
            self.released[(ctx.rank_id, key, k)] = at + a.completion_ns + (i + 1) * a.resolve_ns
        self.completion(ctx, key).complete(at + a.completion_ns + len(linked) * a.resolve_ns)

    def dispatch(self, ctx: KernelContext) -> None:
        """The core's AICPU hands it its next task: it starts once dispatched."""
        ctx.t = self._aicpu(ctx).reserve(ctx.t, ctx.cfg.aicpu.task_dispatch_ns) \
            + ctx.cfg.aicpu.task_dispatch_ns

    def enter(self, ctx: KernelContext, d: int) -> Wait:
        """Pass the starts of device tasks up to `d`, one after the other: at each, this
        core arrives (done with the one before) and waits for it to open."""
        core = (ctx.rank_id, ctx.core_id)
        here = self.entered.get(core, 0)
        while here < d:
            here += 1
            gate = self.gates.get((ctx.rank_id, here))
            if gate is None:
                gate = self.gates[(ctx.rank_id, here)] = Gate(ctx, here)
            gate.arrived += 1
            gate.latest = max(gate.latest, ctx.t)
            if gate.arrived == self.parties:
                gate.open.complete(gate.latest + ctx.cfg.aicpu.submit_ns)
            yield from ctx.wait(gate.open)
            ctx.t = max(ctx.t, gate.open.done_at)
        self.entered[core] = here
        ctx.notes = here + 1  # the device tasks this core has seen

    def close(self, ctx: KernelContext, roots: int) -> Wait:
        """The program's end: pass the device tasks still ahead (the other cores wait
        for this one's arrival)."""
        yield from self.enter(ctx, self.device_task(roots - 1))

    def wait_until(self, ctx: KernelContext, region: Any, offset: int, cond: Condition,
                   nbytes: int = 4, name: str = "WaitUntil") -> Wait:
        """WaitUntil, polled by the AICPU every `aicpu.poll_ns`; its successor is then
        dispatched to this core."""
        delay = ctx.cfg.aicpu.poll_ns / ctx.cycle_ns
        seen = yield from ctx.spin_until(region, offset, cond, nbytes, delay, name)
        self.dispatch(ctx)
        return seen


def stitch_fields(tiling: Any, cores: Sequence[Sequence[CoreTiming]]
                  ) -> dict[str, Any]:
    """The device tasks each rank submitted (every core notes how many it passed), under
    the stitch bound: what stitching changes."""
    seen = [max((c.notes or 0) for c in row) for row in cores]
    return {"stitch_function_max_num": tiling.stitch, "submissions": max(seen, default=0)}
