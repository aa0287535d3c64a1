"""A user kernel's own faults end the run with one line and exit 3 (exit 2 when its file
cannot be imported), naming rank, core, step, the kernel file and line: an exception, a
yield of something that is not an event, SystemExit, and loops that never yield."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npusim.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "kernels" / "toy_moe.py"

FAULTY = '''
import sys
from npusim.kernels import registry
toy = sys.modules[type(registry.from_file(registry.resolve_file({toy!r}, None))).__module__]


def deep(n):
    return deep(n + 1)


class FaultyDispatch(toy.ToyDispatch):
    def program(self, t):
        def program(ctx):
            with ctx.phase("send"):
                ctx.scalar(1)
                if ctx.rank_id == 1 and ctx.core_id == 2:
                    {body}  # the fault
                yield from ctx.sync()
        return program


class Faulty(toy.ToyMoe):
    name = "faulty_toy"
    ops = (FaultyDispatch(), toy.ToyCombine())


FAMILY = Faulty()
'''


def faulty_scenario(tmp: Path, text: str) -> tuple[Path, str]:
    """A scenario of the kernel file `text` (FAULTY filled in) on W 2, BS 4; and the
    '(file, line N)' of its fault."""
    f = tmp / "faulty.py"
    f.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.endswith("# the fault"))
    w = {"kernel": "faulty.py", "op": "dispatch", "bs": 4, "h": 1024, "k": 2,
         "ep_world_size": 2, "experts_per_rank": 2, "routing": {"kind": "uniform", "seed": 1}}
    sc = tmp / "s.yaml"
    sc.write_text(yaml.safe_dump({"name": "faulty", "workload": w}))
    return sc, f"({f.resolve()}, line {line})"


def _run(tmp: Path, capsys, body: str, *extra: str) -> tuple[int, str, str]:
    """Run the faulty family; (exit code, stderr, 'file, line N' of the fault)."""
    sc, where = faulty_scenario(tmp, FAULTY.format(toy=str(TOY), body=body))
    code = main(["run", str(sc), "--out", str(tmp / "o"), "--quiet", "--workers", "1",
                 *extra])
    return code, capsys.readouterr().err, where


@pytest.mark.parametrize("body, says", [
    ("raise ValueError('bad token')", "raised ValueError: bad token"),
    ("ctx.scalar(1 / 0)", "raised ZeroDivisionError: division by zero"),
    ("deep(0)", "raised RecursionError: maximum recursion depth exceeded"),
    ("raise SystemExit(0)", "raised SystemExit: 0"),
    ("sys.exit(0)", "raised SystemExit: 0"),
])
def test_an_exception_in_a_program_is_one_line_exit_3(tmp_path, capsys, body, says):
    code, err, where = _run(tmp_path, capsys, body)
    assert code == 3
    assert err.count("\n") == 1, err
    assert err.startswith("npusim: kernel error: rank 1, core 2, step 'send': the kernel "
                          f"program {says}")
    if "Recursion" not in says:  # the innermost frame of the file: deep()'s own line
        assert where in err
    assert not (tmp_path / "o" / "report.json").exists()


def test_systemexit_in_a_program_does_not_end_npusim(tmp_path, capsys):
    code, err, _ = _run(tmp_path, capsys, "raise SystemExit(0)")
    assert code == 3 and "a kernel cannot end the simulator" in err


def test_debug_shows_the_kernels_traceback_then_the_line(tmp_path, capsys):
    code, err, where = _run(tmp_path, capsys, "raise ValueError('bad token')", "--debug")
    assert code == 3
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "ValueError: bad token" in err and 'faulty.py"' in err
    assert lines[-1].startswith("npusim: kernel error: rank 1, core 2") and where in lines[-1]


def test_a_yield_of_a_non_event_is_one_line_exit_3(tmp_path, capsys):
    code, err, where = _run(tmp_path, capsys, "yield 42")
    assert code == 3 and err.count("\n") == 1, err
    assert err.startswith("npusim: kernel error: rank 1, core 2, step 'send': the kernel "
                          "program yielded 42, not an event")
    assert where in err


def test_a_loop_charging_its_own_clock_stops_at_the_simulated_time_limit(tmp_path, capsys):
    code, err, where = _run(tmp_path, capsys, "while True: ctx.scalar(1)",
                            "--set", "run.sim_time_limit_us=50")
    assert code == 3 and err.count("\n") == 1, err
    assert err.startswith("npusim: simulated-time limit of 50.0 us reached (rank 1 core 2 "
                          "ran its own clock to")
    listed = (tmp_path / "o" / "blocked.txt").read_text()
    mine = [line for line in listed.splitlines() if line.startswith("rank 1 core 2 ")]
    assert len(mine) == 1 and "in step 'send'" in mine[0] and where in mine[0]


def test_a_loop_that_charges_nothing_stops_at_the_wall_clock_limit(tmp_path, capsys):
    """The limit names the core that ran, and lists every unfinished core in
    DIR/blocked.txt as a deadlock does: here all of them, each waiting in ctx.sync()."""
    from npusim.hw.config import load_hardware

    code, err, where = _run(tmp_path, capsys, "while True: pass",
                            "--set", "run.wall_time_limit_s=0.5")
    assert code == 3 and err.count("\n") == 1, err
    assert err.startswith("npusim: rank 1, core 2, step 'send': wall-clock limit of 0.5 s "
                          "(run.wall_time_limit_s) reached")
    listed = tmp_path / "o" / "blocked.txt"
    assert where in err and err.endswith(f"; every unfinished core: {listed}\n")
    assert sorted(p.name for p in listed.parent.iterdir()) == ["blocked.txt"]
    cores = load_hardware("ascend950").chip.aiv_cores
    lines = listed.read_text().splitlines()[1:]
    assert sorted(line.split(" in step")[0] for line in lines) == sorted(
        f"rank {r} core {c}" for r in range(2) for c in range(cores))


@pytest.mark.parametrize("value", [0, -1, ".nan", ".inf", "soon"])
def test_the_wall_clock_limit_is_a_positive_number(tmp_path, capsys, value):
    code, err, _ = _run(tmp_path, capsys, "pass", "--set", f"run.wall_time_limit_s={value}")
    assert code == 2 and err.count("\n") == 1 and "run.wall_time_limit_s" in err


def test_sys_exit_while_the_kernel_file_is_imported_is_exit_2(tmp_path, capsys):
    f = tmp_path / "fam.py"
    f.write_text("import sys\nsys.exit(0)\n")
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump({"name": "x", "workload": {
        "kernel": "fam.py", "op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
        "experts_per_rank": 2}}))
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload.kernel" in err
    assert f"SystemExit: 0 ({f.resolve()}, line 2)" in err
