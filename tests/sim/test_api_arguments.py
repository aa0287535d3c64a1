"""npusim.api checks its own arguments: a wrong type or value is one InputError naming
the argument and what is allowed, before anything runs or is written (docs/api.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import npusim.api as npu
from npusim import sweep as sweep_module
from npusim.cli import main

# W 2, BS 1, H 1024: one run takes a fraction of a second
TINY = {"name": "tiny", "workload": {"op": "dispatch", "bs": 1, "h": 1024, "k": 1,
                                      "ep_world_size": 2, "experts_per_rank": 1,
                                      "timing_only": True}}


def one_point_sweep(folder: Path) -> Path:
    """A sweep file of one point, the tiny scenario, written into folder."""
    (folder / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (folder / "one.yaml").write_text(yaml.safe_dump(
        {"name": "one", "base": "tiny.yaml", "axes": {"workload.bs": [1]}}))
    return folder / "one.yaml"


@pytest.fixture(scope="module")
def done() -> npu.Run:
    return npu.run(TINY)


def _refused(call, line: str) -> npu.InputError:
    """The call raises InputError whose whole text is `line` (a regular expression)."""
    with pytest.raises(npu.InputError) as caught:
        call()
    assert re.fullmatch(line, str(caught.value)), str(caught.value)
    return caught.value


def test_timing_only_and_the_other_flags_take_only_a_bool():
    functional = {**TINY, "workload": {**TINY["workload"], "timing_only": False}}
    _refused(lambda: npu.run(functional, timing_only="false"),
             r"api: timing_only: 'false'; allowed: True or False")
    _refused(lambda: npu.run(TINY, trace=1), r"api: trace: 1; allowed: True or False")
    _refused(lambda: npu.run(TINY, keep_inputs="no"),
             r"api: keep_inputs: 'no'; allowed: True or False")
    assert npu.run(functional, timing_only=True).scenario.workload.timing_only is True
    assert npu.run(TINY, timing_only=None).scenario.workload.timing_only is True


def test_set_is_a_mapping_or_a_list_of_key_value_texts():
    _refused(lambda: npu.load(TINY, set="workload.bs=2"),
             r"api: set: 'workload\.bs=2'; allowed: a mapping of dotted keys to values .* "
             r"or a list of 'KEY=VALUE' texts")
    _refused(lambda: npu.load(TINY, set=[5]), r"api: set: 5: allowed: KEY=VALUE text")
    _refused(lambda: npu.load(TINY, set=["workload.bs"]),
             r"api: set: 'workload\.bs': allowed: KEY=VALUE with a dotted scenario key.*")
    _refused(lambda: npu.load(TINY, set={5: 1}),
             r"api: set: 5: allowed: a dotted scenario key, e\.g\. workload\.bs")
    assert npu.load(TINY, set=["workload.bs=2", "workload.h=2048"]).workload.shape.BS == 2
    assert npu.load(TINY, set=("workload.h=2048",)).workload.shape.H == 2048


def test_a_value_that_holds_itself_or_nests_too_deep_is_refused():
    loop: dict = {}
    loop["x"] = loop
    _refused(lambda: npu.load(TINY, set={"hardware_overrides": loop}),
             r"api: set hardware_overrides: a mapping or list that contains itself; "
             r"allowed: .*")
    doc = {"name": "x", "workload": loop}
    _refused(lambda: npu.load(doc), r"api: scenario: a mapping or list that contains "
             r"itself; allowed: .*")
    deep: list = [1]
    for _ in range(1000):
        deep = [deep]
    _refused(lambda: npu.load(TINY, set={"workload.routing": deep}),
             r"api: set workload\.routing: nested deeper than 64 levels; allowed: .*")
    shared = [1, 2]  # the same list twice is no loop: the scenario's own check judges it
    _refused(lambda: npu.load(TINY, set={"workload.bs": [shared, shared]}),
             r"api: set workload\.bs: must be an integer .*")


def test_numpy_integers_count_as_integers_and_bools_do_not():
    s = npu.load(TINY, set={"workload.bs": np.int64(16), "workload.h": np.int32(2048),
                            "hardware_overrides.fabric.egress_gbps": np.int64(50),
                            "run.sim_time_limit_us": np.float32(1000.0)})
    assert (s.workload.shape.BS, s.workload.shape.H) == (16, 2048)
    assert type(s.workload.shape.BS) is int
    assert s.hardware.fabric.egress_gbps == 50.0
    assert s.run.sim_time_limit_us == 1000.0
    doc = {**TINY, "workload": {**TINY["workload"], "bs": np.uint8(4)}}
    assert npu.load(doc).workload.shape.BS == 4
    for flag in (True, np.bool_(True)):
        _refused(lambda flag=flag: npu.load(TINY, set={"workload.bs": flag}),
                 r"api: set workload\.bs: must be an integer 1\.\..*, got .*")


@pytest.mark.parametrize("bad", ["2", 0, -3, True, 1.5, None, np.float64(2.0)])
def test_workers_is_a_positive_integer(tmp_path, bad):
    line = r"api: workers: .*; allowed: an integer >= 1"
    _refused(lambda: npu.run(TINY, workers=bad), line)
    if bad is not None:  # sweep's workers=None is its default: one per CPU
        _refused(lambda: npu.sweep("bs_w8_mxfp8", tmp_path / "o", workers=bad), line)
    assert not (tmp_path / "o").exists()


def test_numpy_workers_are_accepted():
    assert npu.run(TINY, workers=np.int64(1)).ops == ["dispatch"]


def test_progress_is_none_or_a_callable():
    _refused(lambda: npu.run(TINY, progress=5), r"api: progress: 5; allowed: None or a callable")
    _refused(lambda: npu.run(TINY, progress=True),
             r"api: progress: true; allowed: None or a callable")
    seen: list[str] = []
    npu.run(TINY, progress=seen.append)
    assert seen == ["dispatch"]


def test_compare_takes_a_finite_real_tolerance_and_reports_or_paths(done):
    a = done.report
    for bad, shown in ((True, "true"), ("0.05", "'0.05'"), (math.nan, r"\.nan"),
                       (10**400, r"<an integer of about 401 digits>"), (-1, "-1")):
        _refused(lambda bad=bad: npu.compare(a, a, tolerance=bad),
                 rf"api: tolerance: {shown}; allowed: a finite number >= 0")
    assert not npu.compare(a, a, tolerance=np.float64(0.05)).regressed
    assert not npu.compare(a, a, tolerance=np.int64(0)).regressed
    _refused(lambda: npu.compare(5, a), r"api: a: int; allowed: a report as data .*")
    _refused(lambda: npu.compare(a, [a]), r"api: b: list; allowed: a report as data .*")


def test_sweep_out_must_be_a_folder_path_and_backend_a_known_one(tmp_path):
    _refused(lambda: npu.sweep("bs_w8_mxfp8", "/dev/null"),
             r"api: out: /dev/null is a character device, not a directory; allowed: a "
             r"folder or a new path")
    f = tmp_path / "file"
    f.write_text("mine")
    _refused(lambda: npu.sweep("bs_w8_mxfp8", f),
             rf"api: out: {f} is a regular file, not a directory; allowed: .*")
    assert f.read_text() == "mine"
    _refused(lambda: npu.sweep("bs_w8_mxfp8", 7), r"api: out: 7; allowed: a path .*")
    _refused(lambda: npu.sweep(None, tmp_path / "o"), r"api: path: null; allowed: a path .*")
    _refused(lambda: npu.sweep("bs_w8_mxfp8", tmp_path / "o", backend="threads"),
             r"api: backend: 'threads'; allowed: processes, ray")
    _refused(lambda: npu.sweep("bs_w8_mxfp8", tmp_path / "o", quiet="yes"),
             r"api: quiet: 'yes'; allowed: True or False")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_sweep_starts_no_more_processes_than_points(tmp_path, monkeypatch):
    path = one_point_sweep(tmp_path)
    real = sweep_module.ProcessPoolExecutor
    asked: list[int] = []

    def pool(max_workers: int, **kw):
        asked.append(max_workers)
        assert max_workers <= 1, "a process per worker would be forked"
        return real(max_workers=max_workers, **kw)

    monkeypatch.setattr(sweep_module, "ProcessPoolExecutor", pool)
    csv = npu.sweep(path, tmp_path / "o", workers=10**9)
    assert asked == [1]
    assert len(csv.read_text().splitlines()) == 2  # the header and the one point


def test_case_dir_errors_name_the_argument(tmp_path):
    _refused(lambda: npu.load("dispatch_bs8_mxfp8", case_dir=tmp_path / "none"),
             rf"api: case_dir: {tmp_path / 'none'} is not a directory")
    _refused(lambda: npu.load(TINY, case_dir=3), r"api: case_dir: 3; allowed: a path .*")


def test_an_unknown_op_is_an_input_error_and_a_key_error(done):
    for call in (lambda: done.latency_us("gemm"), lambda: done.phases(5)):
        error = _refused(call, r"api: op: no op ('gemm'|5) in this run; allowed: dispatch")
        assert isinstance(error, KeyError)


def test_write_refuses_what_the_command_refuses(tmp_path, capsys, done):
    out = tmp_path / "out"
    _refused(lambda: done.write(out, harness_csv=tmp_path / "perf.csv"),
             r"api: harness_csv: kernel family 'cann_sample' records no harness frames; "
             r"allowed with shmem_classic .*")
    assert main(["run", "dispatch_bs8_mxfp8", "--set", "workload.timing_only=true", "--out",
                 str(out), "--harness-csv", str(tmp_path / "perf.csv"), "--quiet"]) == 2
    assert "npusim: error: command line: --harness-csv: kernel family 'cann_sample' records " \
           "no harness frames" in capsys.readouterr().err
    _refused(lambda: done.write(out, harness_csv=tmp_path / "no" / "perf.csv"),
             rf"api: harness_csv: folder {tmp_path / 'no'} does not exist")
    _refused(lambda: done.write(out, tensors=tmp_path / "t"),
             r"api: tensors: this run kept no input tensors; allowed with a run made by "
             r"run\(\.\.\., keep_inputs=True\)")
    _refused(lambda: done.write(5), r"api: out: 5; allowed: a path .*")
    _refused(lambda: done.write(out, trace="yes"), r"api: trace: 'yes'; allowed: True or False")
    _refused(lambda: done.write("/dev/null"),
             r"api: out: /dev/null is a character device, not a directory; allowed: .*")
    assert list(tmp_path.iterdir()) == []
