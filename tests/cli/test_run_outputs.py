"""A run's outputs across folders: no output may take another's path, all of them are
placed or none (a folder that refuses a file included), an earlier run's files do not
stay beside new ones, an unwritable folder fails before the simulation, errors name the
destination, new folders get the umask's mode, and Ctrl-C says what it left."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from tests.cli.test_outputs import _files, _scenario

ROOT = Path(__file__).resolve().parents[2]
CLASSIC = ROOT / "scenarios" / "shmem_classic" / "a3_int32_ep2.yaml"  # writes a harness CSV
ONE_OP = "workload.op=dispatch"  # one op: the CSV is FILE itself, not FILE_<op>


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def _spellings(tmp: Path) -> dict[str, str]:
    """Three ways to name tmp/o/report.json: plainly, through a symbolic link to o, and
    through a `..` out of a folder beside it."""
    (tmp / "o").mkdir()
    (tmp / "link").symlink_to(tmp / "o")
    (tmp / "side").mkdir()
    return {"plain": f"{tmp}/o/report.json", "symlink": f"{tmp}/link/report.json",
            "dotdot": f"{tmp}/side/../o/report.json"}


@pytest.mark.parametrize("how", ["plain", "symlink", "dotdot"])
def test_a_harness_csv_onto_the_runs_own_report_is_refused(tmp_path, capsys, how):
    target = _spellings(tmp_path)[how]
    (tmp_path / "o" / "report.json").write_text("old\n")
    err = _one_line(capsys, ["run", str(CLASSIC), "--out", str(tmp_path / "o"),
                             "--harness-csv", target, "--set", ONE_OP, "--quiet"], 2)
    assert err.startswith(f"npusim: error: command line: --harness-csv: {target} is where "
                          f"{tmp_path}/o/report.json (--out) goes; allowed: a path no other "
                          "output of the command uses")
    assert (tmp_path / "o" / "report.json").read_text() == "old\n"
    assert _files(tmp_path / "o") == ["report.json"]


@pytest.mark.parametrize("name", ["report.md", "trace.json", "blocked.txt"])
def test_tensors_where_a_file_of_the_run_goes_is_refused(tmp_path, capsys, name):
    sc = _scenario(tmp_path)
    err = _one_line(capsys, ["run", str(sc), "--out", str(tmp_path / "o"), "--tensors",
                             str(tmp_path / "o" / name), "--quiet"], 2)
    assert err.startswith("npusim: error: command line: --tensors: ") and "allowed: " in err
    assert f"{tmp_path}/o/{name} (--out)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml"]


def test_the_api_refuses_a_harness_csv_onto_the_report(tmp_path):
    from npusim import api
    from npusim.errors import InputError

    run = api.run(str(CLASSIC), set={"workload.op": "dispatch"})
    (tmp_path / "o").mkdir()  # a harness CSV's folder must exist, as on the command line
    (tmp_path / "link").symlink_to(tmp_path / "o")
    with pytest.raises(InputError, match="harness_csv: .* is where .*report.json"):
        run.write(tmp_path / "o", harness_csv=tmp_path / "link" / "report.json")
    assert list((tmp_path / "o").iterdir()) == []


def _refusing(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """As if no file could be renamed into folder (or below it): tests run as root,
    for whom a folder's mode refuses nothing."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(os.fsdecode(dst)).is_relative_to(folder):
            raise PermissionError(13, "Permission denied", os.fsdecode(src), None,
                                  os.fsdecode(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("earlier", [True, False])
def test_a_folder_that_refuses_its_files_leaves_no_output_placed(tmp_path, capsys,
                                                                   monkeypatch, earlier):
    """The report's folder is placed first; the tensors' folder then fails: the report is
    taken back (an earlier run's files restored), the line names the tensors' file."""
    sc = _scenario(tmp_path)
    doc = yaml.safe_load(sc.read_text())
    doc["workload"]["timing_only"] = False
    sc.write_text(yaml.safe_dump(doc))
    out, tensors = tmp_path / "o", tmp_path / "t"
    argv = ["run", str(sc), "--out", str(out), "--tensors", str(tensors), "--quiet",
            "--workers", "1"]
    if earlier:
        assert main([*argv, "--trace"]) == 0
        capsys.readouterr()
    else:
        tensors.mkdir()
    before = {p: (tmp_path / p).read_bytes() for p in _files(tmp_path)
              if (tmp_path / p).is_file()}
    _refusing(monkeypatch, tensors)
    err = _one_line(capsys, [*argv, "--set", "workload.bs=3"], 1)
    assert err.startswith(f"npusim: error: cannot write or read {tensors}/dispatch/rank_")
    assert err.endswith(": Permission denied\n") and ".tmp" not in err
    assert {p: (tmp_path / p).read_bytes() for p in _files(tmp_path)
            if (tmp_path / p).is_file()} == before  # and no temporary file


def test_a_run_without_trace_does_not_leave_an_earlier_trace(tmp_path, capsys):
    sc = _scenario(tmp_path)
    out = tmp_path / "o"
    assert main(["run", str(sc), "--out", str(out), "--trace", "--quiet"]) == 0
    (out / "notes.txt").write_text("mine\n")  # not the run's: it stays
    assert main(["run", str(sc), "--out", str(out), "--quiet", "--set", "workload.bs=3"]) == 0
    assert _files(out) == ["notes.txt", "report.json", "report.md"]
    report = yaml.safe_load((out / "report.json").read_text())
    assert report["scenario"]["workload"]["bs"] == 3


def test_a_stopped_run_leaves_only_its_list_of_cores(tmp_path, capsys):
    """blocked.txt replaces an earlier run's report: the folder tells of one run."""
    sc = _scenario(tmp_path)
    out = tmp_path / "o"
    assert main(["run", str(sc), "--out", str(out), "--trace", "--quiet"]) == 0
    assert main(["run", str(sc), "--out", str(out), "--quiet",
                 "--set", "run.sim_time_limit_us=0.001"]) == 3
    assert f"every unfinished core: {out}/blocked.txt" in capsys.readouterr().err
    assert _files(out) == ["blocked.txt"]


def test_an_unwritable_output_folder_fails_before_the_simulation(tmp_path, capsys,
                                                                  monkeypatch):
    from npusim import sim

    def simulate(*args, **kwargs):
        raise AssertionError("the run simulated before finding its folder unwritable")

    monkeypatch.setattr(sim, "simulate", simulate)
    locked = _locked(monkeypatch, tmp_path / "locked")
    sc = _scenario(tmp_path)
    err = _one_line(capsys, ["run", str(sc), "--out", str(locked / "o"), "--quiet"], 1)
    assert err == f"npusim: error: cannot write or read {locked}/o: Permission denied\n"
    assert list(locked.iterdir()) == []


def _locked(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """folder, made, as a folder that takes no new file (tests run as root, for whom a
    folder's mode refuses nothing)."""
    real = os.open
    folder.mkdir()

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(os.fsdecode(path)).parent == folder:
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    return folder


def test_an_unwritable_sweep_folder_fails_before_any_point_runs(tmp_path, capsys,
                                                                 monkeypatch):
    from npusim import sweep

    def run_points(*args, **kwargs):
        raise AssertionError("a point ran before the folder was found unwritable")

    monkeypatch.setattr(sweep, "run_points", run_points)
    _scenario(tmp_path)
    sw = tmp_path / "sw.yaml"
    sw.write_text(yaml.safe_dump({"name": "sw", "base": "small.yaml",
                                  "axes": {"workload.bs": [1, 2]}}))
    out = _locked(monkeypatch, tmp_path / "o")
    err = _one_line(capsys, ["sweep", str(sw), "--out", str(out), "--quiet"], 1)
    assert err == f"npusim: error: cannot write or read {out}: Permission denied\n"
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_new_output_folders_and_files_have_the_umasks_mode(tmp_path, capsys, umask):
    sc = _scenario(tmp_path)
    doc = yaml.safe_load(sc.read_text())
    doc["workload"]["timing_only"] = False
    sc.write_text(yaml.safe_dump(doc))
    old = os.umask(umask)
    try:
        assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--tensors",
                     str(tmp_path / "t"), "--quiet", "--workers", "1"]) == 0
    finally:
        os.umask(old)
    made = [tmp_path / "o", tmp_path / "t", *(tmp_path / "o").rglob("*"),
            *(tmp_path / "t").rglob("*")]
    for p in made:
        mode = stat.S_IMODE(os.stat(p).st_mode)
        assert mode == (0o777 if p.is_dir() else 0o666) & ~umask, (p, oct(mode))


def _interrupting(monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    """npusim.sim.simulate as Ctrl-C: after `after` simulations that run."""
    from npusim import sim

    real, calls = sim.simulate, [0]

    def simulate(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sim, "simulate", simulate)


def test_ctrl_c_during_the_simulation_says_nothing_was_written(tmp_path, capsys,
                                                                monkeypatch):
    _interrupting(monkeypatch, 0)
    sc = _scenario(tmp_path)
    err = _one_line(capsys, ["run", str(sc), "--out", str(tmp_path / "o"), "--quiet",
                             "--workers", "1"], 130)
    assert err == "npusim: interrupted; nothing written\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml"]


def test_ctrl_c_in_check_says_which_baselines_it_wrote(tmp_path, capsys, monkeypatch):
    first = _scenario(tmp_path)
    second = tmp_path / "second.yaml"
    second.write_text(first.read_text().replace("name: small", "name: second"))
    _interrupting(monkeypatch, 1)
    base = tmp_path / "base"
    assert main(["check", "--update", "--baselines", str(base), "--scenarios", str(first),
                 str(second)]) == 130
    err = capsys.readouterr().err
    assert err == f"npusim: interrupted; outputs complete: {base}/small.json\n"
    assert _files(base) == ["small.json"]


def test_a_window_this_machine_cannot_map_is_out_of_memory(tmp_path, capsys, monkeypatch):
    import mmap

    from npusim.hw.config import load_hardware

    real, window = mmap.mmap, load_hardware("ascend950").window.bytes

    def refuse(fileno, nbytes, *args, **kwargs):
        if nbytes == window:
            raise OSError(12, "Cannot allocate memory")
        return real(fileno, nbytes, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", refuse)
    sc = _scenario(tmp_path)
    err = _one_line(capsys, ["run", str(sc), "--out", str(tmp_path / "o"), "--quiet",
                             "--workers", "1"], 1)
    assert err.startswith(f"npusim: error: out of memory: cannot map {window} B for rank 0's "
                          "window")
    assert not (tmp_path / "o").exists()


def test_a_write_that_fails_names_the_destination_not_the_staging_file(tmp_path, capsys,
                                                                        monkeypatch):
    """A full disk while report.json is staged: the line names DIR/report.json as given,
    and no temporary file stays."""
    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    sc = _scenario(tmp_path)
    err = _one_line(capsys, ["run", str(sc), "--out", str(tmp_path / "o"), "--quiet"], 1)
    assert err == (f"npusim: error: cannot write or read {tmp_path}/o/report.json: No space "
                   "left on device\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml"]


def test_tensors_replace_each_ops_folder_wholly(tmp_path, capsys):
    """A W 4 run's tensors, then a W 2 run's into the same folder: ranks 2 and 3 of the
    earlier run do not stay beside the new ones; a file of the user's does."""
    sc = _scenario(tmp_path)
    doc = yaml.safe_load(sc.read_text())
    doc["workload"]["timing_only"] = False
    sc.write_text(yaml.safe_dump(doc))
    tensors = tmp_path / "t"
    argv = ["run", str(sc), "--out", str(tmp_path / "o"), "--tensors", str(tensors),
            "--quiet", "--workers", "1"]
    assert main([*argv, "--set", "workload.ep_world_size=4"]) == 0
    (tensors / "notes.txt").write_text("mine\n")
    assert main(argv) == 0
    assert sorted(p.name for p in (tensors / "dispatch").iterdir()) == ["rank_0", "rank_1"]
    assert (tensors / "notes.txt").read_text() == "mine\n"
