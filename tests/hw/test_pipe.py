"""An MTE pipe on its own: issue order, streaming one at a time, fences (hand arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.env import SimEnv
from npusim.errors import KernelError
from npusim.hw.config import load_hardware
from npusim.hw.machine import Machine
from npusim.hw.pipe import Op, TransferPipe
from npusim.runtime.launch import launch


def test_transfers_stream_in_order_and_a_fence_waits_for_every_delivery():
    env = SimEnv()
    pipe = TransferPipe(env, "mte3")
    log: list[tuple[str, str, float]] = []

    def transfer(name: str, stream_ns: float, flight_ns: float):
        op = Op(env, name, "mte3")

        def delivered(_e):
            log.append((name, "delivered", env.now))
            pipe.landed(op, env.now)
            pipe.delivered()

        def sent(_e):
            log.append((name, "sent", env.now))
            pipe.sent()
            env.timeout(flight_ns).callbacks.append(delivered)

        def begin():
            log.append((name, "start", env.now))
            pipe.began(op)
            env.timeout(stream_ns).callbacks.append(sent)
        return begin

    pipe.submit(2.0, transfer("a", 3.0, 10.0))  # free pipe: starts at its issue time, 2
    pipe.submit(0.0, transfer("b", 1.0, 10.0))  # streams once a's last byte has left, 5
    pipe.fence()
    pipe.submit(0.0, transfer("c", 1.0, 1.0))  # fenced: after a (15) and b (16) landed
    pipe.submit(0.0, transfer("d", 1.0, 1.0))  # unfenced, but behind c in issue order
    env.run()
    assert log == [
        ("a", "start", 2.0), ("a", "sent", 5.0), ("b", "start", 5.0), ("b", "sent", 6.0),
        ("a", "delivered", 15.0), ("b", "delivered", 16.0), ("c", "start", 16.0),
        ("c", "sent", 17.0), ("d", "start", 17.0), ("d", "sent", 18.0),
        ("c", "delivered", 18.0), ("d", "delivered", 19.0),
    ]
    # spans a [2, 15], b [5, 16], c [16, 18], d [17, 19]: 13 + 11 + 2 + 2 in flight, and a
    # transfer in flight from 2 to 19 (b lands at 16 as c starts)
    assert (pipe.busy_ns, pipe.busy_union_ns) == (28.0, 17.0)
    pipe.submit(25.0, transfer("e", 1.0, 1.0))  # after an idle gap: [25, 27] adds 2
    env.run()
    assert (pipe.busy_ns, pipe.busy_union_ns) == (30.0, 19.0)


# Atlas A3 with round numbers: 32 B puts stream in 3.2 ns at the 10 GB/s port (no link is
# narrower), a put flies 200 ns plus its level's latency, issuing costs nothing.
MIXED = {"chip.aiv_cores": 1, "scalar.cycles_per_op": 0.0, "scalar.loop_cycles": 0.0,
         "kernel.launch_ns": 0.0, "mte.put_gbps": 10.0, "mte.put_latency_ns": 200.0,
         "fabric.levels.package.latency_ns": 100.0, "fabric.levels.server.dies": 4,
         "fabric.levels.supernode.latency_ns": 5000.0}


def test_an_mte3_barrier_waits_for_an_earlier_put_that_lands_after_the_last():
    """A far put, then a near one: the near one lands first (6.4 + 300 = 306.4 ns), the far
    one at 3.2 + 5200 = 5203.2 ns. PipeBarrier<PIPE_MTE3> returns when both have landed,
    so the UB entry may be reused after it and the far rank still gets the 1.0 put."""
    m = Machine(load_hardware("atlas_a3", MIXED), world=8)  # servers of 4: ranks 0-3, 4-7
    seen: dict[str, float] = {}

    def program(ctx):
        if ctx.rank_id != 4:
            return
        entry = ctx.alloc("status", 32)
        ctx.ub_write(entry, 0, np.ones(8, np.float32), ops=0)
        far = ctx.put(0, 0, entry, 32, name="far")  # the other server
        near = ctx.put(5, 0, entry, 32, name="near")  # the same package
        yield from ctx.pipe_barrier("mte3")
        seen.update(barrier=ctx.t, far=far.done_at, near=near.done_at)
        ctx.ub_write(entry, 0, np.zeros(8, np.float32), ops=0)  # the next phase's UB

    launch(m, program)
    assert seen["near"] == pytest.approx(306.4)
    assert seen["far"] == pytest.approx(5203.2)
    assert seen["barrier"] == pytest.approx(5203.2)
    for rank in (0, 5):
        assert m.ranks[rank].window.read(0, 32).view(np.float32).tolist() == [1.0] * 8


def test_a_ub_reset_while_a_put_still_reads_its_buffer_is_a_race():
    """Without a barrier the far put (landing at 5203.2 ns) still reads the entry when the
    core resets its UB at 3.2 ns: a KernelError naming the buffer, not silent reuse."""
    m = Machine(load_hardware("atlas_a3", MIXED), world=8)

    def program(ctx):
        if ctx.rank_id != 4:
            return
        with ctx.phase("send_status"):
            entry = ctx.alloc("status", 32)
            ctx.ub_write(entry, 0, np.ones(8, np.float32), ops=0)
            ctx.put(0, 0, entry, 32)
            yield from ctx.sync()
            ctx.ub.reset()

    with pytest.raises(KernelError, match="'status'.*missing barrier") as info:
        launch(m, program)
    assert (info.value.rank, info.value.core, info.value.step) == (4, 0, "send_status")


def _puts_from_three_cores(second_offset: int) -> None:
    """Rank 0's cores 0, 1, 2 put into rank 1's window: core 0 64 B at 0x100 (in phase
    send_a), core 1 64 B at 0x140 (adjacent), core 2 32 B at `second_offset`."""
    m = Machine(load_hardware("ascend950", {"chip.aiv_cores": 3}), world=2)
    spans = {0: (0x100, 64, "send_a"), 1: (0x140, 64, "send_b"), 2: (second_offset, 32, "send_c")}

    def program(ctx):
        if ctx.rank_id != 0:
            return
        offset, nbytes, phase = spans[ctx.core_id]
        buf = ctx.alloc("row", nbytes)
        ctx.ub_write(buf, 0, np.ones(nbytes, np.uint8), ops=0)
        with ctx.phase(phase):
            ctx.put(1, offset, buf, nbytes, name="put_row")
            yield from ctx.pipe_barrier("mte3")

    launch(m, program)


def test_puts_to_disjoint_window_bytes_are_not_a_race():
    _puts_from_three_cores(0x180)  # just past core 1's [0x140, 0x180)


def test_a_put_onto_bytes_another_core_put_names_the_earlier_writer():
    # [0x120, 0x140) lies inside core 0's [0x100, 0x140); the blocks start one after
    # another, so core 0's put is the earlier one
    with pytest.raises(KernelError, match=r"rank 0, core 2, step .send_c., address 0x120.*"
                       r"overlaps the bytes an earlier put of this call wrote "
                       r"\(rank 0 core 0 send_a \[0x100, 0x140\)\): a race"):
        _puts_from_three_cores(0x120)
