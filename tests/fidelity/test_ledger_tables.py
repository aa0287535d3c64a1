"""The ledger over hand-made tables and records: MAPE, worst row, inside and outside,
each against hand arithmetic on the figures written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npusim.calibrate import Measurement, read_table
from npusim.fidelity import tables as tables_mod
from npusim.fidelity.record import record_doc, record_path, row_digest
from npusim.fidelity.run import ledger_of, off_preset, run_ledgers

HEAD = "op,bs,h,k,ep_world_size,experts_per_rank,dtype,kernel,mode,quant,label,measured_us"
# label -> (the row's cells, its measured us, the simulated us the record will hold)
ROWS = {
    "d_ep8": ("dispatch,128,7168,8,8,32,bfloat16,deepep,low_latency,int8", 100.0, 110.0),
    "d_ep16": ("dispatch,128,7168,8,16,16,bfloat16,deepep,low_latency,int8", 200.0, 190.0),
    "d_ep32": ("dispatch,128,7168,8,32,8,bfloat16,deepep,low_latency,int8", 400.0, 412.0),
    "d_bf16": ("dispatch,128,7168,8,8,32,bfloat16,deepep,low_latency,bf16", 50.0, 40.0),
}
LL = {"kernel": "deepep", "op": "dispatch_combine", "bs": 128, "h": 7168, "k": 8,
      "ep_world_size": 16, "experts_per_rank": 16, "dtype": "bfloat16",
      "mode": "low_latency", "quant": "int8"}


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A targets folder with one atlas_a3 table and its record, in place of the shipped."""
    table = tmp_path / "atlas_a3_mine.csv"
    table.write_text("\n".join([HEAD, *(f"{c},{lab},{m}" for lab, (c, m, _) in ROWS.items())])
                     + "\n")
    _record(table)
    monkeypatch.setattr(tables_mod, "targets_dir", lambda: tmp_path)
    return table


def _record(table: Path) -> None:
    """The table's record with the simulated values ROWS gives."""
    rows = read_table(table)
    sim = [ROWS[m.name][2] for m in rows]
    doc = record_doc(table.stem, "atlas_a3", {m.name for m in rows}, rows, sim, {})
    record_path(table).write_text(json.dumps(doc))


def test_inside_the_range_the_rows_of_the_run_quant_give_mape_and_worst(shipped: Path) -> None:
    led = ledger_of("deepep", "atlas_a3", LL, "low_latency_dispatch")
    (fit,) = led.tables
    # int8 rows only: |+10%|, |-5%|, |+3%| -> MAPE 6%, worst 10% at d_ep8
    assert fit.mape == pytest.approx((0.10 + 0.05 + 0.03) / 3)
    assert fit.worst == pytest.approx(0.10)
    assert fit.worst_row == "d_ep8"
    assert (fit.rows, fit.simulated, fit.matched) == (4, 4, 3)
    assert led.calibrated and led.why == ""
    assert led.band() == pytest.approx(0.10)


def test_the_other_quant_is_held_against_its_own_row(shipped: Path) -> None:
    led = ledger_of("deepep", "atlas_a3", {**LL, "ep_world_size": 8, "experts_per_rank": 32,
                                            "quant": "bf16"}, "low_latency_dispatch")
    (fit,) = led.tables
    assert fit.mape == pytest.approx(0.2) and fit.worst_row == "d_bf16"  # 40 against 50


def test_a_numeric_key_outside_the_rows_says_which_and_the_range(shipped: Path) -> None:
    led = ledger_of("deepep", "atlas_a3", {**LL, "bs": 8}, "low_latency_dispatch")
    assert not led.calibrated
    assert led.tables[0].outside_why == "bs 8 is outside the table's 128 (deepep low_latency int8)"
    assert led.why == led.tables[0].outside_why
    assert led.band(0.3) == 0.3
    wide = ledger_of("deepep", "atlas_a3", {**LL, "ep_world_size": 64}, "low_latency_dispatch")
    assert wide.tables[0].outside_why.startswith("ep_world_size 64 is outside the table's 8..32")


def test_a_text_key_the_rows_lack_is_outside(shipped: Path) -> None:
    led = ledger_of("deepep", "atlas_a3", {**LL, "quant": "mx_fp8_e4m3"}, "low_latency_dispatch")
    assert led.why.startswith("quant mx_fp8_e4m3 is not among the table's bf16, int8")


