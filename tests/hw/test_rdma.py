"""The A2's RDMA path (npusim.hw.rdma, npusim.runtime.rdma) by hand arithmetic on the
atlas_a2 preset: rdma port 25 GB/s, MTU 4096 B, 82 B of framing per packet, 600 ns per WQE;
ranks 0 and 8 are in different servers, so a WRITE crosses the cluster level (each card's
25 GB/s RoCE port out and in, 1500 ns). A WQE's bytes land at

    doorbell + wqe_ns + (n + ceil(n / mtu) * header) / port + level latency

and the WQEs of one send queue stream one after the other."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.trace import Trace
from npusim.errors import KernelError
from npusim.hw.config import load_hardware
from npusim.hw.cores import AIV, RDMA
from npusim.hw.machine import Machine
from npusim.hw.rdma import post_send, wire_bytes
from npusim.runtime.launch import launch
from npusim.runtime.rdma import AivRdma

MIB = 1 << 20
WQE, PORT, MTU, HEADER, LEVEL = 600.0, 25.0, 4096, 82, 1500.0
WIRE_MIB = MIB * (1 + HEADER / MTU)  # 256 whole packets: 1,069,568 B on the wire


def _machine(world: int = 16, overrides: dict | None = None) -> Machine:
    m = Machine(load_hardware("atlas_a2", overrides), world, Trace(), (AIV, RDMA))
    for r in m.ranks:
        r.tensor("x", (np.arange(2 * MIB) % 251).astype(np.uint8) ^ r.index)
    return m


def test_the_presets_hold_their_nics_and_the_950_has_none() -> None:
    hw = load_hardware("atlas_a2")
    r = hw.rdma
    assert (r.engines, r.port_gbps, r.mtu_bytes, r.header_bytes, r.wqe_ns, r.latency_ns) == (
        1, PORT, MTU, HEADER, WQE, LEVEL)
    # the A3's die: msmodeling's RoCE tier 0, 196 GB/s / 8 and 5.5 us
    a3 = load_hardware("atlas_a3").rdma
    assert (a3.port_gbps, a3.latency_ns) == (196 / 8, 5.5e3)
    assert load_hardware("ascend950").rdma is None
    assert "rdma" not in load_hardware("ascend950").to_dict()
    assert RDMA.drained() == ("rdma",)


def test_wire_bytes_count_a_header_per_packet() -> None:
    assert wire_bytes(MIB, MTU, HEADER) == MIB + 256 * 82
    assert wire_bytes(5000, MTU, HEADER) == 5000 + 2 * 82  # 4096 + 904: two packets
    assert wire_bytes(1, MTU, HEADER) == 83


def test_a_lone_write_lands_after_its_wqe_its_wire_bytes_and_the_level() -> None:
    m = _machine()
    src, dst = m.ranks[0].tensors["x"], m.ranks[8].window
    op = post_send(m, 0, src, 0, dst, 4096, MIB, at=100.0)
    m.env.run()
    assert op.done_at == pytest.approx(100.0 + WQE + WIRE_MIB / PORT + LEVEL)  # 44982.72
    assert np.array_equal(dst.read(4096, MIB), src.read(0, MIB))
    assert (m.ranks[0].bytes_out, m.ranks[8].bytes_in) == (MIB, MIB)
    egress = next(x for x in m.fabric.resources() if x.name == "rank0.cluster.egress")
    assert egress.bytes == WIRE_MIB  # the port carries the headers too


def test_two_writes_on_one_queue_stream_one_after_the_other() -> None:
    m = _machine()
    src = m.ranks[0].tensors["x"]
    a = post_send(m, 0, src, 0, m.ranks[8].window, 0, MIB, at=0.0)
    b = post_send(m, 0, src, MIB, m.ranks[9].window, 0, MIB, at=0.0)
    m.env.run()
    one = WQE + WIRE_MIB / PORT  # the queue's time for one WQE: 43,382.72 ns
    assert a.done_at == pytest.approx(one + LEVEL)
    assert b.done_at == pytest.approx(2 * one + LEVEL)  # its WQE waits for a's last byte
    assert np.array_equal(m.ranks[9].window.read(0, MIB), src.read(MIB, MIB))


def test_two_queues_overlap_their_wqes_and_share_the_port() -> None:
    m = _machine(overrides={"rdma.engines": 2})
    src = m.ranks[0].tensors["x"]
    a = post_send(m, 0, src, 0, m.ranks[8].window, 0, MIB, at=0.0, queue=0)
    b = post_send(m, 0, src, MIB, m.ranks[9].window, 0, MIB, at=0.0, queue=1)
    m.env.run()
    both = WQE + 2 * WIRE_MIB / PORT + LEVEL  # both stream at half the port
    assert a.done_at == pytest.approx(both) and b.done_at == pytest.approx(both)


# AIVRDMAPostSend on a round preset: 1 GHz, scalars free, MTE 4 GB/s at 100 ns, a line
# fill 100 ns, a dcci 50 ns
ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "mte.ub_to_gm_gbps": 4.0,
         "mte.ub_to_gm_latency_ns": 100.0, "mte.gm_to_ub_gbps": 4.0,
         "mte.gm_to_ub_latency_ns": 100.0, "dcache.miss_ns": 100.0, "dcache.dcci_ns": 50.0}
# the QP entry's line fill; cacheWriteThrough and load of head, then tail; the WQE and
# SGE lines written through; stores hit the write-back cache
BELL = 100.0 + 2 * (50.0 + 100.0) + 2 * 50.0 + (8 / 4.0 + 100.0)  # the doorbell lands: 602
POSTED = BELL + 4 / 4.0 + 100.0  # then the 4 B head: 703


def _posting(body):
    def program(ctx):
        if ctx.rank_id == 0 and ctx.core_id == 0:
            yield from body(ctx, AivRdma(ctx, ctx.alloc("ub_local", 32)))
    return program


def test_the_core_posts_a_wqe_and_the_nic_sends_it_from_the_doorbell() -> None:
    seen = {}

    def body(ctx, rdma):
        seen["op"] = yield from rdma.post_send(8, 0, ctx.tensor("x"), 0, MIB)
        seen["t"] = ctx.t

    m = _machine(overrides=ROUND)
    res = launch(m, _posting(body), launch_ns=0.0, cores=1)
    m.env.run()
    op = seen["op"]
    assert seen["t"] == pytest.approx(POSTED)  # the call does not wait for the bytes
    assert op.start_at == pytest.approx(BELL)
    assert op.done_at == pytest.approx(BELL + WQE + WIRE_MIB / PORT + LEVEL)
    assert np.array_equal(m.ranks[8].window.read(0, MIB), m.ranks[0].tensors["x"].read(0, MIB))
    assert res.contexts[0][0].transfers[("start", "rdma", "rdma_write", True)] == [1, MIB]
    assert res.contexts[0][0].bytes_put == MIB


def test_posting_to_the_own_rank_or_without_a_nic_is_a_kernel_error() -> None:
    def own(ctx, rdma):
        yield from rdma.post_send(0, 0, ctx.tensor("x"), 0, 64)

    with pytest.raises(KernelError, match="another rank"):
        launch(_machine(overrides=ROUND), _posting(own), launch_ns=0.0, cores=1)
    m = Machine(load_hardware("ascend950"), 2, Trace(), (AIV,))
    m.ranks[0].tensor("x", np.zeros(64, np.uint8))
    with pytest.raises(KernelError, match="no RDMA NIC"):
        launch(m, _posting(own), launch_ns=0.0, cores=1)
