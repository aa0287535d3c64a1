"""GM AtomicAdd, remote MTE2 pulls, ReadGmByPassDCache spins, remote scalar stores, the
generation-counter rank barrier and SyncAll in a MIX launch, timed by hand on the round
preset (conftest: 1 GHz, ports 10 GB/s, MTE latencies 100 ns, put 200 ns, link 50 ns,
free issue slots, no poll overhead)."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import DeadlockError, KernelError
from npusim.hw.machine import Machine
from npusim.runtime.conditions import AllEqual
from npusim.runtime.launch import launch
from tests.runtime.aichelp import aic_hw, mix_machine


def _adds(atomic: bool, t: dict):
    def program(ctx):
        if ctx.core_id == 2:  # polls the sum until both adds have landed
            into = ctx.alloc("poll", 32)
            yield from ctx.wait_until(ctx.tensor("acc"), 0, 16, AllEqual(np.float32, 3.0),
                                      into)
            t["seen"] = ctx.t
            return
        if ctx.core_id > 1:
            return
        buf = ctx.alloc("v", 32)
        if ctx.core_id == 1:  # lands later: 200 ns of vector work first
            ctx.fixed("vector", "work", 200.0, writes=[buf])
            yield from ctx.pipe_barrier("vector")
        ctx.ub_write(buf, 0, np.full(4, 1.0 + ctx.core_id, np.float32), ops=0)
        if atomic:
            ctx.set_atomic_add(np.float32)
        op = ctx.copy_out(ctx.tensor("acc"), 0, buf, 16)
        ctx.set_atomic_none()
        yield from ctx.wait(op)
        t[ctx.core_id] = op.done_at
    return program


def test_atomic_add_sums_every_landing_and_a_poller_sees_the_last():
    m = Machine(aic_hw(), 1)
    m.ranks[0].tensor("acc", np.zeros(4, np.float32))
    t = {}
    launch(m, _adds(True, t))
    # each add: 16 B at 10 GB/s = 1.6 ns + ub_to_gm latency 100
    assert t[0] == pytest.approx(101.6) and t[1] == pytest.approx(301.6)
    acc = m.ranks[0].tensors["acc"].as_array(np.float32, (4,))
    assert np.array_equal(acc, np.full(4, 3.0, np.float32))  # 1 + 2
    # the poll's period: read latency 100 + 16 B at 10 GB/s = 101.6 ns, first read landing
    # at 101.6; the first landing after 301.6 is the third: 3 x 101.6
    assert t["seen"] == pytest.approx(3 * 101.6)


def test_without_atomic_add_the_later_write_wins():
    m = Machine(aic_hw(), 1)
    m.ranks[0].tensor("acc", np.zeros(4, np.float32))
    with pytest.raises(DeadlockError, match="deadlock"):  # the sum 3.0 never appears
        launch(m, _adds(False, {}))
    acc = m.ranks[0].tensors["acc"].as_array(np.float32, (4,))
    assert np.array_equal(acc, np.full(4, 2.0, np.float32))


def test_a_remote_pull_takes_the_reverse_path_of_a_put():
    m = Machine(aic_hw(), 2)
    data = np.arange(1000, dtype=np.uint8)
    m.ranks[1].window.write(4096, data)
    t = {}

    def program(ctx):
        if (ctx.rank_id, ctx.core_id) != (0, 0):
            return
        buf = ctx.alloc("pulled", 1024)
        op = ctx.copy_in(buf, ctx.window(1), 4096, 1000)
        yield from ctx.wait(op)
        t["done"] = op.done_at
        t["bytes"] = ctx.ub_read(buf, np.uint8, 1000)

    launch(m, program)
    # 1000 B at the remote cap mte.put_gbps 10 GB/s = 100 ns; latency: the read's 100 ns
    # plus the switch's 50 ns out and back
    assert t["done"] == pytest.approx(100 + 100 + 2 * 50)
    assert np.array_equal(t["bytes"], data)
    links = {lk.name: lk.bytes for lk in m.fabric.resources()}
    assert links["rank1.egress"] == 1000 and links["rank0.ingress"] == 1000
    assert links["rank0.egress"] == 0
    assert (m.ranks[1].bytes_out, m.ranks[0].bytes_in) == (1000, 1000)


def test_a_spin_wakes_at_the_first_read_after_the_store_lands():
    m = Machine(aic_hw(), 1)
    t = {}

    def program(ctx):
        if ctx.core_id == 0:
            buf = ctx.alloc("x", 256)
            ctx.fixed("vector", "work", 150.0, writes=[buf])
            yield from ctx.pipe_barrier("vector")
            ctx.store_remote(0, 64, np.array([7], np.int32))  # own window: lands +100
        elif ctx.core_id == 1:
            got = yield from ctx.spin_until(ctx.window(), 64, AllEqual(np.int32, 7), 4,
                                            delay_cycles=100)
            t["woke"], t["value"] = ctx.t, got.view(np.int32)[0]
        yield from ()

    launch(m, program)
    # the store lands at 150 + 100 = 250; a read: latency 100 + 4 B at 10 GB/s = 100.4,
    # then the 100-cycle delay: reads land at 100.4, 300.8, ...; no delay after the hit
    assert t["woke"] == pytest.approx(300.8)
    assert t["value"] == 7


def test_the_generation_barrier_holds_each_core_until_its_peer_rank_arrived():
    m = Machine(aic_hw(), 2)
    ends = {}

    def program(ctx):
        if (ctx.rank_id, ctx.core_id) == (1, 0):  # arrives late
            buf = ctx.alloc("x", 256)
            ctx.fixed("vector", "work", 500.0, writes=[buf])
            yield from ctx.pipe_barrier("vector")
        yield from ctx.rank_barrier(0, generation=3)
        ends[(ctx.rank_id, ctx.core_id)] = ctx.t

    launch(m, program)
    # rank 1 core 0 stores into rank 0's slot 1 at 500: lands + put 200 + link 50 = 750;
    # rank 0 core 1 spins on it: reads land every 100.4 ns from 100.4 -> 8 x 100.4
    assert ends[(0, 1)] == pytest.approx(8 * 100.4)
    # rank 1 core 0 finds its slot 0 (stored by rank 0 core 1 at 0, landed at 250) at its
    # first read: 500 + 100.4
    assert ends[(1, 0)] == pytest.approx(600.4)
    # rank 0 core 0 and rank 1 core 1 read their own rank's store (landed at 100) at 100.4
    assert ends[(0, 0)] == pytest.approx(100.4) and ends[(1, 1)] == pytest.approx(100.4)
    for r in range(2):
        slots = m.ranks[r].window.read(0, 128).view(np.int32)[::16]
        assert slots.tolist() == [3, 3]
    assert (2, 0) not in ends and len(ends) == 2 * 4  # cores 2, 3 return at once


def test_sync_all_in_a_mix_launch_is_per_kind_or_every_core():
    ends = {}

    def program(ctx):
        if ctx.core.kind.name == "aic":
            buf = ctx.alloc("c", 1024, "l0c")
            ctx.fixed("cube", "mm", 400.0 * (ctx.block_idx + 1), writes=[buf])
            yield from ctx.pipe_barrier("cube")
            yield from ctx.sync_all(all_kinds=True)
        else:
            buf = ctx.alloc("x", 256)
            ctx.fixed("vector", "work", 100.0 * ctx.kind_index, writes=[buf])
            yield from ctx.pipe_barrier("vector")
            yield from ctx.sync_all()  # the AIVs only
            ends[("aiv", ctx.kind_index)] = ctx.t
            yield from ctx.sync_all(all_kinds=True)
        ends[(ctx.core.kind.name, ctx.kind_index, "all")] = ctx.t

    launch(mix_machine(aic_hw()), program)
    # the AIVs' SyncAll: the last AIV (300 ns) + syncall 70
    assert all(ends[("aiv", i)] == pytest.approx(370.0) for i in range(4))
    # all cores: the last AIC (block 1: 800 ns) + 70
    alls = [v for k, v in ends.items() if k[-1] == "all"]
    assert len(alls) == 6 and alls == pytest.approx([870.0] * 6)


def test_two_pulls_from_one_rank_share_its_egress():
    # rank 1's egress at 10 GB/s: two cores pulling 1000 B each at the same time get 5 GB/s
    m = Machine(aic_hw(fabric__egress_gbps=10.0), 2)
    ends = {}

    def program(ctx):
        if ctx.rank_id == 0 and ctx.core_id < 2:
            buf = ctx.alloc("pulled", 1024)
            op = ctx.copy_in(buf, ctx.window(1), 4096 * ctx.core_id, 1000)
            yield from ctx.wait(op)
            ends[ctx.core_id] = op.done_at

    launch(m, program)
    # 1000 B at 5 GB/s each = 200 ns, + 100 + 2 x 50
    assert ends == {0: pytest.approx(400.0), 1: pytest.approx(400.0)}


def test_an_aic_does_not_pull():
    def program(ctx):
        if ctx.core.kind.name == "aic" and ctx.block_idx == 0:
            buf = ctx.alloc("l1", 512, "l1")
            ctx.copy_in(buf, ctx.window(1), 0, 512)
        yield from ()

    with pytest.raises(KernelError, match=r"core kind aic has no remote MTE2 reads"):
        launch(mix_machine(aic_hw(), world=2), program)
