"""npusim sweep: the cartesian product, the CSV, resuming, and bad sweep files."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.sweep import load_sweep

BASE = {"name": "base", "hardware": "ascend950",
        "workload": {"op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
                     "experts_per_rank": 2, "dispatch_quant": "mxfp8", "timing_only": True}}


def sweep_file(tmp_path: Path, axes: dict) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml", "axes": axes},
                                sort_keys=False))
    return p


def test_axes_expand_to_the_cartesian_product(tmp_path):
    p = sweep_file(tmp_path, {"workload.bs": [1, 2, 3],
                              "hardware_overrides.fabric.egress_gbps": {"start": 100,
                                                                        "stop": 200,
                                                                        "step": 100}})
    _, points = load_sweep(p)
    assert [pt.values for pt in points] == [
        {"workload.bs": b, "hardware_overrides.fabric.egress_gbps": e}
        for b in (1, 2, 3) for e in (100, 200)]
    assert points[3].doc["hardware_overrides"] == {"fabric.egress_gbps": 200}
    assert points[3].doc["workload"]["bs"] == 2


@pytest.mark.parametrize("axes,key", [
    ({"workload.bs": []}, "axes.workload.bs"),
    ({"workload.bs": {"start": 5, "stop": 1}}, "axes.workload.bs"),
    ({"workload.bs": [600]}, "workload.bs"),
    ({"workload.bss": [1]}, "workload.bss"),
])
def test_bad_axes_name_the_file_and_key(tmp_path, axes, key):
    p = sweep_file(tmp_path, axes)
    with pytest.raises(InputError) as info:
        load_sweep(p)
    assert str(p) in str(info.value) and info.value.key == key


def test_description_is_optional_text(tmp_path):
    p = sweep_file(tmp_path, {"workload.bs": [1]})
    doc = yaml.safe_load(p.read_text())
    p.write_text(yaml.safe_dump({**doc, "description": "one point"}))
    assert [pt.values for pt in load_sweep(p)[1]] == [{"workload.bs": 1}]
    p.write_text(yaml.safe_dump({**doc, "description": ["not", "text"]}))
    with pytest.raises(InputError) as info:
        load_sweep(p)
    assert info.value.key == "description" and "string" in info.value.message


def test_sweep_writes_csv_and_resumes(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs": [1, 8]})
    out = tmp_path / "out"
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1"]) == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["point"], r["workload.bs"], r["op"]) for r in rows] == [
        ("s-0000", "1", "dispatch"), ("s-0001", "8", "dispatch")]
    assert all(float(r["latency_us"]) > 0 for r in rows)
    # an interrupted sweep: one point's report is missing -> only that one runs again
    (out / "points" / "s-0001" / "report.json").unlink()
    capsys.readouterr()
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "2 point(s), 1 already done" in err and "s-0001" in err and "s-0000 " not in err
    assert list(csv.DictReader((out / "results.csv").open())) == rows


def test_bad_sweep_file_exits_2(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text("name: s\nbase: nowhere.yaml\naxes: {workload.bs: [1]}\n")
    assert main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "base" in err[0] and "not found" in err[0]
    assert not (tmp_path / "o").exists()


def test_ray_backend_gives_the_same_results(tmp_path, capsys):
    """The same sweep on a local Ray instance: same points, same CSV as with processes."""
    pytest.importorskip("ray")
    p = sweep_file(tmp_path, {"workload.bs": [1, 8]})
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", str(p), "--out", str(local), "--workers", "1"]) == 0
    assert main(["sweep", str(p), "--out", str(ray_out), "--workers", "2",
                 "--backend", "ray"]) == 0
    assert (ray_out / "results.csv").read_text() == (local / "results.csv").read_text()


def test_unknown_backend_is_an_input_error(tmp_path):
    p = sweep_file(tmp_path, {"workload.bs": [1]})
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--backend", "dask"]) == 2
