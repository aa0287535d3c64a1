"""Family shmem_host (hicann/shmem sdma_d2h_demo, rma_d2h_demo): outputs against numpy
expectations written here from the examples' check (segment pe holds pe + 10), one-line
input errors, and timing differences by hand on round figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.errors import InputError
from npusim.scenario import load_scenario
from npusim.sim import simulate


def _scenario(tmp: Path, hardware: str = "atlas_a3", overrides: dict | None = None, **w):
    doc = {"name": "t", "hardware": hardware,
           "workload": {"kernel": "shmem_host", "op": "put", "elements": 1000, "blocks": 3,
                        **w}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def _expected(pes: int, elements: int, me: int, targets: str, dtype) -> np.ndarray:
    """validate_segments: segment pe is pe + 10 where the two PEs exchanged data, else 0."""
    out = np.zeros((pes, elements), dtype)
    for pe in range(pes):
        moved = {"all": True, "self": pe == me, "peers": pe != me}[targets]
        if moved:
            out[pe] = pe + 10
    return out.reshape(-1)


@pytest.mark.parametrize("pes,targets,placement,data_type", [
    (2, "all", "server", "int"), (3, "peers", "server", "fp32"), (2, "self", "across", "int64"),
    (2, "all", "across", "uint8")])
def test_put_and_get_leave_every_segment_as_the_example_checks(tmp_path, pes, targets,
                                                               placement, data_type):
    sc = _scenario(tmp_path, op="all", pes=pes, targets=targets, placement=placement,
                   data_type=data_type)
    res = simulate(sc)
    dt = {"int": np.int32, "fp32": np.float32, "int64": np.int64, "uint8": np.uint8}[data_type]
    stride = 16 if placement == "across" else 1
    put, get = res.ops
    for pe in range(pes):
        want = _expected(pes, 1000, pe, targets, dt)
        assert np.array_equal(put.outputs[pe * stride]["host_dst"], want)
        assert np.array_equal(get.outputs[pe * stride]["device_dst"], want)
    assert put.family_fields["validated"] and get.family_fields["validated"]


def test_rma_reads_back_the_next_pes_number(tmp_path):
    res = simulate(_scenario(tmp_path, op="rma", pes=4))
    (op,) = res.ops
    for pe in range(4):
        assert int(op.outputs[pe]["output"][0]) == (pe + 1) % 4
        assert int(op.outputs[pe]["input"][0]) == pe
    assert op.family_fields["validated"] and op.family_fields["path"] == "D2rH"


def test_a_segment_twice_as_large_takes_its_bytes_over_the_narrowest_share_longer(tmp_path):
    # one PE, one block, one SQE each (<= 1 MiB); socket DRAM 40 GB/s is the narrowest of
    # SDMA 100, host port 100, CPU port 50: 262144 more bytes take 6553.6 ns more, to within
    # one poll of the quiet's flag (MTE2 100 ns + 4 B at 10 GB/s + the tail: 4 B at 4 GB/s,
    # 100 ns, dcci 50, line fill 100, poll 10 ns: 361.4 ns)
    over = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "mte.gm_to_ub_gbps": 10.0,
            "mte.gm_to_ub_latency_ns": 100.0, "mte.ub_to_gm_gbps": 4.0,
            "mte.ub_to_gm_latency_ns": 100.0, "dcache.miss_ns": 100.0, "dcache.dcci_ns": 50.0,
            "sync.poll_cycles": 10.0, "sdma.bandwidth_gbps": 100.0,
            "host.npu_link_gbps": 100.0, "host.write_gbps": 50.0, "host.read_gbps": 50.0,
            "host.dram_gbps": 40.0}
    spans = []
    for elements in (65536, 131072):
        sc = _scenario(tmp_path, overrides=over, pes=1, blocks=1, elements=elements,
                       targets="self")
        spans.append(simulate(sc).ops[0].family_fields["transfer_us"] * 1000.0)
    assert spans[1] - spans[0] == pytest.approx(262144 / 40.0, abs=361.4)


def test_a_remote_host_on_another_server_adds_the_supernode_latency(tmp_path):
    # D2rH with the peer's host on another server: the same bytes and bandwidth as on this
    # server, plus the supernode's 5500 ns over the server's 500 ns both ways (the engine
    # waits for the host write's completion), within one poll
    over = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "sync.poll_cycles": 10.0,
            "fabric.levels.server.latency_ns": 500.0,
            "fabric.levels.supernode.latency_ns": 5500.0}
    got = {}
    for placement in ("server", "across"):
        sc = _scenario(tmp_path, overrides=over, pes=2, blocks=1, elements=1024,
                       targets="peers", placement=placement)
        op = simulate(sc).ops[0]
        got[placement] = op.family_fields["transfer_us"] * 1000.0
        assert op.family_fields["paths"]["D2rH"]["cross_server"] == (placement == "across")
    poll = 315.9 + 4 / 59.76 + 4 / 59.76 + 119.9 + 50.0 + 315.9 + 10.0  # generous bound
    assert got["across"] - got["server"] == pytest.approx(2 * 5000.0, abs=poll)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_a_host_side_heap_above_the_socket_is_one_line(tmp_path):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, elements=1 << 20, overrides={"host.socket_bytes": 4 << 20})
    msg = _one_line(exc)
    assert "workload.elements" in msg and "above a socket's" in msg


def test_d2rh_on_a_single_server_preset_is_one_line(tmp_path):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, hardware="ascend950", op="rma", pes=2, placement="across")
    assert "no path to another server's host" in _one_line(exc)


def test_a_preset_without_host_or_sdma_is_one_line(tmp_path):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, hardware="atlas_a2")
    assert "no host memory" in _one_line(exc)
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, hardware="ascend950")
    assert "no SDMA engine" in _one_line(exc)
