"""The pyPTO dispatch (LOOPs send_token, send_signal, receive_token of the cann-recipes-infer
article "NPU DeepSeek SHMEM通信优化实践") as tile tasks on the AIV cores of a MIX launch, placed
and dispatched by the scheduler model (scheduler.py). Each tile op lowers as tileop_shmem.h
has it: ShmemPut is GM -> UB -> remote GM (TPUT), ShmemSignal an atomic-add store of a 32 B
int32 tile, ShmemGet GM -> UB -> GM (TGET), CumSum one vector instruction.

- prepare (not in the article; moe_dispatch.cpp's Prepare loop): AIV 0 derives offsetTable
  (each pair's rank among the pairs to its expert) and totalOffset (pairs per expert)
  from expert_ids with a scalar scan.
- send_token: task (row, col): the expert id and tokenOffset (GetTensorData), ShmemPut of
  x[row] to shmemData[rank][le*W + me][tokenOffset] and of the 3-int message to
  shmemInfo at the same slot.
- send_signal: task per expert: ShmemPut of its count to shmemCount[rank][le*W + me + 1],
  then ShmemSignal(ADD 1) on the rank's shmemSignal.
- receive_token: WaitUntil(signal == moeExpertNum, reset) on the AICPU; ShmemGet of the
  counts, CumSum (the offsets); then per (expert slot, row) a task ShmemGet of the row
  into expandX[offset + j] and per slot one of its info rows into assistInfoForCombine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npusim.kernels.pypto_shmem.scheduler import Scheduler, Wait
from npusim.kernels.pypto_shmem.tiling import BLOCK, INFO, PyptoTiling
from npusim.runtime.conditions import AllEqual
from npusim.runtime.context import KernelContext, Strided

I32 = np.int32
PHASES = ("prepare", "send_token", "send_signal", "receive_token")


PREPARE, COUNTS = ("prepare",), ("counts",)


class Roots:
    """The dispatch's root functions in program order (one per LOOP iteration; the
    Prepare and the CumSum are one each): where each loop's first one falls."""

    def __init__(self, t: PyptoTiling) -> None:
        pairs = t.shape.BS * t.shape.K
        self.prepare = 0
        self.send_token = 1
        self.send_signal = self.send_token + pairs
        self.counts = self.send_signal + t.E
        self.receive = self.counts + 1
        self.total = self.receive + t.E


def dispatch_program(t: PyptoTiling):
    sched = Scheduler(t.stitch, t.aiv_num)  # the AICs run no dispatch task

    def program(ctx: KernelContext) -> Wait:
        if ctx.core.kind.name == "aic":
            return
        yield from dispatch(ctx, t, sched)

    return program


def mine(ctx: KernelContext, t: PyptoTiling, n: int) -> range:
    """Tasks 0..n-1 of a loop placed round robin over the AIVs: this core's."""
    return range(ctx.kind_index, n, t.aiv_num)


def senders(t: PyptoTiling, ids: np.ndarray) -> list[list[tuple[Any, ...]]]:
    """Per expert, the send_token tasks whose puts its signal announces (their ShmemPuts
    are the signal's `pred`, as in the public test's shmem_signal)."""
    out: list[list[tuple[Any, ...]]] = [[] for _ in range(t.E)]
    for i, e in enumerate(ids):
        out[int(e)].append(("send_token", i))
    return out


