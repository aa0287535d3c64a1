"""Deadlock and time-limit errors stay short at any scale: the unfinished cores grouped by
what they wait for, every one of them listed in DIR/blocked.txt."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.errors import DeadlockError
from npusim.hw.machine import Machine
from npusim.runtime.blocked import GROUPS_BUDGET
from npusim.runtime.conditions import AllEqual
from npusim.runtime.launch import launch
from tests.conftest import round_hw

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"
SHORT = 500  # "a few hundred characters", whatever the output folder's name


def test_w8_time_limit_is_short_and_lists_every_core_in_blocked_txt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["run"] = {"sim_time_limit_us": 5.0}  # launch alone is longer: no core can finish
    scenario = tmp_path / "limit.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    preset = yaml.safe_load((ROOT / "configs" / f"{doc['hardware']}.yaml").read_text())
    world, cores = doc["workload"]["ep_world_size"], preset["chip"]["aiv_cores"]["value"]
    out = tmp_path / "out"

    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and len(err) <= SHORT, err
    assert err.startswith("npusim: simulated-time limit of 5.0 us")
    assert f"{world * cores} of {world * cores} cores still running" in err
    assert str(out / "blocked.txt") in err
    assert sorted(p.name for p in out.iterdir()) == ["blocked.txt"]  # no report
    listed = re.findall(r"^rank (\d+) core (\d+) in step ",
                        (out / "blocked.txt").read_text(), re.M)
    assert sorted((int(r), int(c)) for r, c in listed) == [
        (r, c) for r in range(world) for c in range(cores)]


def _broken(ctx):
    """Cores 0-1 poll a flag nobody sets, 2-5 wait in a SyncAll the pollers never reach,
    6-7 finish."""
    if ctx.core_id < 2:
        with ctx.phase("wait_status"):
            flag = ctx.alloc("flag", 32)
            yield from ctx.wait_until(ctx.window(), 256 + 32 * ctx.core_id, 32,
                                      AllEqual(np.float32, 1.0), flag, name="wait_flag")
    elif ctx.core_id < 6:
        with ctx.phase("barrier"):
            yield from ctx.sync_all()


def test_deadlock_groups_cores_by_step_and_wait() -> None:
    world = 4
    m = Machine(round_hw(chip__aiv_cores=8), world=world)
    with pytest.raises(DeadlockError) as info:
        launch(m, _broken, cores=8)
    e = info.value
    text = str(e)
    # 16 SyncAll waiters (4 per rank) first, then the 8 pollers (2 per rank)
    assert "24 of 32 cores blocked on 4 of 4 ranks" in text
    groups = text.split(": ", 2)[2].split("; ")
    assert groups[0].startswith("16 cores on 4 ranks, step 'barrier', SyncAll")
    assert groups[0].endswith("(e.g. rank 0 core 2)")
    assert groups[1].startswith("8 cores on 4 ranks, step 'wait_status', wait_flag on its "
                                "own window (e.g. rank 0 core 0 at 0x100: 32 B, ")
    assert "1.0" in groups[1] and len(groups) == 2
    cores = [tuple(map(int, re.match(r"rank (\d+) core (\d+)", line).groups()))
             for line in e.blocked]
    assert sorted(cores) == [(r, c) for r in range(world) for c in range(6)]
    assert "0x120" in e.blocked[1]  # rank 0 core 1 polls its own flag, 32 B further


def test_many_groups_are_counted_not_listed() -> None:
    cores = 64

    def program(ctx):  # core 0 never arrives; the others wait in a step each: 63 groups
        if ctx.core_id:
            with ctx.phase(f"step_{ctx.core_id}"):
                yield from ctx.sync_all()

    m = Machine(round_hw(chip__aiv_cores=cores), world=2)
    with pytest.raises(DeadlockError) as info:
        launch(m, program, cores=cores)
    text = str(info.value)
    shown = text.count("cores on 2 ranks")
    more = int(re.search(r"\+(\d+) more groups$", text).group(1))
    assert shown >= 1 and shown + more == cores - 1
    assert len(text) <= 200 + GROUPS_BUDGET
    assert len(info.value.blocked) == 2 * (cores - 1)


def test_blocked_error_survives_pickling() -> None:
    """A sweep point's error crosses a process boundary."""
    e = DeadlockError("deadlock at 1.000 us", ["rank 0 core 1 waits", "rank 1 core 0 waits"])
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == "deadlock at 1.000 us" and back.blocked == e.blocked


def test_a_sweep_point_that_hits_the_limit_leaves_its_list_in_its_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"name": "base", "workload": {
        "op": "dispatch", "bs": 2, "h": 1024, "k": 2, "ep_world_size": 2,
        "experts_per_rank": 2, "timing_only": True}, "run": {"sim_time_limit_us": 1.0}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml",
                                     "axes": {"workload.bs": [1]}}))
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--quiet"]) == 3
    err = capsys.readouterr().err
    listed = out / "points" / "s-0000" / "blocked.txt"
    assert len(err.splitlines()) == 1 and str(listed) in err
    preset = yaml.safe_load((ROOT / "configs" / "ascend950.yaml").read_text())
    assert len(listed.read_text().splitlines()) == 1 + 2 * preset["chip"]["aiv_cores"]["value"]


def test_a_run_that_ends_well_removes_an_old_list(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "blocked.txt").write_text("from an earlier run\n")
    assert main(["run", str(SHIPPED), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    assert not (out / "blocked.txt").exists() and (out / "report.json").is_file()
