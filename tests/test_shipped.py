"""What ships with npusim (presets, target tables, scenarios) found as package data and by
name from any folder; the second command name and `python -m npusim`; CANN's `npusim
record` / `npusim report` answered in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from npusim import __version__, shipped
from npusim.calibrate import default_table
from npusim.cann import wrong_simulator
from npusim.cli import main
from npusim.errors import InputError
from npusim.hw.config import preset_names

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMMANDS = {  # how a user starts this simulator
    "npusim": [str(BIN / "npusim")],
    "npusim-moe": [str(BIN / "npusim-moe")],
    "python -m npusim": [sys.executable, "-m", "npusim"],
}


def repo_names(sweeps: bool) -> set[str]:
    """Shipped names as the repository's files give them (path under scenarios/, no .yaml)."""
    root = ROOT / "scenarios"
    names = set()
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".yaml"):
                rel = (Path(folder) / f).relative_to(root).as_posix()[: -len(".yaml")]
                if rel.startswith("sweeps/") == sweeps:
                    names.add(rel)
    return names


def command(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    exe = COMMANDS[name]
    if not Path(exe[0]).exists():
        pytest.fail(f"{exe[0]} is missing: reinstall npusim (pip install -e .)")
    return subprocess.run([*exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def test_shipped_scenarios_are_the_repository_files():
    table, sweeps = shipped.scenarios(), shipped.sweeps()
    assert set(table) == repo_names(sweeps=False) and len(table) >= 21
    assert set(sweeps) == repo_names(sweeps=True) and len(sweeps) >= 2
    for name, path in {**table, **sweeps}.items():
        assert path.read_bytes() == (ROOT / "scenarios" / f"{name}.yaml").read_bytes()
    # top-level scenarios first, then the subfolders
    assert "/" in list(table)[-1] and "/" not in list(table)[0]


def test_presets_and_tables_are_package_data():
    assert preset_names() == sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    table = default_table("ascend950")
    assert table.read_bytes() == (ROOT / "configs" / "targets" / "ascend950.csv").read_bytes()


def test_resolve_a_name_or_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    want = str(ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml")
    assert shipped.resolve("dispatch_bs8_mxfp8") == want
    assert shipped.resolve("dispatch_bs8_mxfp8.yaml") == want
    assert shipped.resolve("scenarios/dispatch_bs8_mxfp8.yaml") == want  # the README's path
    assert shipped.resolve("link_bound") == str(ROOT / "scenarios/examples/link_bound.yaml")
    assert shipped.resolve("bs_w8_mxfp8", sweep=True) == \
        str(ROOT / "scenarios/sweeps/bs_w8_mxfp8.yaml")
    # a file of that name in this folder wins over the shipped one
    (tmp_path / "dispatch_bs8_mxfp8").write_text("name: mine\n")
    assert shipped.resolve("dispatch_bs8_mxfp8") == "dispatch_bs8_mxfp8"


@pytest.mark.parametrize("arg,sweep,words", [
    ("dispatch_bs8_mxfp", False, ["no such file and no shipped scenario",
                                  "did you mean 'dispatch_bs8_mxfp8'", "npusim scenarios"]),
    ("bs_w8_mxfp8", False, ["is a shipped sweep", "npusim sweep bs_w8_mxfp8"]),
    ("link_bound", True, ["is a shipped scenario", "npusim run link_bound"]),
    ("nothing/like/it.yaml", True, ["no shipped sweep", "npusim scenarios"]),
])
def test_unknown_names_say_where_to_look(tmp_path, monkeypatch, arg, sweep, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        shipped.resolve(arg, sweep=sweep)
    assert info.value.source == arg
    assert all(w in info.value.message for w in words), info.value.message


def test_scenarios_lists_names_and_first_description_lines(capsys):
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split(None, 1)[1] if len(line.split()) > 1 else ""
            for line in out.splitlines() if line.startswith("  ")}
    assert set(rows) == repo_names(False) | repo_names(True)
    for name, text in rows.items():
        doc = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
        assert text == doc["description"].splitlines()[0]


def test_run_by_name_from_an_empty_folder(tmp_path):
    res = command("npusim", "run", "dispatch_bs8_mxfp8", "--out", "o", "--workers", "1",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    by_name = json.loads((tmp_path / "o" / "report.json").read_text())
    assert main(["run", str(ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"), "--out",
                 str(tmp_path / "p"), "--workers", "1"]) == 0
    by_path = json.loads((tmp_path / "p" / "report.json").read_text())
    assert by_name["ops"] == by_path["ops"] and by_name["scenario"]["name"] == \
        "dispatch_bs8_mxfp8"


def test_an_unknown_name_is_one_line_exit_2(tmp_path):
    res = command("npusim", "run", "dispatch_bs8_mxfp", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "did you mean 'dispatch_bs8_mxfp8'" in lines[0]
    assert "npusim scenarios" in lines[0] and not list(tmp_path.iterdir())


def test_check_without_baselines_is_one_line_exit_2(tmp_path):
    res = command("npusim", "check", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "--baselines" in lines[0] and "reports/baselines" in lines[0]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_name_is_this_simulator(tmp_path, name):
    res = command(name, "--version", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.splitlines()[0] == f"npusim {__version__}"
    usage = command(name, "--help", cwd=tmp_path).stdout.splitlines()[0]
    assert usage.startswith(f"usage: {name} ")


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("sub", ["record", "report"])
def test_cann_subcommands_are_one_line_exit_2(tmp_path, name, sub):
    cann = tmp_path / "cann-9.2.0"
    (cann / "bin").mkdir(parents=True)
    (cann / "bin" / "npusim").write_text("#!/bin/sh\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_")}
    res = command(name, sub, "./app", "-s", "Ascend950", cwd=tmp_path,
                  env={**env, "ASCEND_HOME_PATH": str(cann)})
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert "CANN's NPU Simulator" in lines[0] and "MoE dispatch/combine simulator" in lines[0]
    assert f"{cann}/bin/npusim {sub} ..." in lines[0] and "npusim-moe" in lines[0]


def test_cann_path_from_the_environment(tmp_path):
    toolkit = tmp_path / "latest"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "npusim").write_text("")
    line = wrong_simulator("report", {"ASCEND_TOOLKIT_HOME": str(toolkit)}, homes=())
    assert f"run CANN's as {toolkit}/bin/npusim report ..." in line
    # ASCEND_HOME_PATH first; a toolkit without the binary is said so, with where to look
    line = wrong_simulator("record", {"ASCEND_HOME_PATH": str(tmp_path),
                                      "ASCEND_TOOLKIT_HOME": str(toolkit)}, homes=())
    assert f"{tmp_path}/bin/npusim, which is not there" in line and "ls $ASCEND_HOME_PATH" in line
    # no CANN environment and no default install: how to get one
    line = wrong_simulator("record", {}, homes=())
    assert "set_env.sh" in line and "$ASCEND_HOME_PATH/bin/npusim record ..." in line
    # a default install found without the environment
    line = wrong_simulator("record", {}, homes=(str(tmp_path / "none"), str(toolkit)))
    assert f"run CANN's as {toolkit}/bin/npusim record ..." in line
    assert "\n" not in line
