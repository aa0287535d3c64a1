"""pyPTO's runtime model (npusim/kernels/pypto_shmem/scheduler.py) on stand-in cores whose
work takes a known time, so that every start time follows by hand: data-driven release
(a successor waits only for its producers, released one after the other by the producer's
AICPU), no wait for an unrelated task of the next loop, the sync between device tasks, and
the device tasks a stitch bound makes of the dispatch's root functions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import simpy

from npusim.kernels.pypto_shmem.dispatch import Roots
from npusim.kernels.pypto_shmem.scheduler import Scheduler, Timeline
from npusim.kernels.pypto_shmem.tiling import PyptoTiling
from npusim.workload.shape import MoeShape

# round numbers, each far from the others, so a wrong term shows
DISPATCH, COMPLETION, RESOLVE, SUBMIT = 100.0, 10.0, 1000.0, 5000.0


class Core:
    """What the scheduler reads of a KernelContext: its rank, row, clock, preset, and a
    wait that blocks until an op is done."""

    def __init__(self, env: simpy.Environment, row: int, cores: int = 2) -> None:
        aicpu = SimpleNamespace(cores=cores, task_dispatch_ns=DISPATCH,
                                completion_ns=COMPLETION, resolve_ns=RESOLVE,
                                submit_ns=SUBMIT, poll_ns=1000.0)
        self.env, self.cfg, self.rank_id, self.core_id = env, SimpleNamespace(aicpu=aicpu), 0, row
        self.t = 0.0
        self.notes = None

    def wait(self, op):
        if op.done_at is None:
            yield op.event()
            self.t = max(self.t, self.env.now)
        else:
            self.t = max(self.t, op.done_at)


def _task(sched: Scheduler, core: Core, root: int, key, preds, work: float, succ, starts: dict):
    yield from sched.start(core, root, key, preds)
    starts[key] = core.t
    core.t += work
    sched.finish(core, key, root, succ)


def _run(sched: Scheduler, plan: dict[int, list[tuple]], roots: int) -> dict:
    """plan: core row -> its tasks in order (root, key, preds, work, successors as
    (key, root))."""
    env, starts = simpy.Environment(), {}
    cores = {row: Core(env, row) for row in plan}

    def program(core: Core, tasks: list[tuple]):
        for root, key, preds, work, succ in tasks:
            yield from _task(sched, core, root, key, preds, work, succ, starts)
        yield from sched.close(core, roots)

    for row, tasks in plan.items():
        env.process(program(cores[row], tasks))
    env.run()
    return starts


def test_successors_start_when_their_producer_releases_them_one_after_the_other():
    # P on row 0 (AICPU 0): dispatched 0..100, works 500, done 600; AICPU 0 reads the
    # completion 600..610 and releases A at 1610 and B at 2610. A on row 1 (AICPU 1) is
    # dispatched 1610..1710; B on row 2 (AICPU 0, busy until 2610) 2610..2710. X on row 3
    # (AICPU 1), the next loop but reading only inputs, starts at 100: no SyncAll.
    plan = {0: [(0, "P", (), 500.0, [("A", 1), ("B", 2)])],
            1: [(1, "A", ("P",), 50.0, [])],
            2: [(2, "B", ("P",), 50.0, [])],
            3: [(3, "X", (), 50.0, [])]}
    starts = _run(Scheduler(stitch=128, parties=4), plan, roots=4)
    assert starts == {"P": 100.0, "A": 1710.0, "B": 2710.0, "X": 100.0}


def test_a_device_task_starts_submit_ns_after_the_last_core_is_done_with_the_one_before():
    # stitch 2: roots 0, 1 form device task 0, root 2 device task 1. Row 0's task (root 0)
    # runs 100..400, row 1's (root 1) 100..900. Row 1 arrives at device task 1 at 900, row
    # 0 at 400: it opens at 900 + 5000 = 5900, the task of root 2 on row 0 (which waits for
    # nothing else) is dispatched 5900..6000.
    plan = {0: [(0, "a", (), 300.0, []), (2, "c", (), 10.0, [])],
            1: [(1, "b", (), 800.0, [])]}
    starts = _run(Scheduler(stitch=2, parties=2), plan, roots=3)
    assert starts == {"a": 100.0, "b": 100.0, "c": 6000.0}


def test_a_successor_in_a_later_device_task_costs_no_release():
    # stitch 2: P (root 0) feeds A (root 1, its device task) and B (root 2, the next). P
    # runs 100..600; AICPU 0 reads it 600..610 and releases A only, at 1610: A (row 1,
    # AICPU 1) starts 1710, ends 1760. Device task 1 opens at the last arrival, row 1's at
    # 1760, + 5000 = 6760; B on row 2 (AICPU 0, free since 1610) starts 6860.
    plan = {0: [(0, "P", (), 500.0, [("A", 1), ("B", 2)])],
            1: [(1, "A", ("P",), 50.0, [])],
            2: [(2, "B", ("P",), 50.0, [])]}
    starts = _run(Scheduler(stitch=2, parties=3), plan, roots=3)
    assert starts == {"P": 100.0, "A": 1710.0, "B": 6860.0}


def test_an_aicpu_serves_requests_in_the_first_gap_that_fits_whatever_their_order():
    line = Timeline()
    assert line.reserve(1000.0, 100.0) == 1000.0
    assert line.reserve(0.0, 100.0) == 0.0  # asked later, earlier in time: before it
    assert line.reserve(950.0, 100.0) == 1100.0  # overlaps the first: after it
    assert line.reserve(100.0, 900.0) == 100.0  # fits exactly between


def test_the_dispatch_root_functions_and_the_submissions_a_stitch_bound_makes():
    # the public test's shape: W 16, 160 experts (10 a rank), BS 8, K 8: Prepare, 64
    # send_token iterations, 160 send_signal, the CumSum, 160 receive slots
    t = PyptoTiling(MoeShape(W=16, BS=8, H=5120, K=8, L=10), block_dim=24)
    r = Roots(t)
    assert (r.send_token, r.send_signal, r.counts, r.receive, r.total) == (1, 65, 225, 226, 386)
    for stitch, submissions in ((1, 386), (128, math.ceil(386 / 128)), (1024, 1)):
        assert Scheduler(stitch, 1).device_task(r.total - 1) + 1 == submissions