def test_a_key_the_run_leaves_out_takes_the_family_default(shipped: Path) -> None:
    bare = {k: v for k, v in LL.items() if k != "mode"}  # deepep's default mode: normal
    led = ledger_of("deepep", "atlas_a3", bare, "low_latency_dispatch")
    assert led.why.startswith("mode normal is not among the table's low_latency")


def test_an_edited_row_is_not_simulated(shipped: Path) -> None:
    text = shipped.read_text().replace("dispatch,128,7168,8,16,16", "dispatch,128,7168,8,16,17")
    shipped.write_text(text)
    (fit,) = ledger_of("deepep", "atlas_a3", LL, "low_latency_dispatch").tables
    assert fit.simulated == 3  # d_ep16 lost its record
    assert fit.mape == pytest.approx((0.10 + 0.03) / 2)


def test_no_record_no_calibration_and_the_command_that_makes_one(shipped: Path) -> None:
    record_path(shipped).unlink()
    led = ledger_of("deepep", "atlas_a3", LL, "low_latency_dispatch")
    assert not led.calibrated
    assert led.why.startswith("0 of 4 rows simulated: record them with `python -m npusim "
                              "validate --hardware atlas_a3 --table atlas_a3_mine --record")


def test_uncalibrated_reasons(shipped: Path) -> None:
    assert ledger_of("deepep", "atlas_a2", LL, "low_latency_dispatch").why == \
        "no shipped table of atlas_a2"
    assert ledger_of("pypto_shmem", "atlas_a3", LL, "dispatch").why == \
        "atlas_a3's tables have no pypto_shmem row"
    assert ledger_of("deepep", "atlas_a3", LL, "low_latency_combine").why == \
        "atlas_a3's tables have no deepep row of op low_latency_combine"
    off = ledger_of("deepep", "atlas_a3", LL, "low_latency_dispatch", "a preset file")
    assert not off.calibrated and off.why == "a preset file" and off.tables == ()


def test_off_preset_names_the_overrides_and_the_file() -> None:
    shipped = {"hardware": "atlas_a3", "hardware_name": "atlas_a3", "hardware_overrides": {}}
    assert off_preset(shipped) == ""
    assert off_preset({**shipped, "hardware_overrides": {"window.bytes": 1}}) == \
        "hardware_overrides (window.bytes): not the shipped preset"
    assert off_preset({**shipped, "hardware": "my/a3.yaml"}).startswith("a preset file")


def test_the_digest_follows_the_simulation_not_the_measured_value(shipped: Path) -> None:
    a, *_ = read_table(shipped)
    moved = Measurement(dict(a.workload), 999.0, label=a.label)
    assert row_digest(moved) == row_digest(a)
    wider = Measurement({**a.workload, "bs": 256}, 999.0, label=a.label)
    assert row_digest(wider) != row_digest(a)


def test_the_doc_round_trips_and_its_lines_name_the_table(shipped: Path) -> None:
    led = ledger_of("deepep", "atlas_a3", LL, "low_latency_dispatch")
    doc = json.loads(json.dumps(led.as_doc()))
    assert doc["calibrated"] and doc["band"] == pytest.approx(0.10)
    assert led.lines()[0] == "calibrated by atlas_a3_mine (3 rows, MAPE 6.0%, worst 10.0% d_ep8)"


def test_what_the_op_reports_it_ran_with_comes_before_the_scenario(shipped: Path) -> None:
    scenario = {"hardware": "atlas_a3", "hardware_name": "atlas_a3", "hardware_overrides": {},
                "workload": {**LL, "quant": "bf16"}}
    led = run_ledgers(scenario, {"low_latency_dispatch": {"quant": "int8", "rows": [1, 2]}})
    assert led["low_latency_dispatch"].tables[0].worst_row == "d_ep8"  # the int8 rows


def test_inside_the_rows_but_not_the_simulated_ones_vouches_for_nothing(shipped: Path) -> None:
    doc = json.loads(record_path(shipped).read_text())
    doc["rows"] = [r for r in doc["rows"] if r["row"] != "d_ep32"]
    record_path(shipped).write_text(json.dumps(doc))
    led = ledger_of("deepep", "atlas_a3", {**LL, "ep_world_size": 32, "experts_per_rank": 8},
                    "low_latency_dispatch")
    assert not led.calibrated
    assert led.why.startswith("ep_world_size 32 is outside the simulated rows' 8..16; 3 of 4 "
                              "rows simulated")