def dispatch(ctx: KernelContext, t: PyptoTiling, sched: Scheduler) -> Wait:
    s, win, me = t.shape, t.window, ctx.rank_id
    BS, K, L, W = s.BS, s.K, s.L, s.W
    r = Roots(t)
    row_buf = ctx.alloc("tile", s.token_bytes)
    msg = ctx.alloc("moeSendMsg", BLOCK)
    cnt = ctx.alloc("count", BLOCK)
    sig = ctx.alloc("signal", BLOCK)
    offset_table, total_offset = ctx.tensor("offset_table"), ctx.tensor("total_offset")
    ids = ctx.tensor("expert_ids").read(0, 4 * BS * K).view(I32)  # the AICPU's stitch
    announced = senders(t, ids)
    with ctx.phase("prepare"):
        if ctx.kind_index == 0:
            yield from sched.start(ctx, r.prepare, PREPARE)
            yield from prepare(ctx, t)
            sched.finish(ctx, PREPARE, r.prepare,
                         [(("send_token", i), r.send_token + i) for i in range(BS * K)]
                         + [(("send_signal", e), r.send_signal + e) for e in range(t.E)])
    with ctx.phase("send_token"):
        expert_ids = ctx.tensor("expert_ids")
        for i in mine(ctx, t, BS * K):
            key = ("send_token", i)
            yield from sched.start(ctx, r.send_token + i, key, (PREPARE,))
            row, col = divmod(i, K)
            expert = int(ctx.gm_read_scalar(expert_ids, 4 * i, I32))
            offset = int(ctx.gm_read_scalar(offset_table, 4 * i, I32))
            ctx.scalar(4)  # remoteExpertOffset, remoteRankId, the views
            rank, le = divmod(expert, L)
            yield from ctx.shmem.mte_put_nbi(rank, win.data_at(le * W + me, offset),
                                             ctx.tensor("x"), row * s.token_bytes,
                                             s.token_bytes, row_buf, s.token_bytes,
                                             name="ShmemPut data")
            ctx.ub_write(msg, 0, np.array([me, row, col], I32), ops=INFO)  # SetTensorData
            ctx.shmem.put_ub(rank, win.info_at(le * W + me, offset), msg, 4 * INFO,
                             name="ShmemPut info")
            yield from ctx.drain()  # the task completes with its puts
            sched.finish(ctx, key, r.send_token + i,
                         [(("send_signal", expert), r.send_signal + expert)])
    with ctx.phase("send_signal"):
        for e in mine(ctx, t, t.E):
            key = ("send_signal", e)
            yield from sched.start(ctx, r.send_signal + e, key, (PREPARE, *announced[e]))
            rank, le = divmod(e, L)
            load = ctx.copy_in(cnt, total_offset, 4 * e, 4)
            yield from ctx.wait(load)
            put = ctx.shmem.put_ub(rank, win.count_at(le * W + me + 1), cnt, 4,
                                   name="ShmemPut count")
            yield from ctx.wait(put)
            ctx.ub_write(sig, 0, np.array([1, 0, 0, 0, 0, 0, 0, 0], I32), ops=1)
            ctx.set_atomic_add(I32)
            ctx.shmem.put_ub(rank, win.signal, sig, 4, name="ShmemSignal add")
            ctx.set_atomic_none()
            yield from ctx.drain()
            sched.finish(ctx, key, r.send_signal + e)
    with ctx.phase("receive_token"):
        recv = ctx.tensor("ep_recv_counts")
        if ctx.kind_index == 0:
            yield from receive_counts(ctx, t, sched, r)
        yield from receive_rows(ctx, t, sched, recv, r)
    yield from sched.close(ctx, r.total)


def prepare(ctx: KernelContext, t: PyptoTiling) -> Wait:
    """offsetTable[row, col] and totalOffset[e] by a scalar scan of expert_ids."""
    s = t.shape
    n = s.BS * s.K
    ids = ctx.dcache.load_run(ctx.tensor("expert_ids"), 0, n, I32)
    seen = np.zeros(t.E, I32)
    table = np.zeros(n, I32)
    for i, e in enumerate(ids):
        table[i] = seen[e]
        seen[e] += 1
    ctx.loop(n)
    ctx.scalar(3 * n)  # the count's load, increment and store
    ctx.dcache.store_run(ctx.tensor("offset_table"), 0, table)
    ctx.dcache.store_run(ctx.tensor("total_offset"), 0, seen)
    yield from ctx.shmem.quiet()  # the stores reach GM before the successors read them


