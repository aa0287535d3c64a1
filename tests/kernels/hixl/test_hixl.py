"""Family hixl: the remote host holds the local block after a put and the local die holds
the remote host's after a get (numpy: the same bytes), one-line errors, and per-transfer
timing by hand on round figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.errors import InputError
from npusim.scenario import load_scenario
from npusim.sim import simulate

# round figures: 1 GHz, no issue cost, host: die port 100, CPU port 50, DRAM 40 GB/s
ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "sync.poll_cycles": 10.0,
         "sdma.bandwidth_gbps": 100.0, "host.npu_link_gbps": 100.0,
         "host.cpu_link_gbps": 50.0, "host.dram_gbps": 40.0}


def _scenario(tmp: Path, overrides: dict | None = None, hardware: str = "atlas_a3", **w):
    doc = {"name": "t", "hardware": hardware,
           "workload": {"kernel": "hixl", "op": "put", "layers": 2, "k_bytes": 4096,
                        "v_bytes": 512, "transfers": 3, **w}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


@pytest.mark.parametrize("op", ["put", "get"])
def test_the_block_arrives_whole_on_the_other_side(tmp_path, op):
    sc = _scenario(tmp_path, op=op, pairs=3)
    res = simulate(sc)
    (run,) = res.ops
    dies = sc.hardware.host.dies
    # the inputs the family made: the same seeded bytes, read back from its own op_inputs
    fam = sc.workload.family
    t = fam.tiling(sc.workload.shape, sc.workload.options, sc.hardware)
    ins = fam.op_inputs(op, t, fam.make_inputs(sc.workload.shape, sc.workload.options, op,
                                               {"seed": 0}, True), None)
    for pair in range(3):
        local, remote = pair, dies + pair
        if op == "put":
            assert np.array_equal(run.outputs[remote]["remote_kv"], ins[local]["kv"])
        else:
            assert np.array_equal(run.outputs[local]["kv"], ins[remote]["remote_kv"])


def test_a_transfer_costs_its_bytes_over_the_remote_socket_and_more_pairs_share_it(tmp_path):
    # one descriptor of 1 MiB per transfer. Alone: the DRAM's 40 GB/s is the narrowest;
    # 4 pairs on one remote socket share it: 10 GB/s each. Each transfer then takes
    # 3 x 1 MiB / 40 GB/s longer (within a poll of the quiet's flag, < 1 us here)
    times = {}
    for pairs in (1, 4):
        sc = _scenario(tmp_path, overrides=ROUND, layers=1, k_bytes=1 << 20, v_bytes=0,
                       pairs=pairs)
        ff = simulate(sc).ops[0].family_fields
        times[pairs] = ff["latency_us"] * 1000.0
        assert ff["pairs_per_remote_socket"] == {"server1.socket0": pairs}
    assert times[4] - times[1] == pytest.approx(3 * (1 << 20) / 40.0, abs=1000.0)
    assert 1000.0 < times[1] - (1 << 20) / 40.0 < 12000.0  # SDMA 1 us + 1 us + 5 us flight


def test_the_mean_drops_the_first_transfer(tmp_path):
    ff = simulate(_scenario(tmp_path, transfers=4)).ops[0].family_fields
    assert ff["transfers_timed"] == 3 and ff["descriptors"] == 4
    assert ff["block_bytes"] == 2 * (4096 + 512)
    assert ff["gbps_per_pair"] == pytest.approx(ff["block_bytes"] / (ff["latency_us"] * 1000))


def test_pairs_beyond_a_server_and_presets_without_the_path_are_one_line(tmp_path):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, pairs=17)
    assert "workload.pairs" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, hardware="ascend950")
    assert "\n" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, overrides={"host.socket_bytes": 1 << 20}, layers=1,
                  k_bytes=2 << 20, v_bytes=0)
    assert "above a socket's" in str(exc.value)


def test_many_large_transfers_finish(tmp_path):
    # 20 x 64 MiB: late in the run a flow's last bytes took less than the clock's
    # resolution and its wake-up fired at the same instant for ever (engine/flow.py)
    sc = _scenario(tmp_path, layers=1, k_bytes=64 << 20, v_bytes=0, transfers=20,
                   timing_only=True)
    ff = simulate(sc).ops[0].family_fields
    assert ff["transfers_timed"] == 19
