"""npusim lint on sweep files: the base scenario and every axis checked as `npusim sweep`
checks them, nothing run, no user kernel file imported."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npusim import shipped
from npusim.cli import main

BASE = {
    "name": "base",
    "hardware": "ascend950",
    "workload": {
        "op": "dispatch",
        "bs": 4,
        "h": 1024,
        "k": 2,
        "ep_world_size": 2,
        "experts_per_rank": 2,
        "dispatch_quant": "mxfp8",
        "timing_only": True,
    },
}


def sweep_file(tmp_path: Path, axes: dict, base: dict | None = None) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base or BASE))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml", "axes": axes}, sort_keys=False))
    return p


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1, cap.err
    assert cap.err.startswith("npusim: error: ")
    return cap.err


def test_a_good_sweep_passes_with_its_point_count(tmp_path, capsys, monkeypatch):
    # 3 batch sizes x 2 egress values: 6 points, none simulated
    import npusim.sim

    monkeypatch.setattr(npusim.sim, "simulate", lambda *a, **k: pytest.fail("simulated"))
    p = sweep_file(
        tmp_path,
        {
            "workload.bs": [1, 2, 3],
            "hardware_overrides.fabric.egress_gbps": {"start": 100, "stop": 200, "step": 100},
        },
    )
    assert main(["lint", str(p)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ok  {p}  (sweep s: 6 point(s) over workload.bs, ")
    assert out.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_bad_axis_key_is_one_line_exit_2(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs": [1, 2], "workload.nonsense": [1]})
    assert main(["lint", str(p)]) == 2
    err = _one_error(capsys)
    assert str(p) in err and "workload.nonsense: unknown key" in err


def test_an_axis_key_through_a_value_is_one_line_exit_2(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs.x": [1]})
    assert main(["lint", str(p)]) == 2
    err = _one_error(capsys)
    assert f"{p}: axes.workload.bs.x: 'workload.bs.x' names no scenario key" in err


def test_a_bad_axis_value_names_the_point(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs": [4, 0]})
    assert main(["lint", str(p)]) == 2
    err = _one_error(capsys)
    assert f"{p} (point s-0001): workload.bs" in err


@pytest.mark.parametrize(
    "axes, key",
    [
        ({"workload.bs": []}, "axes.workload.bs: empty list"),
        ({"workload.bs": {"start": 4, "stop": 1}}, "axes.workload.bs: a range needs"),
        ([1, 2], "axes: must map dotted scenario keys"),
    ],
)
def test_a_malformed_axis_is_one_line_exit_2(tmp_path, capsys, axes, key):
    p = sweep_file(tmp_path, axes)
    assert main(["lint", str(p)]) == 2
    assert f"{p}: {key}" in _one_error(capsys)


def test_a_missing_base_is_one_line_exit_2(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text("name: s\nbase: nowhere.yaml\naxes: {workload.bs: [1]}\n")
    assert main(["lint", str(p)]) == 2
    assert f"{p}: base: scenario file" in _one_error(capsys)


def test_an_unknown_sweep_key_is_one_line_exit_2(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs": [1]})
    p.write_text(p.read_text() + "extra: 1\n")
    assert main(["lint", str(p)]) == 2
    assert f"{p}: extra: unknown key; allowed: name, description, base, axes" in _one_error(capsys)


def test_set_is_refused_for_a_sweep_file_only(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs": [1]})
    assert main(["lint", str(p), str(tmp_path / "base.yaml"), "--set", "workload.bs=2"]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "--set: applies to scenario files" in cap.err
    assert cap.out.startswith(f"ok  {tmp_path / 'base.yaml'}  (cann_sample dispatch")


def test_lint_does_not_import_a_user_family_of_a_sweep(tmp_path, capsys):
    # importing the file would fail the lint (a run says "RuntimeError: imported")
    (tmp_path / "fam.py").write_text("raise RuntimeError('imported')\n")
    base = {
        "name": "toy",
        "workload": {
            "kernel": "fam.py",
            "op": "dispatch_combine",
            "bs": 5,
            "h": 1024,
            "k": 3,
            "ep_world_size": 4,
            "experts_per_rank": 2,
        },
    }
    p = sweep_file(tmp_path, {"workload.bs": [1, 2]}, base)
    assert main(["lint", str(p)]) == 0, capsys.readouterr().err
    assert "sweep s: 2 point(s)" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(shipped.sweeps()))
def test_every_shipped_sweep_lints_by_name(name, capsys):
    assert main(["lint", name]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"ok  {name}  (sweep ")
