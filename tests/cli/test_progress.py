"""Progress lines on stderr: after a start delay, at a modest rate, off with --quiet.
The wall clock is a fake one, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import yaml

from npusim import progress
from npusim.cli import main
from npusim.progress import Progress, RunProgress

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"


class FakeClock:
    """Advances `step` seconds every time it is read."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 1000.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_plain_lines_wait_for_the_delay_then_keep_a_modest_rate() -> None:
    now = [0.0]
    out = io.StringIO()
    p = Progress(out, live=False, clock=lambda: now[0])
    for t in (0.5, progress.DELAY_S - 0.1):
        now[0] = t
        p.update(lambda: "x")
    assert out.getvalue() == ""  # a short run says nothing
    now[0] = progress.DELAY_S
    p.update(lambda: "first")
    now[0] = progress.DELAY_S + progress.PLAIN_EVERY_S - 0.1
    p.update(lambda: "too soon")
    now[0] = progress.DELAY_S + progress.PLAIN_EVERY_S
    p.update(lambda: "second")
    assert out.getvalue() == "npusim: first\nnpusim: second\n"


def test_live_line_is_redrawn_in_place_and_cleared() -> None:
    now = [100.0]
    out = io.StringIO()
    p = Progress(out, live=True, clock=lambda: now[0])
    p.update(lambda: "a")  # at the start: not yet
    now[0] += progress.DELAY_S
    p.update(lambda: "a")
    now[0] += progress.LIVE_EVERY_S
    p.update(lambda: "b")
    p.note("point done")
    p.clear()  # nothing drawn since the note: nothing to clear
    assert out.getvalue() == "\rnpusim: a\x1b[K\rnpusim: b\x1b[K\r\x1b[Kpoint done\n"


def test_run_progress_counts_ops_and_events_over_ops() -> None:
    p = RunProgress(2, stream=io.StringIO(), live=False)
    p.begin_op("dispatch")
    p.tick(12345.0, 4096)
    assert p.text().startswith("0/2 ops done; dispatch at 12.345 us simulated, 4,096 events")
    p.tick(20000.0, 9000)
    p.begin_op("combine")
    p.tick(1000.0, 500)
    assert p.text().startswith("1/2 ops done; combine at 1.000 us simulated, 9,500 events")


def _run(tmp_path: Path, *extra: str) -> int:
    return main(["run", str(SHIPPED), "--out", str(tmp_path / "o"), "--workers", "1", *extra])


def test_run_prints_progress_with_the_fields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "CLOCK", FakeClock(step=progress.PLAIN_EVERY_S))
    monkeypatch.setattr(progress, "TICK_MASK", 255)
    assert _run(tmp_path) == 0
    lines = capsys.readouterr().err.splitlines()
    found = [re.fullmatch(r"npusim: 0/1 ops done; dispatch at ([\d.]+) us simulated, "
                          r"([\d,]+) events, .*", line) for line in lines]
    assert lines and all(found), lines
    events = [int(m.group(2).replace(",", "")) for m in found]
    assert events == [256 * (i + 1) for i in range(len(events))]  # one per 256 events
    sim = [float(m.group(1)) for m in found]
    assert sim == sorted(sim) and sim[-1] > 0


def test_quiet_and_short_runs_print_no_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "TICK_MASK", 255)
    monkeypatch.setattr(progress, "CLOCK", FakeClock(step=progress.PLAIN_EVERY_S))
    assert _run(tmp_path, "--quiet") == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "CLOCK", FakeClock(step=1e-4))  # the run "takes" < 1 s
    assert _run(tmp_path) == 0
    assert capsys.readouterr().err == ""


def test_sweep_shows_points_done_of_total_unless_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    base = {"name": "base", "workload": {
        "op": "dispatch", "bs": 2, "h": 1024, "k": 2, "ep_world_size": 2,
        "experts_per_rank": 2, "timing_only": True}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml",
                                     "axes": {"workload.bs": [1, 2, 3]}}))
    monkeypatch.setattr(progress, "CLOCK", FakeClock(step=progress.PLAIN_EVERY_S))
    args = ["sweep", str(sweep), "--workers", "1"]
    assert main([*args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "3 point(s), 0 already done" in err and "[3/3] s-0002" in err
    # a status line comes after each finished point, and also (0/3) whenever the first
    # point takes longer than sweep.WAIT_S of real time, as on a loaded machine
    done = [int(k) for k in re.findall(r"npusim: sweep s: (\d)/3 points done", err)]
    assert done and max(done) >= 1 and all(0 <= k <= 3 for k in done)
    assert done == sorted(done)