def test_an_override_every_row_sets_alike_keeps_the_run_on_the_preset() -> None:
    shipped = {"hardware": "atlas_a3", "hardware_name": "atlas_a3",
               "hardware_overrides": {"window.bytes": 2048}}
    assert off_preset(shipped, {"window.bytes": 2048}) == ""
    assert off_preset(shipped, {"window.bytes": 4096}).startswith("hardware_overrides")


def test_a_generic_key_left_out_takes_the_scenario_default(shipped: Path) -> None:
    text = shipped.read_text().splitlines()
    shipped.write_text("\n".join([text[0] + ",routing", *(x + ",uniform" for x in text[1:])]))
    _record(shipped)  # the rows' routing is part of what they simulate
    led = ledger_of("deepep", "atlas_a3", LL, "low_latency_dispatch")  # no routing: balanced
    assert led.why.startswith("routing balanced is not among the table's uniform")
    led = ledger_of("deepep", "atlas_a3", {**LL, "routing": {"kind": "uniform", "seed": 3}},
                    "low_latency_dispatch")
    assert led.calibrated


def test_the_matrix_cell_is_over_all_the_family_rows(shipped: Path) -> None:
    from npusim.fidelity.matrix import cell

    # |+10%|, |-5%|, |+3%|, |-20%| over the four rows: MAPE 9.5%, worst 20% at d_bf16
    assert cell("deepep", "atlas_a3") == ("calibrated: atlas_a3_mine 4 rows, MAPE 9.5%, worst "
                                          "20.0% (d_bf16)")
    assert cell("hixl", "atlas_a3") == "uncalibrated: atlas_a3's tables have no hixl row"
    assert cell("deepep", "atlas_a2") == "uncalibrated: no shipped table of atlas_a2"
    record_path(shipped).unlink()
    assert cell("deepep", "atlas_a3") == "uncalibrated: atlas_a3_mine: 0 of 4 rows simulated"


def test_a_number_that_names_a_configuration_is_matched_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hixl's `servers` (Option.exact): a one-server run is held against the one-server
    rows only (+5% and -10%: MAPE 7.5%, worst 10%), not against the two-server row's +200%,
    and a servers value no row has is outside, as a word would be."""
    head = ("op,bs,h,k,ep_world_size,experts_per_rank,dtype,kernel,path,transport,expansion,"
            "servers,block_bytes,measured_gbps,label")
    rows = {"s1_a": ("put,,,,,,,hixl,D2rD,fabric_mem,aicpu,1,16384", 10.0, 10.5),
            "s1_b": ("put,,,,,,,hixl,D2rD,fabric_mem,aicpu,1,32768", 20.0, 18.0),
            "s2_a": ("put,,,,,,,hixl,D2rD,fabric_mem,aicpu,2,16384", 10.0, 30.0)}
    table = tmp_path / "atlas_a3_mine.csv"
    table.write_text("\n".join([head, *(f"{c},{m},{lab}" for lab, (c, m, _) in rows.items())])
                     + "\n")
    read = read_table(table)
    doc = record_doc(table.stem, "atlas_a3", {m.name for m in read}, read,
                     [rows[m.name][2] for m in read], {})
    record_path(table).write_text(json.dumps(doc))
    monkeypatch.setattr(tables_mod, "targets_dir", lambda: tmp_path)
    run = {"kernel": "hixl", "op": "put", "path": "D2rD", "transport": "fabric_mem",
           "expansion": "aicpu", "block_bytes": 16384}
    (fit,) = ledger_of("hixl", "atlas_a3", {**run, "servers": 1}, "put").tables
    assert fit.matched == 2 and fit.vouches
    assert fit.mape == pytest.approx((0.05 + 0.10) / 2) and fit.worst == pytest.approx(0.10)
    (two,) = ledger_of("hixl", "atlas_a3", {**run, "servers": 2}, "put").tables
    assert two.worst == pytest.approx(2.0) and two.worst_row == "s2_a"
