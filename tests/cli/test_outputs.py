"""Outputs go only to regular files or new paths, and appear whole or not at all: a FIFO
or device node at any output path is refused in one line (exit 2) and left as it was; a
Ctrl-C while outputs are written leaves none of them, and says so."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from npusim.cli import main

SMALL = {"name": "small", "hardware": "ascend950",
         "workload": {"op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
                      "experts_per_rank": 2, "timing_only": True}}


def _scenario(tmp: Path) -> Path:
    p = tmp / "small.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    return p


def _fifo(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(p)
    return p


def _one_line_exit_2(capsys, argv: list[str], says: str) -> str:
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err
    assert err.count("\n") == 1 and says in err, err
    return err


# every output option of every command, pointed at a FIFO (or a FIFO inside its folder)
OUTPUTS = {
    "run --out DIR (DIR/report.json a FIFO)":
        (["run", "{sc}", "--out", "{tmp}/o"], "o/report.json"),
    "run --trace (DIR/trace.json a FIFO)":
        (["run", "{sc}", "--out", "{tmp}/o", "--trace"], "o/trace.json"),
    "run --out FIFO": (["run", "{sc}", "--out", "{tmp}/f"], "f"),
    "run --tensors FIFO": (["run", "{sc}", "--out", "{tmp}/o", "--tensors", "{tmp}/f"], "f"),
    "run --harness-csv FIFO":
        (["run", "{sc}", "--out", "{tmp}/o", "--harness-csv", "{tmp}/f.csv"], "f.csv"),
    "sweep --out DIR (DIR/results.csv a FIFO)":
        (["sweep", "{sw}", "--out", "{tmp}/o"], "o/results.csv"),
    "plot --out FIFO": (["plot", "{tmp}/in.csv", "--out", "{tmp}/f.png"], "f.png"),
    "calibrate --out FIFO": (["calibrate", "--param", "chip.clock_ghz=1:2", "--out",
                              "{tmp}/f.yaml"], "f.yaml"),
    "calibrate --report FIFO": (["calibrate", "--param", "chip.clock_ghz=1:2", "--out",
                                 "{tmp}/p.yaml", "--report", "{tmp}/f.json"], "f.json"),
    "check --update --baselines FIFO":
        (["check", "--update", "--baselines", "{tmp}/f", "--scenarios", "{sc}"], "f"),
}


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_an_output_onto_a_fifo_is_refused_and_the_fifo_stays(tmp_path, capsys, case):
    argv, fifo = OUTPUTS[case]
    sc = _scenario(tmp_path)
    sw = tmp_path / "sw.yaml"
    sw.write_text(yaml.safe_dump({"name": "sw", "base": "small.yaml",
                                  "axes": {"workload.bs": [1]}}))
    (tmp_path / "in.csv").write_text("point,op,latency_us\n")
    f = _fifo(tmp_path / fifo)
    argv = [a.format(sc=sc, sw=sw, tmp=tmp_path) for a in argv]
    _one_line_exit_2(capsys, argv, "is a FIFO")
    assert stat.S_ISFIFO(os.stat(f).st_mode)
    assert not (tmp_path / "o" / "report.md").exists()


def test_a_character_device_is_never_replaced(tmp_path, capsys):
    sc = _scenario(tmp_path)
    _one_line_exit_2(capsys, ["run", str(sc), "--out", "/dev/null"], "a character device")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_the_writer_itself_refuses_a_fifo(tmp_path):
    from npusim.errors import InputError
    from npusim.report.io import write_text_atomic

    f = _fifo(tmp_path / "x.json")
    with pytest.raises(InputError, match="is a FIFO"):
        write_text_atomic(f, "{}")
    assert stat.S_ISFIFO(os.stat(f).st_mode)


@pytest.mark.parametrize("option", ["--out", "--tensors", "--harness-csv"])
def test_an_empty_output_path_is_refused(tmp_path, capsys, option, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sc = _scenario(tmp_path)
    _one_line_exit_2(capsys, ["run", str(sc), option, ""], f"{option}: '': must be a")
    assert not (tmp_path / "out").exists()


def _interrupt_after(monkeypatch, module, name: str, calls: int) -> None:
    """Make module.name raise KeyboardInterrupt on its calls-th call (a Ctrl-C mid-way)."""
    real = getattr(module, name)
    seen = [0]

    def writer(*args, **kwargs):
        seen[0] += 1
        if seen[0] == calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, writer)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_ctrl_c_while_tensors_are_written_leaves_nothing(tmp_path, capsys, monkeypatch):
    from npusim.report import tensors

    sc = _scenario(tmp_path)
    doc = yaml.safe_load(sc.read_text())
    doc["workload"]["timing_only"] = False
    sc.write_text(yaml.safe_dump(doc))
    _interrupt_after(monkeypatch, tensors, "write_bytes_atomic", 3)  # 2 of its files written
    before = _files(tmp_path)
    assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--trace", "--tensors",
                 str(tmp_path / "t"), "--quiet", "--workers", "1"]) == 130
    err = capsys.readouterr().err
    assert err == "npusim: interrupted; nothing written\n"
    assert _files(tmp_path) == before  # no report, no tensors, no temporary file


def test_ctrl_c_during_an_existing_folders_update_keeps_the_old_outputs(tmp_path, capsys,
                                                                         monkeypatch):
    from npusim.report import trace

    sc = _scenario(tmp_path)
    out = tmp_path / "o"
    assert main(["run", str(sc), "--out", str(out), "--quiet"]) == 0
    old = {p: (out / p).read_bytes() for p in _files(out)}
    capsys.readouterr()
    monkeypatch.setattr(trace, "dumps_trace", lambda t: (_ for _ in ()).throw(
        KeyboardInterrupt))  # report.json and report.md staged, then Ctrl-C
    assert main(["run", str(sc), "--out", str(out), "--trace", "--quiet",
                 "--set", "workload.bs=3"]) == 130
    assert "nothing written" in capsys.readouterr().err
    assert {p: (out / p).read_bytes() for p in _files(out)} == old
    assert _files(tmp_path) == sorted(["small.yaml", "o", *(f"o/{p}" for p in old)])


def test_ctrl_c_held_off_while_the_outputs_are_renamed(tmp_path, capsys, monkeypatch):
    """A Ctrl-C that lands while the staged outputs are renamed into place waits until
    all are: the run says its outputs are complete."""
    import signal

    from npusim import outputs

    real = outputs._place

    def place(staged, undo):
        signal.raise_signal(signal.SIGINT)
        real(staged, undo)

    monkeypatch.setattr(outputs, "_place", place)
    sc = _scenario(tmp_path)
    assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--quiet"]) == 130
    assert capsys.readouterr().err == f"npusim: interrupted; outputs complete: {tmp_path}/o\n"
    assert _files(tmp_path / "o") == ["report.json", "report.md"]


@pytest.mark.parametrize("staged", [".o.", ".t."])
def test_a_real_ctrl_c_while_outputs_are_written_leaves_all_or_none(tmp_path, staged):
    """SIGINT to the real command once it writes its outputs (the report's, then the
    tensors' temporary folder has appeared): one line, exit 130, and no partial output
    and no temporary file left."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    sc = root / "scenarios" / "dispatch_combine_bs8.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "npusim.cli", "run", str(sc), "--out",
                             str(tmp_path / "o"), "--tensors", str(tmp_path / "t"),
                             "--trace", "--quiet", "--workers", "1"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    while proc.poll() is None and not any(p.name.startswith(staged)
                                          for p in tmp_path.iterdir()):
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert not [p for p in left if p.startswith(".") or "/." in p]  # no temporary file
    if proc.returncode == 0:  # finished before the signal came
        return
    assert proc.returncode == 130 and err.count("\n") == 1, err
    if err == "npusim: interrupted; nothing written\n":
        assert left == []
    else:
        assert err.startswith("npusim: interrupted; outputs complete: ")
        assert {"o/report.json", "o/report.md", "o/trace.json"} <= set(left)
        for op in ("dispatch", "combine"):  # every op, rank and side
            for r in range(8):
                for side in ("in", "out"):
                    assert any(p.startswith(f"t/{op}/rank_{r}/{side}/") and p.endswith(".npy")
                               for p in left)


def test_check_update_never_writes_a_baseline_over_a_fifo(tmp_path, capsys):
    sc = _scenario(tmp_path)
    f = _fifo(tmp_path / "base" / "small.json")  # the baseline of scenario 'small'
    assert main(["check", "--update", "--baselines", str(tmp_path / "base"),
                 "--scenarios", str(sc)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("unusable") and "is a FIFO" in out
    assert stat.S_ISFIFO(os.stat(f).st_mode)
