"""npusim.api: the façade gives what the command gives, and docs/api.md's example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import npusim.api as npu
from npusim import shipped
from npusim.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_docs_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/api.md has a python example"
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), {})  # noqa: S102 - our own doc's example


def test_run_gives_the_report_the_command_writes(tmp_path, capsys):
    assert main(["run", "dispatch_bs8_mxfp8", "--out", str(tmp_path), "--quiet",
                 "--workers", "1"]) == 0
    capsys.readouterr()
    import json

    cli_report = json.loads((tmp_path / "report.json").read_text())
    api_run = npu.run("dispatch_bs8_mxfp8")
    mine = dict(api_run.report)
    for doc in (cli_report, mine):
        doc.pop("sim")  # wall-clock fields
        doc["scenario"].pop("source")
    assert mine == cli_report


def test_latency_and_phases_are_the_reports_numbers():
    r = npu.run("dispatch_combine_bs8", timing_only=True)
    assert r.ops == ["dispatch", "combine"]
    ops = r.report["ops"]
    assert r.latency_us("combine") == ops[1]["latency_us"]
    assert r.latency_us() == pytest.approx(ops[0]["latency_us"] + ops[1]["latency_us"])
    phases = r.phases("dispatch")
    assert list(phases) == list(ops[0]["phases"])
    for name, p in ops[0]["phases"].items():
        assert phases[name] == pytest.approx(p["end_us"] - p["start_us"], abs=1e-4)
    with pytest.raises(KeyError, match="no op 'gemm'"):
        r.latency_us("gemm")


def test_set_is_validated_like_the_command_line():
    s = npu.load("dispatch_bs8_mxfp8", set={"workload.bs": 16})
    assert s.workload.shape.BS == 16
    with pytest.raises(npu.InputError, match=r"^api: set workload\.bs: .*allowed"):
        npu.load("dispatch_bs8_mxfp8", set={"workload.bs": 10**6})
    with pytest.raises(npu.InputError, match="names no scenario key"):
        npu.load("dispatch_bs8_mxfp8", set={"workload.bs.x": 1})


def test_a_mapping_and_a_loaded_scenario_load_again_to_the_same_scenario():
    for name in shipped.scenarios():
        s = npu.load(name)
        again = npu.load(s, set={"name": s.name}).to_dict()
        first = s.to_dict()
        first.pop("source"), again.pop("source")
        assert again == first, name
    workload = {"op": "dispatch", "bs": 8, "h": 7168, "k": 8, "ep_world_size": 8,
                "experts_per_rank": 4}
    doc = {"name": "m", "workload": workload}
    s = npu.load(doc, set={"workload.bs": 16})
    assert s.workload.shape.BS == 16 and doc["workload"]["bs"] == 8  # the caller's data kept


def test_a_loaded_scenario_with_set_changes_only_that_key():
    s = npu.load("dispatch_bs8_mxfp8")
    t = npu.load(s, set={"workload.bs": 32})
    a, b = s.to_dict(), t.to_dict()
    assert (a["workload"]["bs"], b["workload"]["bs"]) == (8, 32)
    a["workload"].pop("bs"), b["workload"].pop("bs"), a.pop("source"), b.pop("source")
    assert a == b


def test_compare_judges_a_slower_b_and_refuses_a_nan_tolerance():
    a = npu.run("dispatch_bs8_mxfp8", timing_only=True).report
    b = npu.run("dispatch_bs8_mxfp8", set={"workload.bs": 64}, timing_only=True).report
    assert npu.compare(a, b).regressed
    assert not npu.compare(b, a).regressed
    assert "verdict: REGRESSED" in str(npu.compare(a, b))
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(npu.InputError, match="tolerance"):
            npu.compare(a, b, tolerance=bad)


def test_write_puts_the_report_files(tmp_path):
    r = npu.run("dispatch_bs8_mxfp8", trace=True)
    written = r.write(tmp_path / "out", trace=True)
    files = [path for _, path, _ in written]
    assert sorted(p.name for p in files) == ["report.json", "report.md", "trace.json"]
    assert all(p.is_file() and p.stat().st_size > 0 for p in files)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_presets_and_scenarios_list_what_ships():
    assert {"ascend950", "atlas_a3", "atlas_a2"} <= set(npu.presets())
    assert "dispatch_bs8_mxfp8" in npu.scenarios()


def test_the_data_is_found_from_a_checkout_installed_without_editable(monkeypatch):
    """pytest from a clone after a plain `pip install .`: npusim is the checkout's, whose
    npusim/_data has no configs or scenarios packages; the folders beside it serve."""
    from importlib import resources

    def missing(package):
        raise ModuleNotFoundError(package)

    monkeypatch.setattr(resources, "files", missing)
    root = Path(shipped.__file__).resolve().parents[1]
    assert shipped.configs_dir() == root / "configs"
    assert shipped.scenarios_dir() == root / "scenarios"
