"""The die's SDMA engines (npusim.hw.sdma) by hand arithmetic on the atlas_a3 preset:
sdma 196 GB/s, 1000 ns; SIO 224 GB/s per pair 200 ns; the server level's die ports
196 GB/s 500 ns; HBM 1600 GB/s. An SQE streams at min(engine, links) and lands its
latency plus the level's after its last byte; one engine's SQEs stream one after the
other; a fenced SQE waits for the earlier ones to land; the links are shared with any
other flow on them."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.trace import Trace
from npusim.errors import InputError
from npusim.hw.config import load_hardware
from npusim.hw.cores import AIV, SDMA
from npusim.hw.machine import Machine
from npusim.hw.sdma import engine_pipe, sqe

MIB = 1 << 20


def _machine(overrides=None, world=4):
    hw = load_hardware("atlas_a3", overrides)
    m = Machine(hw, world, Trace(), (AIV, SDMA))
    for r in m.ranks:
        r.tensor("x", np.arange(2 * MIB, dtype=np.uint8) ^ r.index)
    return m


def _run(m):
    m.env.run()


def test_the_preset_declares_one_engine_per_die_and_the_950_none():
    hw = load_hardware("atlas_a3")
    assert (hw.sdma.engines, hw.sdma.bandwidth_gbps, hw.sdma.latency_ns) == (1, 196.0, 1000.0)
    assert load_hardware("ascend950").sdma is None
    assert "sdma" not in load_hardware("ascend950").to_dict()
    m = _machine()
    assert len(m.ranks[0].cores_of["sdma"]) == 1
    assert set(m.ranks[0].cores_of["sdma"][0].pipes) == {"sdma"}
    assert SDMA.drained() == ("sdma",)


def test_a_lone_sqe_across_the_server_lands_after_its_bytes_and_two_latencies():
    m = _machine()
    src, dst = m.ranks[0].tensors["x"], m.ranks[2].window
    op = sqe(m, 0, src, 0, dst, 4096, MIB, at=100.0)
    _run(m)
    # ranks 0 and 2 are in different packages of one server: 196 GB/s ports, 500 ns
    assert op.done_at == pytest.approx(100.0 + MIB / 196.0 + 1000.0 + 500.0)
    assert np.array_equal(dst.read(4096, MIB), src.read(0, MIB))
    assert (m.ranks[0].bytes_out, m.ranks[2].bytes_in) == (MIB, MIB)


def test_to_the_package_neighbour_the_engine_caps_the_sio_link():
    m = _machine()
    op = sqe(m, 0, m.ranks[0].tensors["x"], 0, m.ranks[1].window, 0, MIB, at=0.0)
    _run(m)
    assert op.done_at == pytest.approx(MIB / 196.0 + 1000.0 + 200.0)  # min(196, 224)


def test_one_engines_sqes_stream_one_after_the_other_their_latencies_overlap():
    m = _machine()
    x = m.ranks[0].tensors["x"]
    a = sqe(m, 0, x, 0, m.ranks[2].window, 0, MIB, at=0.0)
    b = sqe(m, 0, x, MIB, m.ranks[3].window, 0, MIB, at=0.0)
    _run(m)
    assert a.done_at == pytest.approx(MIB / 196.0 + 1500.0)
    assert b.done_at == pytest.approx(2 * MIB / 196.0 + 1500.0)


def test_two_engines_share_the_die_egress_with_each_other():
    m = _machine({"sdma.engines": 2})
    x = m.ranks[0].tensors["x"]
    a = sqe(m, 0, x, 0, m.ranks[2].window, 0, MIB, at=0.0, engine=0)
    b = sqe(m, 0, x, MIB, m.ranks[3].window, 0, MIB, at=0.0, engine=1)
    _run(m)
    # both cross rank 0's 196 GB/s server egress: 98 GB/s each
    assert a.done_at == pytest.approx(MIB / 98.0 + 1500.0)
    assert b.done_at == pytest.approx(MIB / 98.0 + 1500.0)
    assert engine_pipe(m, 0, 0) is not engine_pipe(m, 0, 1)


def test_an_mte_flow_on_the_same_egress_halves_the_sqes_rate():
    m = _machine()
    x = m.ranks[0].tensors["x"]
    links, _lat = m.fabric.route(0, 3)
    # a stand-in for MTE puts at the die's full port rate through the same egress
    m.net.start(MIB, 196.0, links, 0.0, lambda t: None)
    op = sqe(m, 0, x, 0, m.ranks[2].window, 0, MIB, at=0.0)
    _run(m)
    assert op.done_at == pytest.approx(MIB / 98.0 + 1500.0)


def test_a_fenced_sqe_starts_when_the_earlier_ones_have_landed():
    m = _machine()
    x = m.ranks[0].tensors["x"]
    a = sqe(m, 0, x, 0, m.ranks[2].window, 0, MIB, at=0.0)
    flag = sqe(m, 0, x, 0, m.ranks[0].window, 64, 8, at=0.0, fenced=True)
    _run(m)
    landed = MIB / 196.0 + 1500.0
    assert a.done_at == pytest.approx(landed)
    # local: own HBM only, 8 B at min(196, 1600) GB/s, the engine's 1000 ns
    assert flag.done_at == pytest.approx(landed + 8 / 196.0 + 1000.0)
    assert (m.ranks[0].bytes_out, m.ranks[0].bytes_in) == (MIB, 0)


def test_an_sqe_waits_for_its_doorbell():
    m = _machine()
    op = sqe(m, 0, m.ranks[0].tensors["x"], 0, m.ranks[2].window, 0, 4096, at=2500.0)
    _run(m)
    assert op.start_at == pytest.approx(2500.0)
    assert op.done_at == pytest.approx(2500.0 + 4096 / 196.0 + 1500.0)


def test_an_sdma_key_out_of_range_is_a_one_line_input_error():
    with pytest.raises(InputError) as err:
        load_hardware("atlas_a3", {"sdma.engines": 0})
    assert "sdma.engines" in str(err.value) and "\n" not in str(err.value)
