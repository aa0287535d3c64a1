"""A path the user gives that is a loop of symbolic links: one line naming where it was
given, exit 2, nothing written, whichever command and key took it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npusim.cli import main

SHAPE = {"name": "x", "hardware": "ascend950",
         "workload": {"op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
                      "experts_per_rank": 2, "timing_only": True}}


def _loop(folder: Path, name: str) -> Path:
    """folder/name -> folder/name.other -> folder/name: resolving it never ends."""
    a, b = folder / name, folder / f"{name}.other"
    a.symlink_to(b.name)
    b.symlink_to(a.name)
    return a


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _case(tmp_path: Path, kind: str) -> tuple[list[str], str]:
    """(the command line, the source and key its error must name)."""
    scenario = tmp_path / "s.yaml"
    out = ["--out", str(tmp_path / "o")]
    if kind == "--case-dir":
        loop = _loop(tmp_path, "case")
        scenario.write_text(yaml.safe_dump(SHAPE))
        return ["run", str(scenario), "--case-dir", str(loop), *out], "command line: --case-dir"
    if kind == "data.case_dir":
        _loop(tmp_path, "case")
        scenario.write_text(yaml.safe_dump({**SHAPE, "data": {"case_dir": "case"}}))
        return ["run", str(scenario), *out], f"{scenario}: data.case_dir"
    if kind == "workload.kernel":
        _loop(tmp_path, "k.py")
        scenario.write_text(yaml.safe_dump(
            {**SHAPE, "workload": {**SHAPE["workload"], "kernel": "k.py"}}))
        return ["run", str(scenario), *out], f"{scenario}: workload.kernel"
    if kind == "base":
        _loop(tmp_path, "base.yaml")
        sweep = tmp_path / "sw.yaml"
        sweep.write_text(yaml.safe_dump({"name": "sw", "base": "base.yaml",
                                         "axes": {"workload.bs": [4, 8]}}))
        return ["sweep", str(sweep), *out], f"{sweep}: base"
    if kind == "hardware":
        _loop(tmp_path, "hw.yaml")
        scenario.write_text(yaml.safe_dump({**SHAPE, "hardware": "hw.yaml"}))
        return ["run", str(scenario), *out], f"{scenario}: hardware"
    if kind == "--hardware":
        loop = _loop(tmp_path, "hw.yaml")
        return ["validate", "--hardware", str(loop)], str(loop)
    loop = _loop(tmp_path, "fam.py")
    return (["advise", "--family", str(loop), *out, "--quiet"], "command line: --family")


@pytest.mark.parametrize("kind", ["--case-dir", "data.case_dir", "workload.kernel", "base",
                                  "--family", "hardware", "--hardware"])
def test_a_symlink_loop_is_one_line_exit_2(kind, tmp_path, capsys):
    argv, where = _case(tmp_path, kind)
    before = _files(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"npusim: error: {where}: ") and "loop of symbolic links" in err[0]
    assert _files(tmp_path) == before
