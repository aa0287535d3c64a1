"""SHMEM's SDMA calls (npusim.runtime.sdma) on a round atlas_a3: 1 GHz with zero issue
cost, MTE 4 GB/s at 100 ns both ways (a 4 B word: 1 + 100 ns), data cache miss 100 ns,
dcci 50 ns, dcci of the whole cache 300 ns, poll tail 10 ns; SDMA 100 GB/s, 1000 ns;
ranks 0 and 2 meet at the server level (196 GB/s ports, 500 ns). Every expected time is
hand arithmetic from those figures."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.trace import Trace
from npusim.errors import KernelError
from npusim.hw.config import load_hardware
from npusim.hw.cores import AIV, SDMA
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from npusim.runtime.sdma import _RECV, _REMOTE, WORKSPACE, Sdma, _line

MIB = 1 << 20
ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "mte.ub_to_gm_gbps": 4.0,
         "mte.ub_to_gm_latency_ns": 100.0, "mte.gm_to_ub_gbps": 4.0,
         "mte.gm_to_ub_latency_ns": 100.0, "dcache.miss_ns": 100.0, "dcache.dcci_ns": 50.0,
         "dcache.dcci_entire_ns": 300.0, "sync.poll_cycles": 10.0,
         "sdma.bandwidth_gbps": 100.0, "sdma.latency_ns": 1000.0}
SET_VALUE = 4 / 4.0 + 100.0  # UB store (free), drain (nothing open), 4 B MTE3, its wait
POST = SET_VALUE + 50.0 + 100.0 + 300.0 + 2 * SET_VALUE  # flag, dcci+miss, flush, bell+tail
BELL = SET_VALUE + 150.0 + 300.0 + SET_VALUE  # when the doorbell has landed


def _machine(world=4, **extra):
    hw = load_hardware("atlas_a3", {**ROUND, **extra})
    m = Machine(hw, world, Trace(), (AIV, SDMA))
    for r in m.ranks:
        r.tensor("x", (np.arange(3 * MIB) % 251).astype(np.uint8))
    return m


def _on_core0_of_rank0(body):
    def program(ctx):
        if ctx.rank_id == 0 and ctx.core_id == 0:
            yield from body(ctx, Sdma(ctx, ctx.alloc("sdma_tmp", 64)))
    return program


def test_a_put_costs_the_core_its_sqe_post_and_the_bytes_land_after_the_engine():
    seen = {}

    def body(ctx, sdma):
        yield from sdma.put_nbi(2, 4096, ctx.tensor("x"), 0, MIB)
        seen["after_put"] = ctx.t

    m = _machine()
    res = launch(m, _on_core0_of_rank0(body), launch_ns=0.0, cores=1)
    assert seen["after_put"] == pytest.approx(POST)  # 753 ns
    assert res.core_end_ns[0][0] == pytest.approx(753.0)
    m.env.run()  # the kernel has returned; the engine goes on
    # the engine starts at the doorbell: 1 MiB at 100 GB/s, then 1000 + 500 ns
    assert m.env.now == pytest.approx(BELL + MIB / 100.0 + 1500.0)
    assert np.array_equal(m.ranks[2].window.read(4096, MIB), m.ranks[0].tensors["x"].read(0, MIB))
    assert res.contexts[0][0].transfers[("start", "sdma", "sdma_put_nbi", True)] == [1, MIB]
    assert res.contexts[0][0].bytes_put == MIB  # a remote put of the core's, on SDMA


def test_quiet_waits_for_the_flag_sqe_behind_the_data_and_polls_for_it():
    def body(ctx, sdma):
        yield from sdma.put_nbi(2, 0, ctx.tensor("x"), 0, MIB)
        yield from sdma.quiet()

    m = _machine()
    res = launch(m, _on_core0_of_rank0(body), launch_ns=0.0, cores=1)
    data = BELL + MIB / 100.0 + 1500.0  # 12637.76
    flag = data + 8 / 100.0 + 1000.0  # fenced: after the data; local, 8 B
    t0 = POST + 150.0 + 300.0 + 2 * SET_VALUE  # the quiet's own post: 1405
    read, rest, tail = 100.0 + 4 / 4.0, SET_VALUE + 50.0 + 100.0, 10.0
    cycle = read + rest + tail  # 362 ns per iteration of the poll loop
    q = int(np.ceil((flag - t0 - read) / cycle))  # 34
    wake = t0 + read + q * cycle
    assert res.core_end_ns[0][0] == pytest.approx(wake + rest + tail + 2 * SET_VALUE)  # 14277
    ws = m.ranks[0].tensors[WORKSPACE]
    assert ws.read(_line(_REMOTE, 0), 8).view(np.uint32).tolist() == [0, 0]  # cleared
    assert ws.read(_line(_RECV, 0), 4).view(np.uint32)[0] == 0


def test_a_put_over_1_mib_posts_one_sqe_per_mib_streaming_back_to_back():
    def body(ctx, sdma):
        yield from sdma.put_nbi(2, 0, ctx.tensor("x"), 0, 2 * MIB + MIB // 2)

    m = _machine()
    res = launch(m, _on_core0_of_rank0(body), launch_ns=0.0, cores=1)
    assert res.core_end_ns[0][0] == pytest.approx(753.0)  # zero-cost SQE fills
    m.env.run()
    assert res.contexts[0][0].transfers[("start", "sdma", "sdma_put_nbi", True)] == \
        [3, 2 * MIB + MIB // 2]
    assert m.env.now == pytest.approx(BELL + 2.5 * MIB / 100.0 + 1500.0)


def test_the_sqe_fill_costs_its_scalar_accesses():
    def body(ctx, sdma):
        yield from sdma.put_nbi(2, 0, ctx.tensor("x"), 0, 3 * MIB)

    m = _machine(**{"scalar.cycles_per_op": 1.0})  # 1 ns per slot
    res = launch(m, _on_core0_of_rank0(body), launch_ns=0.0, cores=1)
    # slots: 3 set_values x 2 (UB store, MTE3 issue), the tail load's issue,
    # 3 SQEs x (5 loads + 21 stores)
    assert res.core_end_ns[0][0] == pytest.approx(753.0 + 6 + 1 + 3 * 26)


def test_the_950_has_no_sdma_engine():
    hw = load_hardware("ascend950")
    m = Machine(hw, 2, Trace(), (AIV,))

    def program(ctx):
        Sdma(ctx, ctx.alloc("sdma_tmp", 64))
        yield from ()

    with pytest.raises(KernelError, match="no SDMA engine"):
        launch(m, program, cores=1)


def test_the_detailed_trace_shows_the_sqe_on_the_posting_cores_sdma_lane():
    def body(ctx, sdma):
        yield from sdma.put_nbi(2, 0, ctx.tensor("x"), 0, MIB)

    hw = load_hardware("atlas_a3", ROUND)
    m = Machine(hw, 4, Trace(detailed=True), (AIV, SDMA))
    m.ranks[0].tensor("x", np.zeros(MIB, np.uint8))
    launch(m, _on_core0_of_rank0(body), launch_ns=0.0, cores=1)
    m.env.run()
    (span,) = [s for s in m.trace.spans if s.lane == "sdma"]
    assert (span.rank, span.core, span.name, span.bytes) == (0, 0, "sdma_put_nbi", MIB)
    assert span.start_ns == pytest.approx(BELL)
    assert span.end_ns == pytest.approx(BELL + MIB / 100.0)  # the last byte has left
    assert span.delivered_ns == pytest.approx(BELL + MIB / 100.0 + 1500.0)


def test_a_kernel_without_the_engine_declared_is_told_so():
    m = Machine(load_hardware("atlas_a3", ROUND), 2, Trace(), (AIV,))

    def program(ctx):
        Sdma(ctx, ctx.alloc("sdma_tmp", 64))
        yield from ()

    with pytest.raises(KernelError, match="Kernel.engines"):
        launch(m, program, cores=1)