def receive_counts(ctx: KernelContext, t: PyptoTiling, sched: Scheduler, r: Roots) -> Wait:
    """WaitUntil (the AICPU), ShmemGet of the E + 1 count entries, CumSum: the inclusive
    running counts of the slots go to ep_recv_counts. No task of this rank precedes it:
    the WaitUntil's `pred` is an input."""
    win, E = t.window, t.E
    yield from sched.start(ctx, r.counts, COUNTS, dispatch=False)
    yield from sched.wait_until(ctx, ctx.window(), win.signal, AllEqual(I32, E))
    ctx.store_remote(ctx.rank_id, win.signal, np.zeros(1, I32), name="WaitUntil reset")
    counts = ctx.alloc("shmemGetOut", (E + 1) * 4)
    cum = ctx.alloc("cumSumResult", (E + 1) * 4)
    load = ctx.copy_in(counts, ctx.window(), win.count_at(0), (E + 1) * 4,
                       strided=Strided(E + 1, 4, BLOCK - 4, 0), name="ShmemGet counts")
    yield from ctx.wait(load)

    def cumsum() -> None:  # entry 0 is 0: slot i's running count is at i + 1
        cum.view(I32, E + 1)[:] = np.roll(np.cumsum(counts.view(I32, E + 1)), -1)

    ctx.vector("CumSum", E + 1, I32, reads=(counts,), writes=(cum,), fn=cumsum)
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(ctx.tensor("ep_recv_counts"), 0, cum, 4 * E)
    yield from ctx.drain()
    rows = row_tasks(t, cum.view(I32, E))
    sched.finish(ctx, COUNTS, r.counts,
                 [(("row", i), r.receive + slot) for i, (slot, *_) in enumerate(rows)])


def row_tasks(t: PyptoTiling, ends: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The receive's leaf tasks from the running counts: per (slot, row) one, per slot
    with rows one for its info rows: (slot, first row, row or rows, is_info)."""
    tasks: list[tuple[int, int, int, int]] = []
    begin = 0
    for slot in range(t.E):
        n = int(ends[slot]) - begin
        tasks += [(slot, begin, j, 0) for j in range(n)]
        if n:
            tasks.append((slot, begin, n, 1))
        begin = int(ends[slot])
    return tasks


def receive_rows(ctx: KernelContext, t: PyptoTiling, sched: Scheduler, recv, r: Roots
                 ) -> Wait:
    """Per (slot, row) a ShmemGet of the row + Assemble into expandX, per slot one of its
    info rows into assistInfoForCombine; the tasks round robin over the AIVs, each
    released by the CumSum's completion."""
    s, win = t.shape, t.window
    yield from sched.enter(ctx, sched.device_task(r.counts))
    yield from sched.known(ctx, COUNTS)  # the AICPU knows the tasks now
    tasks = row_tasks(t, recv.read(0, 4 * t.E).view(I32))
    row_buf = ctx.alloc("row", s.token_bytes)
    info_buf = ctx.alloc("info", s.BS * 4 * INFO)
    expand_x, assist = ctx.tensor("expand_x"), ctx.tensor("assist_info_for_combine")
    for i in mine(ctx, t, len(tasks)):
        slot, first, j, is_info = tasks[i]
        yield from sched.start(ctx, r.receive + slot, ("row", i), (COUNTS,))
        ctx.gm_read_scalar(recv, 4 * slot, I32)  # GetTensorData: curCount and offset
        ctx.scalar(1)
        if is_info:
            load = ctx.copy_in(info_buf, ctx.window(), win.info_at(slot, 0), 4 * INFO * j,
                               strided=Strided(j, 4 * INFO, BLOCK - 4 * INFO, 0),
                               name="ShmemGet info")
            yield from ctx.wait(load)
            ctx.copy_out(assist, 4 * INFO * first, info_buf, 4 * INFO * j, name="Assemble")
        else:
            load = ctx.copy_in(row_buf, ctx.window(), win.data_at(slot, j), s.token_bytes,
                               name="ShmemGet data")
            yield from ctx.wait(load)
            ctx.copy_out(expand_x, (first + j) * s.token_bytes, row_buf, s.token_bytes,
                         name="Assemble")
        yield from ctx.drain()
        sched.finish(ctx, ("row", i), r.receive + slot)
