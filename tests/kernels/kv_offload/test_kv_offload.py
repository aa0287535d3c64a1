"""Family kv_offload (GatherSelectionKvCache): the selection cache checked the way the
operator's test compares it (compare_out_of_order: the slot whose status names a token
holds that token's full row), written here from the inputs; hits stay in place; one-line
errors; the host path's cost per row by hand on round figures; the footprint arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.errors import InputError
from npusim.scenario import load_scenario
from npusim.sim import simulate

ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "vector.issue_cycles": 0.0,
         "mte.gm_to_ub_gbps": 10.0, "mte.put_gbps": 10.0, "mte.gm_to_ub_latency_ns": 100.0,
         "mte.ub_to_gm_gbps": 10.0, "mte.ub_to_gm_latency_ns": 100.0, "hbm.bandwidth_gbps": 1e4,
         "host.latency_ns": 1000.0, "host.npu_link_gbps": 1e4, "host.write_gbps": 1e4,
         "host.read_gbps": 1e4,
         "host.dram_gbps": 1e4, "dcache.miss_ns": 100.0}


def _scenario(tmp: Path, overrides: dict | None = None, **w):
    doc = {"name": "t", "hardware": "atlas_a3",
           "workload": {"kernel": "kv_offload", "op": "gather", "batch": 3, "seq_len": 300,
                        "topk": 64, "block": 16, "reuse": 0.5, **w}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def _inputs(sc):
    fam, w = sc.workload.family, sc.workload
    t = fam.tiling(w.shape, w.options, sc.hardware)
    made = fam.make_inputs(w.shape, w.options, w.op, {"seed": 0}, True)
    return t, fam.op_inputs("gather", t, made, None)[0]


@pytest.mark.parametrize("c8,location", [(False, "host"), (True, "host"), (False, "hbm")])
def test_every_selected_token_sits_in_the_slot_its_status_names(tmp_path, c8, location):
    sc = _scenario(tmp_path, c8=c8, kv_location=location)
    t, ins = _inputs(sc)
    out = simulate(sc).ops[0].outputs[0]
    full = ins["full_kv_cache"]
    full_kv = full.table[full.pick]
    rope = ins["full_k_rope"]
    kv_w = 656 if c8 else 1024
    sel = out["selection_kv_cache"].reshape(-1, kv_w)
    for b in range(3):
        status = out["selection_kv_block_status"][b]
        prev = ins["selection_kv_block_status_prev"][b]
        assert status[64] == 64 and out["selection_kv_actual_seq"][b] == 64
        for g in ins["selection_topk_indices"][b]:
            (slot,) = np.flatnonzero(status[:64] == g)
            row = ins["selection_kv_block_table"][b, slot // 16] * 16 + slot % 16
            src = ins["full_kv_block_table"][b, g // 16] * 16 + g % 16
            assert np.array_equal(sel[row], full_kv[src])
            if not c8:
                rows = out["selection_k_rope"].reshape(-1, 128)
                assert np.array_equal(rows[row], rope.table[rope.pick[src]])
            if g in prev[:64]:  # a hit stays where the previous step put it
                assert slot == int(np.flatnonzero(prev[:64] == g)[0])
    assert out["selection_k_rope"].size == (0 if c8 else 3 * 64 * 128)


def test_the_report_counts_misses_and_reuse(tmp_path):
    ff = simulate(_scenario(tmp_path)).ops[0].family_fields
    assert ff["rows_gathered"] == 3 * 32  # half of each sequence's 64 are new
    assert ff["reuse_rate"] == pytest.approx(0.5)
    assert ff["bytes_gathered"] == 3 * 32 * (1024 + 128)


def test_each_row_from_host_costs_one_more_round_trip_than_from_hbm(tmp_path):
    # one sequence on one core: each missed row's two loads queue on MTE2 and the core
    # waits for them before the next row, so host memory adds 2 x 1000 ns per row
    got = {}
    for loc in ("hbm", "host"):
        sc = _scenario(tmp_path, overrides=ROUND, batch=1, kv_location=loc)
        got[loc] = simulate(sc).ops[0].family_fields["gather_us"] * 1000.0
    assert got["host"] - got["hbm"] == pytest.approx(32 * 2000.0, rel=1e-9)


def test_the_footprint_arithmetic(tmp_path):
    ff = simulate(_scenario(tmp_path, layers=61)).ops[0].family_fields
    per_token_layer = 1024 + 128
    assert ff["kv_bytes_per_card_no_offload"] == 3 * 300 * 61 * (per_token_layer + 256)
    assert ff["kv_bytes_per_card_offload"] == 3 * 300 * 61 * 256 + 3 * 64 * 61 * per_token_layer
    assert ff["host_bytes_per_card_offload"] == 3 * 300 * 61 * per_token_layer


def test_bad_inputs_are_one_line(tmp_path):
    for w, key in (({"topk": 301}, "workload.topk"),
                   ({"cache_blocks": 50}, "workload.cache_blocks")):
        with pytest.raises(InputError) as exc:
            _scenario(tmp_path, **w)
        assert key in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, overrides={"host.socket_bytes": 1 << 20}, seq_len=4096)
    assert "above a socket's" in str(exc.value)


def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "hardware": "atlas_a3", "workload": {
        "kernel": "kv_offload", "op": "gather", "seq_len": 1024, "topk": 2048}}))
    out = subprocess.run([sys.executable, "-m", "npusim", "run", str(path), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "workload.topk" in out.stderr
    assert not (tmp_path / "out").exists()
