"""The npusim command: exit codes, one-line errors, no partial output, report on success."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from npusim import __version__
from npusim.cli import main
from npusim.engine.trace import Span
from npusim.errors import DeadlockError, InputError, KernelError, SimTimeLimitError
from npusim.result import OpRun, RunResult

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"
GOOD = """name: good
workload: {op: dispatch, bs: 8, h: 7168, k: 8, ep_world_size: 8, experts_per_rank: 4}
"""
BROKEN = {
    "bad-bs": GOOD.replace("bs: 8", "bs: 9999"),
    "bool-k": GOOD.replace("k: 8", "k: true"),
    "typo": GOOD.replace("experts_per_rank", "expert_per_rank"),
    "yaml": "name: [oops\n",
    "preset": GOOD + "hardware: ascend9500\n",
    "override": GOOD + "hardware_overrides: {fabric.egress_gbps: -1}\n",
    "case": GOOD + "data: {case_dir: missing}\n",
    "empty": "",
}


def npusim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real command in a child process (what a user sees)."""
    return subprocess.run(
        [sys.executable, "-m", "npusim.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def fake_sim(monkeypatch: pytest.MonkeyPatch, behaviour: Any = None) -> dict[str, Any]:
    """Install a stand-in npusim.sim.simulate; returns what it was called with."""
    calls: dict[str, Any] = {}

    def simulate(scenario: Any, detailed_trace: bool = False, workers: int = 1,
                 progress: Any = None) -> RunResult:
        calls["scenario"], calls["detailed_trace"] = scenario, detailed_trace
        calls["workers"] = workers
        if isinstance(behaviour, Exception):
            raise behaviour
        spans = [
            Span(r, c, "phase", name, 100.0 + 10 * r + c, 100.0 + 1000 * (i + 1) + 10 * r)
            for r in range(2)
            for c in range(2)
            for i, name in enumerate(("send_data", "send_status", "wait_status", "local_copy"))
        ]
        op = OpRun("dispatch", 100.0, 5000.0, 2, 2, spans, [], [10, 20], [20, 10], [])
        return RunResult(scenario.to_dict(), scenario.hardware.to_dict(), [op], 42, 0.5)

    module = types.ModuleType("npusim.sim")
    module.simulate = simulate  # type: ignore[attr-defined]
    module.default_workers = lambda: 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "npusim.sim", module)
    return calls


# ---------------------------------------------------------------- subprocess (real command)


def test_broken_scenario_one_line_exit_2_no_output(tmp_path: Path) -> None:
    scen = tmp_path / "broken.yaml"
    scen.write_text(GOOD.replace("bs: 8", "bs: true"))
    proc = npusim("run", str(scen), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"npusim: error: {scen}: workload.bs: ")
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.yaml"]  # no out/ created


def test_presets_and_version_subprocess(tmp_path: Path) -> None:
    proc = npusim("presets", cwd=tmp_path)
    assert proc.returncode == 0 and "ascend950" in proc.stdout and "atlas_a3" in proc.stdout
    proc = npusim("--version", cwd=tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[0] == f"npusim {__version__}"
    assert len(lines) == 2 and lines[1].startswith("compiled core: ")


def test_version_names_a_stale_build_as_not_used(monkeypatch) -> None:
    """A build older than its edited source is not used, and --version says so."""
    from npusim.engine import compiled

    monkeypatch.setattr(compiled, "PURE", False)
    monkeypatch.setattr(compiled, "_stale", lambda module, name: name.endswith("_flow"))
    monkeypatch.setattr(compiled.importlib, "import_module", lambda name: object())
    line = compiled.describe()
    assert "npusim.engine._flow" not in line.split(";")[0]
    assert line.split(";")[1].strip().startswith("not used, older than their edited source: "
                                                 "npusim.engine._flow")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ([], ["run"], ["frobnicate"], ["run", "a.yaml", "--bogus"]):
        proc = npusim(*args, cwd=tmp_path)
        assert proc.returncode == 2, args
        assert proc.stderr.count("\n") == 1 and ": error: " in proc.stderr, args


# ---------------------------------------------------------------- in-process


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_scenarios_in_process(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_sim(monkeypatch)
    scen = tmp_path / f"{name}.yaml"
    scen.write_text(BROKEN[name])
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"npusim: error: {scen}"), err
    assert not out.exists() and not calls  # nothing simulated, nothing written


def test_run_writes_report_and_prints_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_sim(monkeypatch)
    out = tmp_path / "o"
    assert main(["run", str(SHIPPED), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "dispatch: latency" in stdout and "send_data" in stdout and "report:" in stdout
    assert calls["detailed_trace"] is False
    assert calls["workers"] == 7  # the machine's default, unless --workers says otherwise
    rep = json.loads((out / "report.json").read_text())
    assert rep["schema"] == "npusim.report/1"
    assert rep["scenario"]["name"] == "dispatch_bs8_mxfp8"
    assert rep["hardware"]["name"] == "ascend950"
    (op,) = rep["ops"]
    assert op["op"] == "dispatch" and op["latency_us"] == 4.01
    assert list(op["phases"]) == ["send_data", "send_status", "wait_status", "local_copy"]
    assert [r["rank"] for r in op["ranks"]] == [0, 1]
    assert rep["sim"] == {"wall_s": 0.5, "events": 42}
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    first = (out / "report.json").read_bytes()
    first_md = (out / "report.md").read_bytes()
    assert main(["run", str(SHIPPED), "--out", str(out), "--trace"]) == 0
    assert calls["detailed_trace"] is True
    assert (out / "report.json").read_bytes() == first  # identical run, identical bytes
    assert (out / "report.md").read_bytes() == first_md
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", "trace.json"]
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    assert main(["run", str(SHIPPED), "--out", str(out), "--workers", "1"]) == 0
    assert calls["workers"] == 1


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_run_rejects_workers_that_are_not_a_positive_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        value: str) -> None:
    calls = fake_sim(monkeypatch)
    out = tmp_path / "o"
    assert main(["run", str(SHIPPED), "--out", str(out), "--workers", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers" in err and ">= 1" in err and value in err
    assert "usage" not in err
    assert "scenario" not in calls and not out.exists()


@pytest.mark.parametrize("command", [["validate"], ["check"], ["sweep", "s.yaml"],
                                     ["calibrate", "--param", "mte.put_gbps=4:64",
                                      "--out", "fitted.yaml"]])
def test_every_workers_option_rejects_a_non_count_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    assert main([*command, "--workers", "two"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers" in err and "'two'" in err


def test_default_out_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_sim(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(SHIPPED)]) == 0
    assert (tmp_path / "out" / "dispatch_bs8_mxfp8" / "report.json").is_file()


def test_case_dir_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_sim(monkeypatch)
    assert main(["run", str(SHIPPED), "--case-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("npusim: error: command line: --case-dir: ") and "not a directory" in err


def test_out_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = fake_sim(monkeypatch)
    (tmp_path / "f").write_text("x")
    assert main(["run", str(SHIPPED), "--out", str(tmp_path / "f")]) == 2
    assert "--out" in capsys.readouterr().err and not calls


@pytest.mark.parametrize(
    ("exc", "code", "prefix", "nlines"),
    [
        (
            KernelError("UB overflow", rank=1, core=3, step="pack", address=64, size=32),
            3,
            "npusim: kernel error: rank 1, core 3",
            1,
        ),
        (
            DeadlockError("deadlock at 1.000 us: no core can make progress",
                          ["rank 0 core 1 waits", "rank 1 core 2 waits"]),
            3,
            "npusim: deadlock at 1.000 us: no core can make progress; every unfinished core: ",
            1,
        ),
        (SimTimeLimitError("simulated-time limit of 100000.0 us reached"), 3,
         "npusim: simulated-time limit of 100000.0 us reached; every unfinished core: ", 1),
        (InputError("case/x_0.bin", None, "too short"), 2, "npusim: error: case/x_0.bin", 1),
    ],
)
def test_simulation_errors(
    exc: Exception,
    code: int,
    prefix: str,
    nlines: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_sim(monkeypatch, exc)
    out = tmp_path / "o"
    assert main(["run", str(SHIPPED), "--out", str(out)]) == code
    err = capsys.readouterr().err
    assert err.startswith(prefix) and len(err.splitlines()) == nlines, err
    if isinstance(exc, DeadlockError | SimTimeLimitError):  # only the list of waiting cores
        assert sorted(p.name for p in out.iterdir()) == ["blocked.txt"]
        assert str(out / "blocked.txt") in err
        assert (out / "blocked.txt").read_text().splitlines()[1:] == list(exc.blocked)
    else:
        assert not out.exists()


def test_lint_and_presets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN["typo"])
    assert main(["lint", str(SHIPPED)]) == 0
    assert main(["lint", str(SHIPPED), str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("ok ") == 2
    assert "did you mean 'experts_per_rank'" in captured.err
    assert main(["presets"]) == 0
    assert "ascend950" in capsys.readouterr().out


@pytest.mark.parametrize("refused, named", [("tensors", "'expand_x' of rank 0"),
                                             ("ubs", "the UBs of rank 0")])
def test_memory_the_machine_cannot_map_is_a_one_line_out_of_memory_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    refused: str, named: str
) -> None:
    import mmap

    from npusim.hw.config import load_hardware

    real = mmap.mmap
    cfg = load_hardware("ascend950")
    ub_maps = {cfg.chip.aiv_cores * cfg.ub.bytes, cfg.chip.aiv_cores * cfg.ub.bytes // 8}
    window_marks = max(cfg.window.bytes >> 12, 1 << 20)  # one per 4 KiB page, mapped

    def refuse(fileno: int, nbytes: int, *args: Any, **kwargs: Any) -> Any:
        # the 1 GiB windows (and their page marks) are still mapped; the UB maps too
        # unless they are refused
        if nbytes < (1 << 30) and nbytes != window_marks and (
                refused == "ubs" or nbytes not in ub_maps):
            raise OSError(12, "Cannot allocate memory")
        return real(fileno, nbytes, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", refuse)
    out = tmp_path / "out"
    rc = main(["run", str(ROOT / "scenarios" / "dispatch_bs8_none.yaml"), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert err[0].startswith("npusim: error: out of memory: cannot map ")
    assert named in err[0]
    assert not out.exists()


@pytest.mark.parametrize("argv", [[], ["nope"], ["run"], ["run", "x.yaml", "--bogus"],
                                  ["compare", "a.json"], ["sweep", "s.yaml", "--max-points"],
                                  ["calibrate"], ["run", "x.yaml", "--workers"]])
def test_a_usage_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                          argv: list[str]) -> None:
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and ": error: " in cap.err, cap.err
    assert cap.err.startswith("npusim")
