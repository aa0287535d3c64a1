"""Host memory (npusim.hw.host, npusim.runtime.hostmem) on a round atlas_a3: 1 GHz with zero
issue cost, MTE 10 GB/s (remote cap 10 GB/s, put latency 200 ns, read latency 100 ns), data
cache miss 100 ns, dcci 50 ns, dcci of the whole cache 300 ns; SDMA 100 GB/s, 1000 ns;
host: 16 dies and 4 sockets per server, a die's host port 100 GB/s, a socket's CPU port 50
GB/s and DRAM 40 GB/s, 1000 ns one way; the supernode adds 5500 - 500 = 5000 ns between
servers. Every expected figure is hand arithmetic from those numbers."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.trace import Trace
from npusim.hw.config import load_hardware
from npusim.hw.cores import AIV, SDMA
from npusim.hw.host import capacity_problem, path_problem, server_latency_ns, socket_of
from npusim.hw.machine import Machine
from npusim.runtime import hostmem
from npusim.runtime.launch import launch

MIB = 1 << 20
ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "mte.ub_to_gm_gbps": 4.0,
         "mte.ub_to_gm_latency_ns": 100.0, "mte.gm_to_ub_gbps": 10.0,
         "mte.gm_to_ub_latency_ns": 100.0, "mte.put_gbps": 10.0, "mte.put_latency_ns": 200.0,
         "dcache.miss_ns": 100.0, "dcache.dcci_ns": 50.0, "dcache.dcci_entire_ns": 300.0,
         "sync.poll_cycles": 10.0, "sdma.bandwidth_gbps": 100.0, "sdma.latency_ns": 1000.0,
         "host.npu_link_gbps": 100.0, "host.write_gbps": 50.0, "host.read_gbps": 50.0,
         "host.dram_gbps": 40.0,
         "host.latency_ns": 1000.0, "l2.bytes": 0}
SET_VALUE = 4 / 4.0 + 100.0  # runtime.sdma's set_value: a 4 B MTE3 write and its wait
BELL = SET_VALUE + 150.0 + 300.0 + SET_VALUE  # the doorbell has landed (test_sdma_api.py)


def _hw(**extra):
    return load_hardware("atlas_a3", {**ROUND, **extra})


def _machine(world=2, **extra):
    m = Machine(_hw(**extra), world, Trace(), (AIV, SDMA))
    for r in m.ranks:
        r.tensor("x", (np.arange(2 * MIB) % 251).astype(np.uint8))
        r.tensor("heap", 2 * MIB)
    return m


def _run(m, body, ranks=(0,)):
    def program(ctx):
        if ctx.rank_id in ranks and ctx.core_id == 0:
            yield from body(ctx)
    return launch(m, program, launch_ns=0.0, cores=1)


def test_an_mte_read_of_host_memory_costs_its_round_trip_and_the_narrowest_share():
    seen = {}

    def body(ctx):
        heap = hostmem.host_tensor(ctx, "heap")
        heap.write(0, np.full(4096, 7, np.uint8))
        buf = ctx.alloc("b", 4096)
        op = hostmem.copy_in_host(ctx, buf, heap, 0, 4096)
        yield from ctx.wait(op)
        seen["t"] = op.done_at
        seen["v"] = ctx.ub_read(buf, np.uint8, 4)

    _run(_machine(), body)
    # 4096 B at the MTE2 remote cap (10 GB/s, below 40 GB/s DRAM), 100 ns + 2 x 1000 ns
    assert seen["t"] == pytest.approx(4096 / 10.0 + 100.0 + 2000.0)
    assert list(seen["v"]) == [7, 7, 7, 7]


def test_an_mte_write_lands_in_host_memory_after_the_put_latency_and_one_flight():
    seen = {}

    def body(ctx):
        buf = ctx.alloc("b", 4096)
        ctx.ub_write(buf, 0, np.full(4096, 3, np.uint8))
        op = hostmem.copy_out_host(ctx, hostmem.host_tensor(ctx, "heap", pe=1), 64, buf, 4096)
        yield from ctx.wait(op)
        seen["t"] = op.done_at

    m = _machine()
    _run(m, body)
    assert seen["t"] == pytest.approx(4096 / 10.0 + 200.0 + 1000.0)
    heap = m.ranks[1].tensors["heap"]
    assert heap.host_side and np.all(heap.read(64, 4096) == 3)


def test_sdma_d2h_streams_at_the_dram_rate_and_lands_in_the_pes_heap():
    def body(ctx):
        sdma = hostmem.HostSdma(ctx, ctx.alloc("sdma_tmp", 64))
        yield from sdma.put_nbi_host(0, hostmem.host_tensor(ctx, "heap"), 0, ctx.tensor("x"),
                                     0, MIB)

    m = _machine()
    _run(m, body)
    m.env.run()
    # from the doorbell: the host's round trip (a host write is non-posted: 2 x 1000 ns),
    # 1 MiB at min(SDMA 100, host port 100, CPU port 50, DRAM 40) GB/s, then the engine's
    # 1000 ns
    assert m.env.now == pytest.approx(BELL + 2000.0 + MIB / 40.0 + 1000.0)
    assert np.array_equal(m.ranks[0].tensors["heap"].read(0, MIB),
                          m.ranks[0].tensors["x"].read(0, MIB))


def test_sdma_rh2d_from_another_server_pays_the_supernode_latency_both_ways():
    def body(ctx):
        sdma = hostmem.HostSdma(ctx, ctx.alloc("sdma_tmp", 64))
        yield from sdma.get_nbi_host(16, ctx.tensor("x"), 0,
                                     hostmem.host_tensor(ctx, "heap", pe=16), 0, MIB)

    # a server level of 0.5 us and a supernode level of 5.5 us: 5 us more between servers
    m = _machine(world=32, **{"fabric.levels.server.latency_ns": 500.0,
                              "fabric.levels.supernode.latency_ns": 5500.0})
    m.ranks[16].tensors["heap"].write(0, np.full(MIB, 9, np.uint8))
    _run(m, body)
    m.env.run()
    assert server_latency_ns(m.cfg) == pytest.approx(5000.0)
    assert m.env.now == pytest.approx(BELL + MIB / 40.0 + 1000.0 + 2 * (1000.0 + 5000.0))
    assert np.all(m.ranks[0].tensors["x"].read(0, MIB) == 9)


def test_four_dies_of_one_socket_share_its_dram_and_a_fifth_on_the_next_does_not():
    ends = {}

    def body(ctx):
        sdma = hostmem.HostSdma(ctx, ctx.alloc("sdma_tmp", 64))
        yield from sdma.put_nbi_host(ctx.rank_id, hostmem.host_tensor(ctx, "heap"), 0,
                                     ctx.tensor("x"), 0, MIB)
        yield from sdma.quiet()
        ends[ctx.rank_id] = ctx.t

    m = _machine(world=5)
    assert [socket_of(m.cfg.host, r) for r in (0, 3, 4)] == [(0, 0), (0, 0), (0, 1)]
    _run(m, body, ranks=(0, 1, 2, 3, 4))
    # ranks 0-3 each get a quarter of socket 0's 40 GB/s; rank 4 has socket 1 alone
    alone, shared = MIB / 40.0, MIB / 10.0
    # (the quiet sees its flag on its poll's cadence: within one poll, 100 + 0.4 + 1 + 100
    # + 50 + 100 + 10 ns)
    assert ends[1] - ends[4] == pytest.approx(shared - alone, abs=362.0)
    assert ends[0] == pytest.approx(ends[3], abs=362.0)


def test_scalar_p_lands_after_quiet_and_g_stalls_for_the_round_trip():
    seen = {}

    def body(ctx):
        heap = hostmem.host_tensor(ctx, "heap", pe=1)
        hostmem.scalar_p(ctx, heap, 8, 42, np.int32)
        yield from ctx.shmem.quiet()
        seen["after_quiet"] = ctx.t
        t0 = ctx.t
        v = yield from hostmem.scalar_g(ctx, heap, 8, np.int32)
        seen["g"] = ctx.t - t0
        seen["v"] = int(v)

    _run(_machine(), body)
    # p: a 64 B line at 10 GB/s, 200 + 1000 ns after the store and dcci (50 ns); quiet's
    # 300 ns dcci_entire comes first and then waits for the line
    assert seen["after_quiet"] == pytest.approx(50.0 + 6.4 + 1200.0)
    # g: the line at 10 GB/s, 100 ns fill + 2 x 1000 ns
    assert seen["g"] == pytest.approx(6.4 + 100.0 + 2000.0)
    assert seen["v"] == 42


def test_paths_a_preset_lacks_are_one_line_problems():
    assert "no host memory" in path_problem(load_hardware("atlas_a2"), 2)
    flat = path_problem(load_hardware("ascend950"), 9)
    assert "no path to another server's host" in flat and "\n" not in flat
    assert path_problem(load_hardware("ascend950"), 8) is None
    assert path_problem(load_hardware("atlas_a3"), 32) is None


def test_a_heap_above_a_socket_is_refused():
    hw = load_hardware("atlas_a3")
    per_socket = hw.host.socket_bytes
    assert capacity_problem(hw, 2, per_socket // 2) is None
    msg = capacity_problem(hw, 2, per_socket // 2 + 1)
    assert "above a socket's" in msg
    # 4 PEs of 16 share a socket
    assert capacity_problem(hw, 16, per_socket // 4 + 1) is not None


def test_the_host_section_is_optional_and_reported_only_when_present():
    assert "host" not in load_hardware("atlas_a2").to_dict()
    assert load_hardware("atlas_a3").to_dict()["host"]["sockets"] == 4


WALKS = {"host.page_walk_ns": 700.0, "host.tlb_entries": 2, "host.walkers": 2,
         "host.page_bytes": 4096}


def test_an_mte_read_of_base_pages_the_smmu_does_not_hold_pays_their_walks():
    seen = []

    def body(ctx):
        heap = hostmem.host_tensor(ctx, "heap", huge_pages=False)
        buf = ctx.alloc("b", 3 * 4096)
        # pages 0 and 1 start cached (the tensor's first pages, in a 2-entry cache); 12 KiB
        # at page 5 + 100 B touch pages 5, 6, 7, 8: four misses, walked two at a time
        for offset, n in ((0, 8192), (5 * 4096 + 100, 3 * 4096)):
            op = hostmem.copy_in_host(ctx, buf, heap, offset, n)
            yield from ctx.wait(op)
            seen.append(op.done_at)

    m = _machine(**WALKS)
    _run(m, body)
    first = 8192 / 10.0 + 100.0 + 2000.0
    assert seen[0] == pytest.approx(first)
    assert seen[1] - seen[0] == pytest.approx(3 * 4096 / 10.0 + 100.0 + 2000.0 + 2 * 700.0)
    assert m.host.misses(0) == 4


def test_huge_pages_cost_no_walk_where_base_pages_do():
    def body(ctx):
        sdma = hostmem.HostSdma(ctx, ctx.alloc("sdma_tmp", 64))
        yield from sdma.put_nbi_host(0, hostmem.host_tensor(ctx, "heap", huge_pages=huge), 0,
                                     ctx.tensor("x"), 0, MIB)

    ends = {}
    for huge in (True, False):
        m = _machine(**WALKS)
        _run(m, body)
        m.env.run()
        ends[huge] = (m.env.now, m.host.misses(0))
    # 2 MiB pages: the heap is one page, cached from the start; 4 KiB pages: 1 MiB is pages
    # 0 to 255, of which 0 and 1 start cached, so 254 walks, two at a time, hold the engine
    assert ends[True] == (pytest.approx(BELL + 2000.0 + MIB / 40.0 + 1000.0), 0)
    assert ends[False][1] == 254
    assert ends[False][0] - ends[True][0] == pytest.approx(127 * 700.0)



@pytest.mark.parametrize("direction", ["in", "out"])
def test_a_host_transfer_loop_that_never_yields_stops_at_the_time_limit(direction):
    from npusim.errors import SimTimeLimitError

    def program(ctx):
        if ctx.core_id == 0 and ctx.rank_id == 0:
            heap = hostmem.host_tensor(ctx, "heap")
            bufs = [ctx.alloc(f"b{i}", 64) for i in range(64)]
            ctx.ub_write(bufs[0], 0, np.zeros(64, np.uint8))
            for b in bufs:  # 100 ns an issue slot: the 1 us limit passes at the 11th
                if direction == "in":
                    hostmem.copy_in_host(ctx, b, heap, 0, 64)
                else:
                    hostmem.copy_out_host(ctx, heap, 0, bufs[0], 0, 64)
        yield from ()

    m = _machine(**{"scalar.cycles_per_op": 100.0})
    with pytest.raises(SimTimeLimitError, match="without yielding"):
        launch(m, program, launch_ns=0.0, cores=1, time_limit_ns=1000.0)
