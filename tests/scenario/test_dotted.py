"""`npusim run/lint --set KEY=VALUE`: dotted keys on top of a scenario file, validated like
the file, errors naming the option and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.dotted import load_scenario_set, parse_sets
from npusim.scenario import scenario_from_doc

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"


def test_values_are_yaml_scalars() -> None:
    got = parse_sets(["a=64", "b=0.5", "c=true", "d=zipf", "e=", "f.g=1e3", "h='007'",
                      "i={kind: zipf, s: 1.1}", "j=a=b"])
    assert got == [("a", 64), ("b", 0.5), ("c", True), ("d", "zipf"), ("e", None),
                   ("f.g", "1e3"), ("h", "007"), ("i", {"kind": "zipf", "s": 1.1}),
                   ("j", "a=b")]  # YAML 1.1 reads 1e3 (no dot) as text


def test_set_equals_the_same_value_written_in_the_file(tmp_path: Path) -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["workload"]["bs"] = 64
    doc["workload"]["routing"] = {"kind": "zipf", "seed": 0, "s": 1.5}
    doc["hardware_overrides"] = {"fabric.egress_gbps": 50}
    doc["run"] = {"sim_time_limit_us": 10}
    doc["name"] = "x"
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    by_set = load_scenario_set(SHIPPED, [
        "workload.bs=64", "workload.routing.kind=zipf", "workload.routing.s=1.5",
        "hardware_overrides.fabric.egress_gbps=50", "run.sim_time_limit_us=10", "name=x"])
    by_file = scenario_from_doc(doc, str(edited), SHIPPED.parent)
    a, b = by_set.to_dict(), by_file.to_dict()
    assert a.pop("source") == str(SHIPPED) and b.pop("source") == str(edited)
    assert a == b
    assert by_set.workload.shape.BS == 64 and by_set.hardware.fabric.egress_gbps == 50.0


def test_set_replaces_a_nested_override_of_the_file(tmp_path: Path) -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["hardware_overrides"] = {"fabric": {"egress_gbps": 500, "ingress_gbps": 400}}
    path = tmp_path / "nested.yaml"
    path.write_text(yaml.safe_dump(doc))
    sc = load_scenario_set(path, ["hardware_overrides.fabric.egress_gbps=50"])
    assert sc.hardware.fabric.egress_gbps == 50.0 and sc.hardware.fabric.ingress_gbps == 400.0


def test_run_with_set_reports_the_resolved_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    assert main(["run", str(SHIPPED), "--out", str(out), "--quiet", "--workers", "1",
                 "--set", "workload.bs=4", "--set", "hardware_overrides.fabric.egress_gbps=50",
                 "--set", "name=what_if"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["scenario"]["name"] == "what_if"
    assert report["scenario"]["workload"]["bs"] == 4
    assert report["scenario"]["hardware_overrides"] == {"fabric.egress_gbps": 50}
    assert report["hardware"]["fabric"]["egress_gbps"] == 50.0
    assert "BS=4" in capsys.readouterr().out


@pytest.mark.parametrize(("sets", "expected"), [
    (["workload.bs=1024"], "command line: --set workload.bs: 1024 is out of range; "
                           "allowed: 1..512"),
    (["workload.bss=3"], "command line: --set workload.bss: unknown key (did you mean 'bs'?)"),
    (["workload.bs=eight"], "command line: --set workload.bs: must be an integer 1..512"),
    (["hardware_overrides.fabric.egres=5"],
     "command line: --set hardware_overrides.fabric.egres: unknown hardware key"),
    (["workload.routing.kind=zipf", "workload.routing.s=abc"],
     "command line: --set workload.routing.s: must be a number"),
    (["name.x=1"], "command line: --set name.x: names no scenario key"),
    (["workload.bs"], "command line: --set: 'workload.bs': allowed: KEY=VALUE"),
    (["workload.bs=1", "workload.bs=2"], "command line: --set workload.bs: given twice"),
    (["workload.bs=[1"], "command line: --set workload.bs: '[1' is not a YAML value"),
    # the error is on a key of the file, made wrong by the values set: both are named
    (["workload.experts_per_rank=1", "workload.ep_world_size=4"],
     "dispatch_bs8_mxfp8.yaml: workload.k: top-k 8 exceeds the 4 experts"),
])
def test_bad_set_is_one_line_exit_2_nothing_written(
        sets: list[str], expected: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    argv = ["run", str(SHIPPED), "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and expected in err, err
    if "workload.k" in expected:
        assert "(with --set workload.experts_per_rank=1, workload.ep_world_size=4)" in err
    assert not out.exists()


def test_lint_applies_set_to_every_file(capsys: pytest.CaptureFixture[str]) -> None:
    other = ROOT / "scenarios" / "dispatch_bs8_none.yaml"
    assert main(["lint", str(SHIPPED), str(other), "--set", "workload.bs=64"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("BS=64" in line for line in out)
    assert main(["lint", str(SHIPPED), "--set", "workload.bs=0"]) == 2
    assert "--set workload.bs: 0 is out of range" in capsys.readouterr().err
