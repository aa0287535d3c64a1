"""A built npusim works anywhere: an sdist and a wheel built from a copy of the repository,
the wheel installed into a fresh virtual environment, and that install used from an empty
folder (presets, validate, a shipped scenario by name, the second command name, CANN's
subcommands). Skipped only when no build backend can be had (offline, nothing cached)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "out", "build", "dist", "*.egg-info",
                                    "__pycache__", ".*_cache", ".hypothesis", ".ci")
OFFLINE = ("Could not find a version", "No matching distribution", "Failed to establish",
           "Network is unreachable", "Temporary failure in name resolution")


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "PYTHON"))}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def build(src: Path, dist: Path) -> tuple[Path | None, Path]:
    """sdist (when setuptools is here) and a wheel built from it, as `python -m build` does;
    without setuptools the wheel comes straight from the tree."""
    sdist = None
    try:
        import setuptools  # noqa: F401  (the backend, to make the sdist without a download)
    except ImportError:
        pass
    else:
        res = run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                   f"print(build_meta.build_sdist({str(dist)!r}))"], cwd=src)
        assert res.returncode == 0, res.stderr[-2000:]
        sdist = dist / res.stdout.strip().splitlines()[-1]
    res = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
               str(sdist or src)], cwd=dist)
    if res.returncode != 0 and any(w in res.stderr for w in OFFLINE):
        pytest.skip("no build backend offline: " + res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr[-2000:]
    return sdist, next(dist.glob("npusim-*.whl"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("packaging")
    src, dist, env = tmp / "src", tmp / "dist", tmp / "venv"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    dist.mkdir()
    sdist, wheel = build(src, dist)
    venv.create(env, with_pip=False)
    py = env / "bin" / "python"
    res = run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
               str(wheel)], cwd=tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    # the dependencies from this environment (no download); npusim itself from the wheel
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                     "['purelib'])"], cwd=tmp).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_npusim_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    empty = tmp / "empty"
    empty.mkdir()
    return {"bin": env / "bin", "site": site, "empty": empty, "wheel": wheel,
            "sdist": sdist or wheel}


def test_the_sdist_carries_the_data_where_the_repository_keeps_it(installed):
    if installed["sdist"].suffix != ".gz":
        pytest.skip("no setuptools here to build an sdist")
    with tarfile.open(installed["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    want = {p.relative_to(ROOT).as_posix() for d in ("configs", "scenarios")
            for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert want <= names and "setup.py" in names


def test_the_installed_package_is_the_wheel_with_its_data(installed):
    res = run([str(installed["bin"] / "python"), "-c", "import npusim, importlib.metadata as m;"
               "print(npusim.__file__); print(*m.requires('npusim'), sep='\\n')"],
              cwd=installed["empty"])
    where, *requires = res.stdout.splitlines()
    assert Path(where).is_relative_to(installed["site"])
    assert sorted(r.split(">")[0] for r in requires if "extra" not in r) == \
        ["ml-dtypes", "numpy", "pyyaml", "simpy"]
    data = installed["site"] / "npusim" / "_data"
    for d in ("configs", "scenarios"):
        for p in (ROOT / d).rglob("*.yaml"):
            assert (data / d / p.relative_to(ROOT / d)).read_bytes() == p.read_bytes()


def test_presets_scenarios_and_validate_from_an_empty_folder(installed):
    npusim, empty = str(installed["bin"] / "npusim"), installed["empty"]
    res = run([npusim, "presets"], cwd=empty)
    assert res.returncode == 0, res.stderr
    assert [line.split()[0] for line in res.stdout.splitlines()] == \
        sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    res = run([npusim, "scenarios"], cwd=empty)
    assert res.returncode == 0 and str(installed["site"]) in res.stdout.splitlines()[0]
    listed = {line.split()[0] for line in res.stdout.splitlines() if line.startswith("  ")}
    assert listed == {p.relative_to(ROOT / "scenarios").with_suffix("").as_posix()
                      for p in (ROOT / "scenarios").rglob("*.yaml")}
    res = run([npusim, "validate", "--workers", "2"], cwd=empty)
    assert res.returncode in (0, 1), res.stderr  # 1: a row outside the tolerance
    lines = res.stdout.splitlines()
    assert lines[0].startswith("ascend950 against ") and str(installed["site"]) in lines[0]
    with (ROOT / "configs" / "targets" / "ascend950.csv").open() as f:
        rows = list(csv.DictReader(f))
    mape = next(i for i, line in enumerate(lines) if line.startswith("  MAPE"))
    assert mape - 2 == len(rows)  # header, column titles, then one line per measured row
    assert not list(empty.iterdir())  # nothing written where it ran


def test_a_shipped_scenario_by_name_from_an_empty_folder(installed, tmp_path):
    res = run([str(installed["bin"] / "npusim-moe"), "run", "dispatch_bs8_mxfp8", "--workers",
               "1"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "out" / "dispatch_bs8_mxfp8" / "report.json").read_text())
    assert Path(report["scenario"]["source"]).is_relative_to(installed["site"])
    base = json.loads((ROOT / "reports" / "baselines" / "dispatch_bs8_mxfp8.json").read_text())
    assert [op["latency_us"] for op in report["ops"]] == \
        [op["latency_us"] for op in base["ops"]]


def test_relative_paths_inside_shipped_files_resolve(installed):
    sweep = yaml.safe_load((ROOT / "scenarios" / "sweeps" / "bs_w8_mxfp8.yaml").read_text())
    res = run([str(installed["bin"] / "python"), "-c",
               "from npusim.shipped import sweeps; from npusim.sweep import load_sweep; "
               "print(len(load_sweep(sweeps()['sweeps/bs_w8_mxfp8'])[1]))"],
              cwd=installed["empty"])
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == len(sweep["axes"]["workload.bs"])  # base: ../ found
    # a routing file beside its scenario, read (and checked) from the installed folder
    res = run([str(installed["bin"] / "npusim"), "lint", "examples/routing_file"],
              cwd=installed["empty"])
    assert res.returncode == 0 and res.stdout.startswith("ok  examples/routing_file "), \
        res.stderr


@pytest.mark.parametrize("exe", [["npusim"], ["npusim-moe"], ["python", "-m", "npusim"]])
def test_cann_record_is_one_line_exit_2(installed, exe):
    cmd = [str(installed["bin"] / exe[0]), *exe[1:], "record", "./app", "-s", "Ascend950"]
    res = run(cmd, cwd=installed["empty"])
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "CANN's NPU Simulator" in lines[0]


def test_check_from_a_wheel_says_where_its_baselines_are(installed):
    res = run([str(installed["bin"] / "npusim"), "check"], cwd=installed["empty"])
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "--baselines" in res.stderr
