"""Family hixl: every direction moves the initiator's bytes to the target's memory or back
(numpy: the same bytes), each transfer's time by hand on round figures, one-line errors,
and the shipped table's calibration rows against hicann/hixl's published figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.calibrate.table import TARGETS_DIR, read_table
from npusim.errors import InputError
from npusim.kernels.hixl.transfer import PATHS
from npusim.scenario import load_scenario
from npusim.sim import simulate

# round figures: engine 100 GB/s landing 1000 ns, fast links, package hop 200 ns, host
# flight 500 ns, the AICPU's kernel 10 us and SQE 100 ns
ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "sync.poll_cycles": 10.0,
         "sdma.bandwidth_gbps": 100.0, "sdma.latency_ns": 1000.0, "sdma.read_ns": 300.0,
         "fabric.levels.package.link_gbps": 1000.0, "fabric.levels.package.latency_ns": 200.0,
         "host.npu_link_gbps": 1000.0, "host.write_gbps": 50.0, "host.read_gbps": 80.0,
         "host.dram_gbps": 1000.0, "host.latency_ns": 500.0,
         "aicpu.kernel_ns": 10000.0, "aicpu.sqe_ns": 100.0, "host.memcpy_async_ns": 20000.0}
LANDING = 1000.0


def _scenario(tmp: Path, overrides: dict | None = None, hardware: str = "atlas_a3", **w):
    doc = {"name": "t", "hardware": hardware,
           "workload": {"kernel": "hixl", "op": "put", "layers": 2, "k_bytes": 4096,
                        "v_bytes": 512, "transfers": 3, **w}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def _fields(tmp: Path, **w) -> dict:
    return simulate(_scenario(tmp, overrides=ROUND, **w)).ops[0].family_fields


def _block(tmp: Path, path: str, n: int, size: int, **w) -> dict:
    """One transfer of n blocks of `size` bytes on one server."""
    return _fields(tmp, op=PATHS[path][0], path=path, servers=1, block_bytes=size,
                   total_bytes=n * size, transfers=1, **w)


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("path", list(PATHS))
def test_every_direction_moves_the_bytes_whole(tmp_path, path, servers):
    op = PATHS[path][0]
    sc = _scenario(tmp_path, op=op, path=path, pairs=2, servers=servers)
    (run,) = simulate(sc).ops
    fam = sc.workload.family
    t = fam.tiling(sc.workload.shape, sc.workload.options, sc.hardware)
    ins = fam.op_inputs(op, t, fam.make_inputs(sc.workload.shape, sc.workload.options, op,
                                               {"seed": 0}, True), None)
    for pair in range(2):
        local, target = t.local_of(pair), t.target_of(pair)
        if op == "put":
            assert np.array_equal(run.outputs[target]["remote_kv"], ins[local]["kv"])
        else:
            assert np.array_equal(run.outputs[local]["kv"], ins[target]["remote_kv"])
    assert run.family_fields["path"] == path


def test_a_posted_write_costs_the_kernel_its_sqes_and_the_bytes(tmp_path):
    # D2rD on one package: one AICPU kernel (10 us + 4 x 0.1 us), then 4 x 64 KiB streamed
    # back to back at the engine's 100 GB/s with no hold (posted), the last landing 1000 ns
    # + the package's 200 ns after its last byte
    ff = _block(tmp_path, "D2rD", 4, 65536)
    want = 10000 + 4 * 100 + 4 * 65536 / 100.0 + LANDING + 200
    assert ff["latency_us"] * 1000 == pytest.approx(want)


def test_a_read_holds_the_engine_for_its_round_trip_per_sqe(tmp_path):
    # rD2D: each SQE waits for its first bytes (read_ns 300 + 2 x 200) before it streams;
    # the flight is inside the hold, so only the engine's landing follows
    ff = _block(tmp_path, "rD2D", 4, 65536)
    want = 10000 + 4 * 100 + 4 * (300 + 400 + 65536 / 100.0) + LANDING
    assert ff["latency_us"] * 1000 == pytest.approx(want)


@pytest.mark.parametrize("path,rate", [("D2rH", 50.0), ("rH2D", 80.0)])
def test_host_writes_and_reads_each_hold_a_host_round_trip_at_their_own_rate(tmp_path, path,
                                                                             rate):
    ff = _block(tmp_path, path, 4, 65536)
    want = 10000 + 4 * 100 + 4 * (2 * 500 + 65536 / rate) + LANDING
    assert ff["latency_us"] * 1000 == pytest.approx(want)


def test_host_to_host_pays_both_round_trips_at_the_narrower_port(tmp_path):
    ff = _block(tmp_path, "H2rH", 2, 65536)
    want = 10000 + 2 * 100 + 2 * (2 * 500 + 2 * 500 + 65536 / 50.0) + LANDING
    assert ff["latency_us"] * 1000 == pytest.approx(want)


def test_after_1920_sqes_the_next_kernel_waits_for_the_engine_to_drain(tmp_path):
    # 1921 descriptors take a 16th kernel; it starts once the 15th kernel's SQEs landed,
    # so one more descriptor costs a kernel, an SQE, its bytes and a second landing
    size = 1024
    t = {n: _block(tmp_path, "D2rD", n, size)["latency_us"] * 1000 for n in (1920, 1921)}
    assert t[1921] - t[1920] == pytest.approx(10000 + 100 + size / 100.0 + LANDING + 200)


def test_host_expansion_pays_one_call_per_descriptor(tmp_path):
    # 20 us per aclrtMemcpyAsync dwarfs each copy (0.66 us + landing): copy i starts at
    # (i + 1) x 20 us on its stream, the last lands its bytes and landing after
    for n in (4, 8):
        ff = _block(tmp_path, "D2rD", n, 65536, expansion="host")
        want = n * 20000 + 65536 / 100.0 + LANDING + 200
        assert ff["latency_us"] * 1000 == pytest.approx(want)


def test_the_bound_names_what_a_user_can_change(tmp_path):
    assert _block(tmp_path, "D2rD", 64, 1024)["bound"].startswith("the descriptors")
    # rD2D at one kernel of 2 SQEs: 5 us of the kernel each against 0.7 + 0.04 us
    assert _block(tmp_path, "rD2D", 2, 4096)["bound"].startswith("the descriptors")
    assert "write port (50 GB/s)" in _block(tmp_path, "D2rH", 2, 8 << 20)["bound"]
    assert "read port (80 GB/s)" in _block(tmp_path, "rH2D", 2, 8 << 20)["bound"]


def test_the_mean_drops_the_first_transfer(tmp_path):
    ff = simulate(_scenario(tmp_path, transfers=4)).ops[0].family_fields
    assert ff["transfers_timed"] == 3 and ff["descriptors"] == 4
    assert ff["block_bytes"] == ff["bytes_per_transfer"] == 2 * (4096 + 512)
    assert ff["gbps_per_pair"] == pytest.approx(ff["bytes_per_transfer"]
                                                / (ff["latency_us"] * 1000))


def test_pairs_on_one_socket_share_its_write_port(tmp_path):
    # the 16-pair layout: four targets per socket share its write port
    ff = _fields(tmp_path, pairs=16, layers=1, k_bytes=1 << 20, v_bytes=0, transfers=2)
    assert ff["pairs_per_remote_socket"] == {f"server1.socket{s}": 4 for s in range(4)}
    assert "50 GB/s" in ff["shared_link"] and "12.5 GB/s each" in ff["shared_link"]


@pytest.mark.parametrize("w,key,words", [
    ({"op": "get", "path": "D2rH"}, "workload.path", "D2rH is a put"),
    ({"path": "D2rH", "transport": "hccs"}, "workload.path", "不支持"),
    ({"path": "D2rD", "transport": "hccs", "expansion": "host"}, "workload.expansion",
     "allowed: aicpu"),
    ({"block_bytes": 4096, "total_bytes": 1024}, "workload.block_bytes", "above total_bytes"),
    ({"block_bytes": -1}, "workload.block_bytes", ""),
    ({"total_bytes": 0}, "workload.total_bytes", ""),
    ({"servers": 1, "pairs": 9}, "workload.pairs", "at most 8"),
    ({"servers": 3}, "workload.servers", ""),
    ({"transport": "roce", "expansion": "host"}, "workload.expansion", "allowed: aicpu"),
    ({"transport": "nvlink"}, "workload.transport", "roce"),
])
def test_what_the_platform_does_not_support_is_one_line(tmp_path, w, key, words):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, **w)
    msg = str(exc.value)
    assert key in msg and words in msg and "\n" not in msg


def test_a_total_over_host_memory_and_presets_without_the_path_are_one_line(tmp_path):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, overrides={"host.socket_bytes": 1 << 20}, block_bytes=1 << 20,
                  total_bytes=2 << 20)
    assert "workload.total_bytes" in str(exc.value) and "above a socket's" in str(exc.value)
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, hardware="ascend950")
    assert "\n" not in str(exc.value)


# RoCE on round figures: a 20 GB/s port, 4 KiB packets with 96 B of header each, 500 ns
# per WQE, 2000 ns one way
ROCE = {**ROUND, "rdma.port_gbps": 20.0, "rdma.mtu_bytes": 4096, "rdma.header_bytes": 96,
        "rdma.wqe_ns": 500.0, "rdma.latency_ns": 2000.0}
WIRE = 65536 + 16 * 96  # a 64 KiB block on the wire: 16 packets


def _roce(tmp: Path, path: str, n: int) -> dict:
    """One RoCE transfer of n 64 KiB blocks on one server, on the round figures."""
    sc = _scenario(tmp, overrides=ROCE, op=PATHS[path][0], path=path, servers=1,
                   transport="roce", block_bytes=65536, total_bytes=n * 65536, transfers=1)
    return simulate(sc).ops[0].family_fields


def test_a_roce_write_costs_the_kernel_and_its_wqes_one_after_another(tmp_path):
    # D2rD: one AICPU kernel (10 us + 4 x 0.1 us), then on the NIC's one queue each WQE's
    # 500 ns and its 16 packets at 20 GB/s, the last landing 2000 ns after its last byte;
    # the HCCS link's 1000 GB/s and the engine play no part
    ff = _roce(tmp_path, "D2rD", 4)
    want = 10000 + 4 * 100 + 4 * (500 + WIRE / 20.0) + 2000
    assert ff["latency_us"] * 1000 == pytest.approx(want)
    assert ff["transport"] == "roce" and ff["bound"].startswith("the NIC port")


def test_a_roce_read_holds_its_queue_no_longer_but_lands_after_a_round_trip(tmp_path):
    # rD2D: the same WQEs back to back (READs outstanding), the last landing after the
    # request's flight and the data's
    ff = _roce(tmp_path, "rD2D", 4)
    want = 10000 + 4 * 100 + 4 * (500 + WIRE / 20.0) + 2 * 2000
    assert ff["latency_us"] * 1000 == pytest.approx(want)


def test_roce_host_to_host_adds_the_host_legs_flights_only(tmp_path):
    # H2rH: the port (20 GB/s) is narrower than the socket's 50 GB/s write port, so the
    # rate stays; the landing adds the local host read's round trip (2 x 500) and the
    # remote host write's flight (500)
    ff = _roce(tmp_path, "H2rH", 2)
    want = 10000 + 2 * 100 + 2 * (500 + WIRE / 20.0) + 2000 + 3 * 500
    assert ff["latency_us"] * 1000 == pytest.approx(want)


def test_roce_moves_the_bytes_whole_in_both_directions(tmp_path):
    for path in ("H2rD", "rD2H"):
        op = PATHS[path][0]
        sc = _scenario(tmp_path, op=op, path=path, servers=2, transport="roce")
        (run,) = simulate(sc).ops
        fam = sc.workload.family
        t = fam.tiling(sc.workload.shape, sc.workload.options, sc.hardware)
        ins = fam.op_inputs(op, t, fam.make_inputs(sc.workload.shape, sc.workload.options,
                                                   op, {"seed": 0}, True), None)
        local, target = t.local_of(0), t.target_of(0)
        if op == "put":
            assert np.array_equal(run.outputs[target]["remote_kv"], ins[local]["kv"])
        else:
            assert np.array_equal(run.outputs[local]["kv"], ins[target]["remote_kv"])


def test_roce_on_a_preset_without_a_nic_is_one_line_naming_the_key_and_sdma_still_runs(
        tmp_path):
    doc = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "atlas_a3.yaml")
                         .read_text())
    del doc["rdma"]
    preset = tmp_path / "no_nic.yaml"
    preset.write_text(yaml.safe_dump(doc, allow_unicode=True))
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, hardware=str(preset), transport="roce")
    assert "hardware.rdma" in str(exc.value) and "\n" not in str(exc.value)
    # the same kernel without its NIC: the SDMA engine's transfers run as before
    (run,) = simulate(_scenario(tmp_path, hardware=str(preset), transfers=1)).ops
    assert run.engines == ("sdma",) and run.family_fields["descriptors"] == 4


def test_many_large_transfers_finish(tmp_path):
    # 20 x 64 MiB: late in the run a flow's last bytes took less than the clock's
    # resolution and its wake-up fired at the same instant for ever (engine/flow.py)
    sc = _scenario(tmp_path, layers=1, k_bytes=64 << 20, v_bytes=0, transfers=20,
                   timing_only=True)
    ff = simulate(sc).ops[0].family_fields
    assert ff["transfers_timed"] == 19


def test_the_calibration_rows_hold_hixls_published_table():
    # the shipped preset against hicann/hixl benchmarks/performance.md's one-machine
    # FabricMem AICPU rows (the figures are the table's, not the model's)
    from npusim.calibrate.simulate import simulate_table

    rows = [m for m in read_table(Path(TARGETS_DIR) / "atlas_a3_hixl.csv") if m.use == "fit"]
    assert len(rows) == 32
    spot = {m.label: m.measured for m in rows}
    assert spot["hixl_1server_fabric_aicpu_D2rH_2M"] == 51.818
    assert spot["hixl_1server_fabric_aicpu_rD2D_16K"] == 15.231
    sims = simulate_table(rows, "atlas_a3", {}, "atlas_a3_hixl", 1)
    for m, got in zip(rows, sims, strict=True):
        assert abs(got / m.measured - 1) <= m.tolerance, m.label
