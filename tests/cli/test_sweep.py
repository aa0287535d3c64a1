"""npusim sweep: the cartesian product, the CSV, resuming, and bad sweep files."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import DeadlockError, InputError, KernelError
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


def test_a_huge_range_is_counted_and_refused_before_it_is_built(tmp_path, capsys,
                                                                 monkeypatch):
    import npusim.sweep as sweep

    built = []
    real = sweep._axis_values
    monkeypatch.setattr(sweep, "_axis_values", lambda *a: built.append(a) or real(*a))
    big = {"workload.bs": [1, 2], "hardware_overrides.fabric.egress_gbps":
           {"start": 1, "stop": 10**9, "step": 1}}  # 2 x 10^9 points
    p = sweep_file(tmp_path, big)
    assert main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "axes" in err and f"{2 * 10**9} points" in err
    assert "at most 10000" in err and not built and not (tmp_path / "o").exists()
    p = sweep_file(tmp_path, {"workload.bs": [1, 2, 4]})
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--max-points", "2"]) == 2
    assert "3 points" in capsys.readouterr().err
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--max-points", "0"]) == 2
    assert "--max-points" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e308])
def test_a_range_of_non_finite_or_overflowing_numbers_is_refused(tmp_path, bad):
    spec = {"start": 1, "stop": 2, "step": bad} if bad != 1e308 else \
        {"start": -1e308, "stop": 1e308, "step": 1e-308}
    p = sweep_file(tmp_path, {"hardware_overrides.fabric.egress_gbps": spec})
    with pytest.raises(InputError) as info:
        load_sweep(p)
    assert info.value.key in ("axes", "axes.hardware_overrides.fabric.egress_gbps")


def test_a_truncated_point_report_is_run_again_and_said_so(tmp_path, capsys):
    p = sweep_file(tmp_path, {"workload.bs": [1, 8]})
    out = tmp_path / "out"
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    results = (out / "results.csv").read_text()
    rp = out / "points" / "s-0001" / "report.json"
    whole = rp.read_text()
    cut = whole[: len(whole) // 2]
    rp.write_text(cut)  # a report cut short
    (out / "results.csv").write_text("old\n")
    capsys.readouterr()
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    err = capsys.readouterr().err
    # what the standard parser says of the cut text, wherever the cut fell
    with pytest.raises(json.JSONDecodeError) as bad:
        json.loads(cut)
    assert err == ("npusim: note: sweep point s-0001: its report.json is not a whole report: "
                   f"not JSON ({bad.value.msg}, line {bad.value.lineno}); running it "
                   "again\n")

    def timeless(text: str) -> dict:
        doc = json.loads(text)
        doc["sim"].pop("wall_s")
        return doc

    assert timeless(rp.read_text()) == timeless(whole)
    assert (out / "results.csv").read_text() == results


def test_ctrl_c_in_a_sweep_leaves_whole_point_folders_and_says_so(tmp_path, capsys,
                                                                  monkeypatch):
    from npusim.report import io

    p = sweep_file(tmp_path, {"workload.bs": [1, 8, 16]})
    out = tmp_path / "out"
    real, calls = io.write_text_atomic, []

    def writer(path, text, *a):  # Ctrl-C while the second point's report is written
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(path, text, *a)

    monkeypatch.setattr(io, "write_text_atomic", writer)
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 130
    assert capsys.readouterr().err == (f"npusim: interrupted; 1 of 3 point folders complete "
                                       f"in {out / 'points'} (npusim sweep resumes from "
                                       "them); results.csv not updated\n")
    assert sorted(q.name for q in (out / "points").iterdir()) == ["s-0000"]
    assert sorted(q.name for q in (out / "points" / "s-0000").iterdir()) == [
        "point.json", "report.json"]
    assert not (out / "results.csv").exists()


@pytest.mark.parametrize("decoys", [True, False], ids=["decoys", "no-decoys"])
@pytest.mark.parametrize("keys", [("hardware", "workload.kernel", "workload.routing.path"),
                                  ("hardware", "data.case_dir")], ids=["kernel", "case"])
def test_a_sweep_runs_its_base_as_npusim_run_does(tmp_path, capsys, keys, decoys):
    """The base names its preset, kernel, routing and case files relative to its folder;
    the sweep file is elsewhere, beside files of the same names (or none): every point
    runs on the base's files, with the latency `npusim run` of the base gives."""
    from tests.cli.sweephelp import base_doc, run_latency, sweep_latency, sweep_of, write_files

    write_files(tmp_path / "a", real=True)
    if decoys:
        write_files(tmp_path / "b", real=False)
    base = tmp_path / "a" / "base.yaml"
    base.write_text(yaml.safe_dump(base_doc(base.parent, dict.fromkeys(keys, "relative"))))
    code, want = run_latency(base, tmp_path / "run")
    assert code == 0 and len(want) == 1
    assert sweep_latency(sweep_of(base, tmp_path / "b"), tmp_path / "out") == (0, want)
    assert capsys.readouterr().err == ""


