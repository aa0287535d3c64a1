"""Symmetric heap tensors, aclshmem_ptr and aclshmem_barrier_all (npusim.runtime.symmetric,
npusim.runtime.shmem) on round hardware (conftest.round_hw: 1 GHz, zero issue cost, 10 GB/s
ports, MTE2 latency 100 ns, put latency 200 + link 50 ns, local write latency 100 ns), the
data cache at miss 100 ns, dcci 50 ns: every expected time is hand arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import KernelError
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from npusim.runtime.symmetric import heap_tensor
from tests.conftest import round_hw

MISS, DCCI = 100.0, 50.0
LINK = 50.0
HEAP = 1 << 20  # the tensor's heap offset on every rank
SYNC = 4 << 20  # the sync pool's offset


def _machine(world: int) -> Machine:
    m = Machine(round_hw(dcache__miss_ns=MISS, dcache__dcci_ns=DCCI), world=world)
    for r, rank in enumerate(m.ranks):
        heap_tensor(rank, "sym", HEAP, np.full(256, r + 1, np.uint8))
        rank.tensor("plain", 256)
    return m


def test_a_heap_tensor_is_the_window_at_its_offset():
    m = _machine(2)
    t = m.ranks[1].tensors["sym"]
    assert t.heap_offset == HEAP and t.nbytes == 256
    assert np.array_equal(m.ranks[1].window.read(HEAP, 256), np.full(256, 2, np.uint8))
    t.write(8, np.array([9, 9], np.uint8))
    assert list(m.ranks[1].window.read(HEAP + 8, 2)) == [9, 9]
    assert t.as_array(np.uint8)[8] == 9


def test_ptr_then_put_writes_the_peer_tensor_and_copy_in_pulls_it():
    m = _machine(2)
    seen = {}

    def program(ctx):
        if ctx.core_id or ctx.rank_id:
            return
        buf = ctx.alloc("row", 100)
        ctx.ub_write(buf, 0, np.full(100, 7, np.uint8), ops=0)
        win, off = ctx.shmem.ptr("sym", 1)
        put = ctx.put(1, off + 50, buf, 100, name="row")
        yield from ctx.wait(put)
        seen["put"] = ctx.t
        back = ctx.alloc("back", 256)
        yield from ctx.wait(ctx.copy_in(back, win, off, 200))
        seen["pull"] = ctx.t - seen["put"]
        seen["bytes"] = ctx.ub_read(back, np.uint8, 200, ops=0).copy()

    launch(m, program)
    # the put: latency 200 + link 50 + 100 B at 10 GB/s
    assert seen["put"] == pytest.approx(250 + 10)
    # the pull: MTE2 latency 100 + the link both ways + 200 B at the remote cap 10 GB/s
    assert seen["pull"] == pytest.approx(100 + 2 * LINK + 20)
    want = np.full(200, 2, np.uint8)
    want[50:150] = 7
    assert np.array_equal(seen["bytes"], want)
    assert np.array_equal(m.ranks[1].tensors["sym"].as_array(np.uint8)[:200], want)


def test_ptr_of_a_plain_gm_tensor_is_refused():
    m = _machine(2)

    def program(ctx):
        ctx.shmem.ptr("plain", 1)
        yield from ctx.sync()

    with pytest.raises(KernelError, match="not a symmetric heap tensor"):
        launch(m, program, cores=1)


def _zones(m: Machine) -> None:
    for rank in m.ranks:
        rank.window.set_zones({"sym": (HEAP, HEAP + 256), "sync": (SYNC, SYNC + 128)})


def _barrier_all(world: int, late: float, who: tuple[int, int], cores: int | None = None
                 ) -> tuple[Machine, dict]:
    """barrier_all on every core of `world` ranks, core `who` (rank, core) `late` ns late:
    the machine and when each core left."""
    m = _machine(world)
    _zones(m)
    left = {}

    def program(ctx):
        if (ctx.rank_id, ctx.core_id) == who:
            ctx.t += late
        yield from ctx.shmem.barrier_all(SYNC)
        left[ctx.rank_id, ctx.core_id] = ctx.t

    launch(m, program, cores=cores)
    return m, left


def test_barrier_all_holds_every_pe_until_the_last_arrives():
    late = 5000.0
    m, left = _barrier_all(3, late, (2, 0), cores=1)
    # one core per rank: no core barrier rounds; k = 1, so core 0 walks PEs 0, 1, 2: its
    # own sync_array gets count 1, the others are polled. Rank 2 starts at 5000, misses on
    # the two counters (core pool, sync_counter: 100 each), finds PEs 0 and 1 set at its
    # first poll of each (dcci, the line fill, the link both ways: 250), then stores its
    # own: dcci 50, the line lands after the local write 100 + 64 B at 10 GB/s
    poll = DCCI + MISS + 2 * LINK
    landed = late + 2 * MISS + 2 * poll + DCCI + 100 + 6.4
    for r in (0, 1):
        assert landed <= left[r, 0] <= landed + poll + 1e-6
    for rank in m.ranks:
        assert rank.window.read(SYNC, 4).view(np.int32)[0] == 1  # count
        assert rank.window.read(SYNC + 64, 4).view(np.int32)[0] == 1  # sync_counter


def test_barrier_all_holds_every_core_of_every_pe_for_one_late_core():
    late = 3000.0
    m, left = _barrier_all(2, late, (1, 3))  # 4 cores: k = min(8, 2 PEs, 4 cores) = 2
    # rank 1's core barrier waits for its core 3, so its PE signal comes after 3000; the
    # closing core barrier then holds all four cores of rank 0 behind the core that polls
    assert min(left.values()) >= late
    for rank in m.ranks:
        assert rank.window.read(SYNC + 64, 4).view(np.int32)[0] == 1
