"""Where the ledger shows: the run summary's fidelity lines, report.md's section, and
`npusim validate --record` (what it refuses, what it writes, how it merges)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import npusim.calibrate as calibrate
from npusim.calibrate import read_table
from npusim.cli import main
from npusim.fidelity.ledger import Assumed, Ledger, TableFit
from npusim.fidelity.record import record_path, row_digest
from npusim.report.markdown import format_markdown
from npusim.report.summary import fidelity_lines, format_summary
from npusim.shipped import targets_dir


def _op(name: str, led: Ledger) -> dict:
    return {"op": name, "latency_us": 1.0, "phases": {}, "fidelity": led.as_doc()}


def _fit(table: str, matched: int, mape: float, worst: float, row: str) -> TableFit:
    return TableFit(table, matched, matched, mape, worst, row, True, matched=matched)


def test_one_table_for_every_op_pools_its_rows() -> None:
    a = Ledger("deepep", "atlas_a3", "d", (_fit("t", 3, 0.05, 0.08, "d32"),))
    b = Ledger("deepep", "atlas_a3", "c", (_fit("t", 1, 0.01, 0.02, "c8"),))
    # (3 x 5% + 1 x 1%) / 4 rows = 4.0%; the worst of both is 8%
    assert fidelity_lines([_op("d", a), _op("c", b)]) == [
        "fidelity: calibrated by t (4 rows, MAPE 4.0%, worst 8.0% d32); shape inside"]


def test_ops_that_differ_each_say_their_own() -> None:
    a = Ledger("x", "atlas_a3", "d", (_fit("t", 2, 0.05, 0.08, "d32"),))
    b = Ledger("x", "atlas_a3", "c", why="atlas_a3's tables have no x row of op c")
    (line,) = fidelity_lines([_op("d", a), _op("c", b)])
    assert line == ("fidelity: d calibrated by t (2 rows, MAPE 5.0%, worst 8.0% d32); "
                    "c uncalibrated (atlas_a3's tables have no x row of op c)")


def test_the_same_reason_for_every_op_is_said_once() -> None:
    ops = [_op(n, Ledger("deepep", "atlas_a2", n, why="no shipped table of atlas_a2"))
           for n in ("d", "c")]
    assert fidelity_lines(ops) == ["fidelity: uncalibrated (no shipped table of atlas_a2)"]


def test_a_report_saved_before_ledgers_summarises_without_a_fidelity_line() -> None:
    old = {"scenario": {"name": "s"}, "ops": [{"op": "dispatch", "latency_us": 1.0}]}
    assert "fidelity" not in format_summary(old)
    assert "Fidelity" not in format_markdown(old)


def test_report_md_has_a_fidelity_section_per_op() -> None:
    led = Ledger("deepep", "atlas_a2", "d", why="no shipped table of atlas_a2")
    text = format_markdown({"scenario": {"name": "s"}, "ops": [_op("d", led)]})
    assert "### Fidelity\n\n- uncalibrated (no shipped table of atlas_a2)" in text


@pytest.mark.parametrize("argv, says", [
    (["--hardware", "ascend950", "--table", "atlas_a3", "--record"], "--hardware atlas_a3"),
    (["--hardware", "configs/atlas_a3.yaml", "--table", "atlas_a3", "--record"],
     "--hardware atlas_a3"),
    (["--table", "tests/nowhere.csv", "--record"], "not a shipped table"),
    (["--table", "ascend950", "--table", "atlas_a3", "--record"], "one --table"),
    (["--table", "ascend950", "--map", "m.yaml", "--record"], "--map"),
    (["--rows", "gelu_vf"], "needs --record"),
    (["--record", "--rows", "no_such_row"], "no_such_row"),
])
def test_record_refuses_in_one_line(argv: list[str], says: str, capsys) -> None:
    assert main(["validate", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_record_writes_the_rows_and_merges_a_subset(tmp_path: Path, monkeypatch) -> None:
    lines = (targets_dir() / "ascend950.csv").read_text().splitlines()
    table = tmp_path / "ascend950_gelu.csv"
    table.write_text("\n".join([lines[0], *(x for x in lines if ",cann_gelu," in x)]) + "\n")
    monkeypatch.setattr(calibrate, "TARGETS_DIR", tmp_path)
    argv = ["validate", "--table", "ascend950_gelu", "--record", "--workers", "1"]
    main([*argv, "--rows", "gelu_vf"])
    first = json.loads(record_path(table).read_text())
    assert [r["row"] for r in first["rows"]] == ["gelu_vf"]
    main([*argv, "--rows", "gelu_membase"])
    doc = json.loads(record_path(table).read_text())
    rows = {m.name: m for m in read_table(table)}
    assert [r["row"] for r in doc["rows"]] == ["gelu_membase", "gelu_vf"]  # sorted
    assert doc["rows"][1] == first["rows"][0]  # kept as it was
    assert all(r["digest"] == row_digest(rows[r["row"]]) for r in doc["rows"])
    once = record_path(table).read_bytes()
    main(argv)
    assert record_path(table).read_bytes() == once  # the same rows, the same bytes


def test_a_run_carries_its_ledger_in_the_report_and_the_api() -> None:
    from npusim import api

    run = api.run("examples/gelu_vf", timing_only=True)
    (op,) = run.report["ops"]
    # the scenario runs the VF GeLU: the table's one vf row vouches for it
    assert op["fidelity"]["tables"][0]["matched"] == 1
    assert op["fidelity"]["tables"][0]["worst_row"] == "gelu_vf"
    assert run.ledgers["gelu"].as_doc() == op["fidelity"]
    assert "fidelity: calibrated by ascend950 (1 row," in format_summary(run.report)


def test_record_with_json_keeps_stdout_json(tmp_path: Path, monkeypatch, capsys) -> None:
    lines = (targets_dir() / "ascend950.csv").read_text().splitlines()
    table = tmp_path / "ascend950_gelu.csv"
    table.write_text("\n".join([lines[0], *(x for x in lines if ",gelu_vf," in x)]) + "\n")
    monkeypatch.setattr(calibrate, "TARGETS_DIR", tmp_path)
    main(["validate", "--table", "ascend950_gelu", "--record", "--json", "--workers", "1"])
    out, err = capsys.readouterr()
    assert json.loads(out)["rows"][0]["row"] == "gelu_vf"
    assert err.startswith("record: ")


def test_ops_with_the_same_status_share_it() -> None:
    why = "hardware_overrides (window.bytes): not the shipped preset"
    ops = [_op(n, Ledger("deepep", "atlas_a3", n, why=why)) for n in ("layout", "notify")]
    ops.append(_op("dispatch", Ledger("deepep", "atlas_a3", "dispatch",
                                      (_fit("t", 1, 0.01, 0.01, "d8"),))))
    (line,) = fidelity_lines(ops)
    assert line == (f"fidelity: layout, notify uncalibrated ({why}); dispatch calibrated by t "
                    "(1 row, MAPE 1.0%, worst 1.0% d8)")


def test_the_assumed_line_names_what_moves_the_time_and_where_it_was_measured() -> None:
    """Effects of 0.05% and more show (as 0.1%); smaller ones do not, and when none shows
    the line says so; the reference scenario is named, this run's own is not."""
    def led(*effects: tuple[str, float, str]) -> Ledger:
        return Ledger("mc2", "atlas_a3", "d", why="no row",
                      assumed=tuple(Assumed(k, 1.0, "ns", 0.5, 2.0, e, at=at)
                                    for k, e, at in effects))
    big = led(("a.x", 0.02, "ref_a"), ("b.y", -0.0005, "ref_a"), ("c.z", 0.0004, "ref_a"))
    assert fidelity_lines([_op("d", big)])[1] == (
        "  rests most on a.x (+2.0% per +10%), b.y (-0.1% per +10%) (at ref_a)")
    small = led(("c.z", 0.0004, "this run"))
    assert fidelity_lines([_op("d", small)])[1] == "  no assumed value moves it by 0.1% per +10%"
    two = led(("a.x", 0.02, "ref_a"), ("b.y", 0.01, "ref_b"))
    assert fidelity_lines([_op("d", two)])[1].endswith("(at the reference scenarios)")