def _fails_in_the_worker(exc: Exception):
    def simulate(*args, **kwargs):
        raise exc
    return simulate


@pytest.mark.parametrize("exc,code,line", [
    (InputError("cases/c1", "data.case_dir", "allowed: a case directory"), 2,
     "npusim: error: cases/c1: data.case_dir: allowed: a case directory"),
    (KernelError("out of bounds", rank=1, core=3, step="send", address=0x40, size=8), 3,
     "npusim: kernel error: rank 1, core 3, step 'send', address 0x40, size 8: "
     "out of bounds"),
    (DeadlockError("deadlock: 2 cores wait", ["rank 0 core 1: wait"]), 3,
     "npusim: deadlock: 2 cores wait; every unfinished core: {blocked}"),
])
def test_an_error_in_a_worker_is_the_one_line_of_a_run(tmp_path, capsys, monkeypatch, exc,
                                                      code, line):
    """An npusim error raised in a worker process reaches the parent whole: the line and
    exit code a run would give; no results.csv and no point folder (a deadlock leaves
    only the point's blocked.txt, as a run leaves it)."""
    import npusim.sim

    monkeypatch.setattr(npusim.sim, "simulate", _fails_in_the_worker(exc))  # workers fork
    p = sweep_file(tmp_path, {"workload.bs": [1]})
    out = tmp_path / "out"
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == code
    blocked = out / "points" / "s-0000" / "blocked.txt"
    assert capsys.readouterr().err == line.format(blocked=blocked) + "\n"
    left = sorted(q for q in out.rglob("*") if q.is_file()) if out.exists() else []
    if isinstance(exc, DeadlockError):
        assert left == [blocked]
        assert blocked.read_text() == "deadlock: 2 cores wait\nrank 0 core 1: wait\n"
    else:
        assert left == []


