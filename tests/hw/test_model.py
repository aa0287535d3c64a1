"""The hardware model on its own: every expected time is hand arithmetic from round_hw."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import DeadlockError, KernelError
from npusim.hw.machine import Machine
from npusim.runtime.conditions import AllEqual
from npusim.runtime.launch import launch
from tests.conftest import round_hw


def _only(core_ids, body):
    """A program that runs `body` on the listed cores of every rank and idles elsewhere."""
    def program(ctx):
        if ctx.core_id in core_ids:
            yield from body(ctx)
    return program


def test_copy_in_takes_latency_plus_bytes_over_bandwidth(hw):
    m = Machine(hw, world=2)
    x = np.arange(4096, dtype=np.uint8)
    m.ranks[0].tensor("x", x)
    seen = {}

    def body(ctx):
        buf = ctx.alloc("in", 4096)
        op = ctx.copy_in(buf, ctx.tensor("x"), 0, 4096)
        yield from ctx.wait(op)
        seen[ctx.rank_id] = (ctx.t, ctx.ub_read(buf, np.uint8, 4096, ops=0))

    m.ranks[1].tensor("x", x[::-1].copy())
    launch(m, _only({0}, body))
    t, data = seen[0]
    assert t == pytest.approx(100 + 4096 / 10)  # latency + N / (10 B/ns)
    assert np.array_equal(data, x)
    assert np.array_equal(seen[1][1], x[::-1])


def test_two_cores_sharing_a_link_each_get_half():
    hw = round_hw(fabric__egress_gbps=10.0, mte__put_gbps=10.0)  # link = one core's port
    m = Machine(hw, world=2)
    times = {}

    def body(ctx):
        buf = ctx.alloc("out", 10000)
        ctx.ub_write(buf, 0, np.ones(10000, np.uint8), ops=0)
        if ctx.rank_id == 0:
            op = ctx.put(1, ctx.core_id * 10240, buf, 10000)
            yield from ctx.wait(op)
            times[ctx.core_id] = ctx.t

    launch(m, _only({0, 1}, body))
    # each core streams at 5 B/ns (half of 10): 10000 / 5 = 2000 ns, + put 200 + link 50
    assert times[0] == pytest.approx(2000 + 250)
    assert times[1] == pytest.approx(2000 + 250)


def test_one_core_alone_is_capped_by_its_port_not_the_link(hw):
    m = Machine(hw, world=2)
    times = {}

    def body(ctx):
        buf = ctx.alloc("out", 10000)
        ctx.ub_write(buf, 0, np.ones(10000, np.uint8), ops=0)
        if ctx.rank_id == 0:
            yield from ctx.wait(ctx.put(1, 0, buf, 10000))
            times[0] = ctx.t

    launch(m, _only({0}, body))
    assert times[0] == pytest.approx(10000 / 10 + 200 + 50)


def test_late_joiner_shares_then_first_flow_speeds_up_again():
    hw = round_hw(fabric__egress_gbps=10.0)
    m = Machine(hw, world=2)
    times = {}

    def body(ctx):
        buf = ctx.alloc("out", 10000)
        ctx.ub_write(buf, 0, np.ones(10000, np.uint8), ops=0)
        if ctx.rank_id == 0:
            if ctx.core_id == 1:
                ctx.t += 500  # starts 500 ns later
            yield from ctx.wait(ctx.put(1, ctx.core_id * 10240, buf, 10000))
            times[ctx.core_id] = ctx.t

    launch(m, _only({0, 1}, body))
    # core 0: 5000 B alone in 500 ns, then 5 B/ns; core 1 joins at 500.
    # core 0 has 5000 B left at 5 B/ns -> ends streaming at 1500; core 1 sent 5000 by 1500,
    # then 5000 B alone at 10 B/ns -> 2000.
    assert times[0] == pytest.approx(1500 + 250)
    assert times[1] == pytest.approx(2000 + 250)


def test_put_lands_at_the_modelled_time_and_not_before(hw):
    m = Machine(hw, world=2)
    arrival = 1000 / 10 + 200 + 50  # bytes / port + put latency + link latency
    samples = []

    def body(ctx):
        if ctx.rank_id == 0:
            buf = ctx.alloc("out", 1000)
            ctx.ub_write(buf, 0, np.full(1000, 7, np.uint8), ops=0)
            ctx.put(1, 4096, buf, 1000)
        else:  # an observer on the destination samples its window around the arrival
            for t in (arrival - 1, arrival + 1):
                ctx.t = t
                yield from ctx.sync()
                samples.append(ctx.window().read(4096, 1000))
        yield from ()

    launch(m, _only({0}, body))
    assert not samples[0].any()
    assert (samples[1] == 7).all()


def test_wait_until_wakes_at_the_first_poll_after_the_flag_arrives(hw):
    m = Machine(hw, world=2)
    woke = {}

    def body(ctx):
        if ctx.rank_id == 1:
            flag = ctx.alloc("flag", 32)
            yield from ctx.wait_until(ctx.window(), 0, 32, AllEqual(np.float32, 1.0), flag)
            woke["t"] = ctx.t
            woke["v"] = ctx.ub_read(flag, np.float32, 8, ops=0)
        else:
            buf = ctx.alloc("out", 32)
            ctx.ub_write(buf, 0, np.ones(8, np.float32), ops=0)
            ctx.t += 1000
            ctx.put(1, 0, buf, 32)

    launch(m, _only({0}, body))
    # flag lands at 1000 + 32/10 + 200 + 50 = 1253.2 ns. Poll read = 100 + 32/10 = 103.2 ns,
    # period 103.2 ns (no scalar cost), first poll lands at 103.2: polls land at 103.2*i.
    arrival = 1000 + 3.2 + 250
    period = 103.2
    i = -(-arrival // period)
    assert woke["t"] == pytest.approx(i * period)
    assert woke["t"] >= arrival and woke["t"] - arrival < period
    assert (woke["v"] == 1.0).all()


def test_wait_that_can_never_be_satisfied_is_a_diagnosed_deadlock(hw):
    m = Machine(hw, world=2)

    def body(ctx):
        flag = ctx.alloc("flag", 32)
        yield from ctx.wait_until(ctx.window(), 64, 32, AllEqual(np.float32, 1.0), flag)

    with pytest.raises(DeadlockError) as info:
        launch(m, _only({3}, body))
    text = str(info.value)
    assert "2 cores on 2 ranks" in text and "rank 0 core 3 at 0x40" in text and "1.0" in text
    assert [line.split(" in step")[0] for line in info.value.blocked] == [
        "rank 0 core 3", "rank 1 core 3"]


def test_ub_overflow_names_core_and_address(hw):
    m = Machine(hw, world=2)

    def body(ctx):
        ctx.alloc("a", 200 * 1024)
        ctx.alloc("b", 100 * 1024)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(m, _only({2}, body))
    e = info.value
    assert e.core == 2 and e.rank == 0
    assert e.address == 200 * 1024
    assert "core 2" in str(e) and "0x32000" in str(e) and "UB overflow" in str(e)


def test_out_of_window_put_names_core_and_address(hw):
    m = Machine(hw, world=2)

    def body(ctx):
        buf = ctx.alloc("out", 64)
        ctx.ub_write(buf, 0, np.zeros(64, np.uint8), ops=0)
        ctx.put(1, hw.window.bytes - 32, buf, 64)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(m, _only({1}, body))
    e = info.value
    assert e.core == 1 and e.address == hw.window.bytes - 32 and e.size == 64
    assert "outside 'window'" in str(e)


def test_reading_ub_before_its_copy_lands_is_a_race(hw):
    m = Machine(hw, world=1 + 1)
    m.ranks[0].tensor("x", 256)
    m.ranks[1].tensor("x", 256)

    def body(ctx):
        buf = ctx.alloc("in", 256)
        out = ctx.alloc("out", 256)
        ctx.copy_in(buf, ctx.tensor("x"), 0, 256)
        ctx.vector("add", 128, "float16", reads=[buf], writes=[out])  # no wait: a race
        yield from ()

    with pytest.raises(KernelError, match="missing wait"):
        launch(m, _only({0}, body))


def test_syncall_releases_all_cores_at_the_last_arrival(hw):
    m = Machine(hw, world=2)
    left = {}

    def program(ctx):
        ctx.t += 100 * (ctx.core_id + 1)  # arrivals at 100, 200, 300, 400
        yield from ctx.sync_all()
        left[(ctx.rank_id, ctx.core_id)] = ctx.t

    launch(m, program)
    assert sorted(left.values()) == pytest.approx([400 + 70] * len(left))
    assert len(left) == 2 * hw.chip.aiv_cores


def test_vector_cost_is_issue_plus_repeats_per_pass():
    hw = round_hw(vector__issue_cycles=8.0)
    m = Machine(hw, world=2)
    ends = []

    def body(ctx):
        buf = ctx.alloc("v", 8192)
        ctx.ub_write(buf, 0, np.zeros(8192, np.uint8), ops=0)
        op = ctx.vector("mul", 4096, "float16", reads=[buf], writes=[buf], passes=2)
        ends.append(op.done_at)
        yield from ()

    launch(m, _only({0}, body))
    # 4096 fp16 = 8192 B = 32 repeats of 256 B, 2 passes, + 8 issue cycles at 1 GHz
    assert ends[0] == pytest.approx(8 + 64)


@pytest.mark.parametrize("busy_until", [0.0, 500.0])  # vector pipe idle / still busy
def test_a_vector_run_times_like_its_instructions_issued_one_by_one(busy_until):
    # scalar issue 2 ns a slot, vector start 8 cycles, VF micro-instruction 0.5 cycle
    hw = round_hw(scalar__cycles_per_op=2.0, vector__issue_cycles=8.0,
                  vector__vf_cycles_per_instr=0.5)
    m = Machine(hw, world=2)
    seen = {}

    def body(ctx):
        buf = ctx.alloc("v", 8192)
        ctx.ub_write(buf, 0, np.zeros(8192, np.uint8), ops=0)
        t0 = ctx.t
        ctx.core.vector.free_at = t0 + busy_until
        if ctx.core_id == 0:  # a run of two instructions and a run of two VFs, one call each
            ctx.vector_seq("run", [("a", 4096, "float16"), ("b", 1024, "float32")],
                           reads=[buf], writes=[buf])
            op = ctx.vector_function("vfs", [20, 40], reads=[buf], writes=[buf])
        else:  # the same four, one by one
            ctx.vector("a", 4096, "float16", reads=[buf], writes=[buf])
            ctx.vector("b", 1024, "float32", reads=[buf], writes=[buf])
            ctx.vector_function("vf1", 20, reads=[buf], writes=[buf])
            op = ctx.vector_function("vf2", 40, reads=[buf], writes=[buf])
        seen[ctx.core_id] = (op.done_at - t0, ctx.t - t0)
        yield from ()

    launch(m, _only({0, 1}, body))
    # by hand: the first starts one issue slot (2 ns) after t0, or when the pipe frees;
    # a: 8 + 32 repeats, b: 8 + 16, vf1: 8 + 10, vf2: 8 + 20 cycles at 1 GHz, back to back
    first = max(2.0, busy_until)
    assert seen[0][0] == pytest.approx(first + 40 + 24 + 18 + 28)
    assert seen[1][0] == pytest.approx(seen[0][0])
    assert seen[0][1] == seen[1][1] == pytest.approx(4 * 2.0)  # four issue slots


def test_strided_poll_lands_each_flag_in_its_own_ub_block(hw):
    from npusim.runtime.context import Strided

    m = Machine(hw, world=2)
    seen = {}

    def body(ctx):
        if ctx.rank_id == 0:
            buf = ctx.alloc("flags", 3 * 512)
            vals = np.zeros(3 * 128, np.float32)
            vals[120::128] = [1.0, 1.0, 1.0]  # the word at byte 480 of each 512 B block
            vals[121::128] = [5.0, 6.0, 7.0]  # not polled
            ctx.ub_write(buf, 0, vals, ops=0)
            ctx.put(1, 0, buf, 3 * 512)
        else:
            into = ctx.alloc("into", 96)
            read = Strided(3, 4, src_gap=508, dst_gap=28)
            yield from ctx.wait_until(ctx.window(), 480, 0, AllEqual(np.float32, 1.0), into,
                                      strided=read)
            seen["ub"] = into.view(np.float32, 24).copy()  # raw bytes, gaps included
        yield from ()

    launch(m, _only({0}, body))
    ub = seen["ub"].reshape(3, 8)
    assert ub[:, 0].tolist() == [1.0, 1.0, 1.0]
    assert not ub[:, 1:].any()  # the 28 B after each 4 B flag are untouched (zero)


def test_round_robin_poll_returns_the_first_area_to_arrive_in_rotation(hw):
    from npusim.runtime.context import Poll

    m = Machine(hw, world=2)
    got = {}

    def body(ctx):
        if ctx.rank_id == 0:
            buf = ctx.alloc("flag", 32)
            ctx.ub_write(buf, 0, np.ones(8, np.float32), ops=0)
            ctx.t += 2000
            ctx.put(1, 64, buf, 32)  # only area 2 ever gets its flag
        else:
            bufs = [ctx.alloc(f"b{i}", 32) for i in range(3)]
            polls = [Poll(ctx.window(), 32 * i, AllEqual(np.float32, 1.0), bufs[i], 32)
                     for i in range(3)]
            got["index"] = yield from ctx.poll_round_robin(polls, start=1)
            got["t"] = ctx.t
        yield from ()

    launch(m, _only({0}, body))
    assert got["index"] == 2
    # Flag lands at 2000 + 3.2 + 250 = 2253.2. Each poll costs 103.2 ns and the rotation
    # starts at area 1, so area 2's polls land at 2 * 103.2 + k * 3 * 103.2.
    arrival, period = 2253.2, 103.2
    k = -(-(arrival - 2 * period) // (3 * period))
    assert got["t"] == pytest.approx(2 * period + k * 3 * period)


def test_round_robin_observer_hears_each_content_with_its_first_read(hw):
    """poll_round_robin(observe=...): every area's content at the start, with the time its
    first read lands, and the flag when it lands, with the first read after it."""
    from npusim.runtime.context import Poll

    m = Machine(hw, world=2)
    heard = []

    def body(ctx):
        if ctx.rank_id == 0:
            buf = ctx.alloc("flag", 32)
            ctx.ub_write(buf, 0, np.ones(8, np.float32), ops=0)
            ctx.t += 2000
            ctx.put(1, 64, buf, 32)
        else:
            bufs = [ctx.alloc(f"b{i}", 32) for i in range(3)]
            polls = [Poll(ctx.window(), 32 * i, AllEqual(np.float32, 1.0), bufs[i], 32)
                     for i in range(3)]
            yield from ctx.poll_round_robin(
                polls, start=1,
                observe=lambda i, at, data: heard.append((i, at, bool(data.any()))))
        yield from ()

    launch(m, _only({0}, body))
    period = 103.2  # each poll: 3.2 ns of bytes + 100 ns latency (as above)
    start = {(i, flag): at for i, at, flag in reversed(heard)}  # the first of each
    # rotation from area 1: first reads land after 1, 2 and 3 polls
    assert start[(1, False)] == pytest.approx(period)
    assert start[(2, False)] == pytest.approx(2 * period)
    assert start[(0, False)] == pytest.approx(3 * period)
    arrival = 2253.2
    k = -(-(arrival - 2 * period) // (3 * period))
    assert start[(2, True)] == pytest.approx(2 * period + k * 3 * period)
    assert (0, True) not in start and (1, True) not in start


@pytest.mark.parametrize("completion, done", [("landed", 350.0), ("acked", 400.0)])
def test_a_put_completes_when_it_lands_or_when_its_write_response_is_back(completion, done):
    # 1000 B / 10 GB/s + 200 ns put latency + 50 ns link = lands at 350 ns; acked, the
    # response takes the link's 50 ns back before the put completes
    m = Machine(round_hw(mte__put_completion=completion), world=2)
    seen = {}

    def body(ctx):
        if ctx.rank_id == 0:
            buf = ctx.alloc("out", 1000)
            ctx.ub_write(buf, 0, np.full(1000, 7, np.uint8), ops=0)
            op = ctx.put(1, 4096, buf, 1000)
            yield from ctx.wait(op)
            seen["wait"] = ctx.t
            ctx.put(1, 8192, buf, 1000)
            yield from ctx.pipe_barrier("mte3")
            seen["barrier"] = ctx.t
        else:
            ctx.t = 351.0
            yield from ctx.sync()
            seen["landed"] = ctx.window().read(4096, 1000).copy()

    launch(m, _only({0}, body))
    assert seen["wait"] == pytest.approx(done)
    assert seen["barrier"] == pytest.approx(2 * done)
    assert (seen["landed"] == 7).all()  # the bytes are in at landing either way


def test_a_put_to_the_own_rank_has_no_response_trip():
    m = Machine(round_hw(mte__put_completion="acked"), world=2)
    seen = {}

    def body(ctx):
        buf = ctx.alloc("out", 1000)
        ctx.ub_write(buf, 0, np.full(1000, 7, np.uint8), ops=0)
        yield from ctx.wait(ctx.put(ctx.rank_id, 0, buf, 1000))
        seen[ctx.rank_id] = ctx.t

    launch(m, _only({0}, body))
    assert seen[0] == pytest.approx(1000 / 10 + 100)  # UB -> own GM: port rate + MTE3 head


@pytest.mark.parametrize("value", ["sent", 1, ""])
def test_a_put_completion_other_than_landed_or_acked_is_one_line(value):
    from npusim.errors import InputError
    with pytest.raises(InputError) as exc:
        round_hw(mte__put_completion=value)
    msg = str(exc.value)
    assert "mte.put_completion" in msg and "landed, acked" in msg and "\n" not in msg