def _npusim_errors() -> set[type]:
    import npusim.report.compare
    import npusim.runtime.fault  # noqa: F401  (defines PastTimeLimit)
    from npusim.errors import NpusimError

    found, todo = set(), [NpusimError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo += cls.__subclasses__()
    return found


def _errors_of_every_kind() -> list[Exception]:
    from npusim.api import UnknownOp
    from npusim.errors import BlockedError, NpusimError, SimTimeLimitError, WallClockLimitError
    from npusim.report.compare import UnusableInput
    from npusim.runtime.fault import PastTimeLimit

    written = DeadlockError("deadlock: 1 core waits", ["rank 0 core 0: wait flag"])
    written.written = "out/blocked.txt"
    return [NpusimError("plain"), InputError("s.yaml", "workload.bs", "allowed: 1..512"),
            InputError("s.yaml", None, "not a mapping"),
            KernelError("race", rank=2, core="aic1", step="copy", address=0x100, size=32),
            KernelError("no place"), BlockedError("blocked", ["a", "b"]), written,
            SimTimeLimitError("simulated-time limit", []),
            WallClockLimitError("wall-clock limit", ["rank 0 core 0: step send"]),
            UnusableInput("r.json", "not JSON"), UnknownOp("api", "op", "no op 'x'"),
            PastTimeLimit("rank 0 core 1 ran its own clock", " (k.py, line 3)")]


def test_every_npusim_error_survives_pickling_with_its_attributes():
    """A worker's error crosses the process pool by pickle: each class comes back with
    its message, its attributes and the CLI's line and exit code."""
    import pickle

    from npusim.cli.guard import one_line_of

    errors = _errors_of_every_kind()
    assert {type(e) for e in errors} == _npusim_errors()  # a new error class joins the list
    for exc in errors:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and back.args == exc.args
        assert vars(back) == vars(exc) and str(back) == str(exc)
        assert one_line_of(back) == one_line_of(exc)


def _no_ops(doc: dict) -> None:
    doc["ops"] = []


def _nan_latency(doc: dict) -> None:
    doc["ops"][0]["latency_us"] = float("nan")


def _no_phases(doc: dict) -> None:
    del doc["ops"][0]["phases"]


def _inf_phase_end(doc: dict) -> None:
    first = next(iter(doc["ops"][0]["phases"]))
    doc["ops"][0]["phases"][first]["end_us"] = float("inf")


def _no_schema(doc: dict) -> None:
    doc.clear()
    doc["ops"] = []


@pytest.mark.parametrize("spoil,why", [
    (_no_ops, "has no ops"), (_nan_latency, "ops[0].latency_us is nan"),
    (_no_phases, "ops[0] has no phases object"), (_inf_phase_end, "end_us is inf"),
    (_no_schema, "not an npusim report"),
])
def test_a_point_report_compare_would_refuse_is_run_again(tmp_path, capsys, spoil, why):
    """Resuming trusts a point's report only if `npusim compare` accepts it: any other is
    run again, said in one line, and results.csv keeps every row with finite numbers."""
    p = sweep_file(tmp_path, {"workload.bs": [1, 8]})
    out = tmp_path / "out"
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    results = (out / "results.csv").read_text()
    rp = out / "points" / "s-0001" / "report.json"
    doc = json.loads(rp.read_text())
    spoil(doc)
    rp.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and why in err[0]
    assert err[0].startswith("npusim: note: sweep point s-0001: its report.json is not a "
                             "whole report: ") and err[0].endswith("; running it again")
    assert (out / "results.csv").read_text() == results
    rows = list(csv.DictReader(io.StringIO(results)))
    assert [r["point"] for r in rows] == ["s-0000", "s-0001"]
    assert all(math.isfinite(float(v)) for r in rows for k, v in r.items()
               if k.endswith("_us") and v)
    assert json.loads(rp.read_text())["ops"][0]["phases"]


SLOW_KERNEL = '''
import multiprocessing
import os
import time
from pathlib import Path

from npusim.kernels import registry

toy = registry.from_file(registry.resolve_file({toy!r}, None))


class Slow(type(toy)):
    name = "slow_toy"

    def tiling(self, *args, **kwargs):
        if multiprocessing.parent_process() is not None:  # a worker: the point never ends
            (Path({marks!r}) / str(os.getpid())).touch()
            time.sleep(600)
        return super().tiling(*args, **kwargs)


FAMILY = Slow()
'''


def _alive(pid: int) -> bool:
    """Whether a process still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _until(ready, limit_s: float) -> bool:
    """Poll ready() until it holds or limit_s passes (a bound, so no test can hang)."""
    import time

    end = time.monotonic() + limit_s
    while not ready():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def test_ctrl_c_stops_a_sweep_whose_points_are_running(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while points run and
    more wait: the sweep stops its workers and ends at once with exit 130 and the line
    saying what is on disk; no worker is left running."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    marks = tmp_path / "started"
    marks.mkdir()
    (tmp_path / "slow.py").write_text(SLOW_KERNEL.format(
        toy=str(root / "examples" / "kernels" / "toy_moe.py"), marks=str(marks)))
    base = {**BASE, "workload": {**BASE["workload"], "kernel": "slow.py"}}
    base["workload"].pop("dispatch_quant")
    p = sweep_file(tmp_path, {"workload.bs": [1, 2, 3, 4, 5, 6]})
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "npusim", "sweep", str(p), "--out", str(out), "--workers", "2",
         "--quiet"], cwd=root, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert _until(lambda: len(list(marks.iterdir())) == 2, 120), "no point started"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130
    assert err == (f"npusim: interrupted; 0 of 6 point folders complete in {out / 'points'} "
                   "(npusim sweep resumes from them); results.csv not updated\n")
    workers = [int(m.name) for m in marks.iterdir()]
    assert _until(lambda: not any(map(_alive, workers)), 30), "a worker still runs"
    assert not out.exists() or not any(out.rglob("*"))


def test_a_point_report_of_another_point_is_run_again(tmp_path, capsys):
    """Two points' reports swapped (a hand copy): each is a whole report, but of the other
    scenario; trusting it would put BS 8's latency on BS 1's row."""
    p = sweep_file(tmp_path, {"workload.bs": [1, 8]})
    out = tmp_path / "out"
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    results = (out / "results.csv").read_text()
    a, b = (out / "points" / n / "report.json" for n in ("s-0000", "s-0001"))
    text_a, text_b = a.read_text(), b.read_text()
    a.write_text(text_b)
    b.write_text(text_a)
    capsys.readouterr()
    assert main(["sweep", str(p), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"npusim: note: sweep point {mine}: its report.json is not a whole report: "
                   f"it is point {other}'s; running it again"
                   for mine, other in (("s-0000", "s-0001"), ("s-0001", "s-0000"))]
    assert (out / "results.csv").read_text() == results
    assert json.loads(a.read_text())["scenario"]["name"] == "s-0000"
