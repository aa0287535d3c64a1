"""The benchmark script's own logic (the benchmarks themselves run outside the tests)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def _script():
    spec = importlib.util.spec_from_file_location("benchmark_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_instruction_count_is_read_from_cachegrinds_summary():
    stderr = ("==4836== Cachegrind, a high-precision tracing profiler\n"
              "==4836== \n"
              "==4836== I   refs:      6,088,847,890\n")
    assert _script().instruction_refs(stderr) == 6_088_847_890
    with pytest.raises(ValueError, match="I refs"):
        _script().instruction_refs("==1== ERROR SUMMARY: 0 errors\n")


def test_instructions_without_valgrind_is_a_one_line_usage_error(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--instructions", "--only", "bs8"],
                         capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "valgrind is not on PATH" in lines[0]
    assert out.stdout == ""


@pytest.mark.parametrize("args, says", [(["--ep", "8", "--bs", "0"], "--bs 0"),
                                        (["--ep", "8,x"], "--ep '8,x'"),
                                        (["--ep", "1"], "--ep '1'"),
                                        (["--ep", "4"], "workload.k")])
def test_scaling_table_rejects_bad_sizes_in_one_line(args, says):
    script = SCRIPT.parent / "scaling.py"
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "allowed" in lines[0]
    assert out.stdout == ""  # refused before the plain loop is timed or anything runs


@pytest.mark.parametrize("script, args, says", [
    ("layers.py", ["--op", "foo"], "invalid choice: 'foo'"),
    ("layers.py", ["--ep", "4", "--bs", "8"], "workload.k"),
    ("layers.py", ["--bs", "0"], "--bs 0"),
    ("scaling.py", ["--bs", "x"], "invalid int value: 'x'")])
def test_benchmark_options_fail_in_one_line(script, args, says):
    out = subprocess.run([sys.executable, str(SCRIPT.parent / script), *args],
                         capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"benchmarks/{script}: error:")
    assert says in lines[0] and out.stdout == ""


def test_check_says_when_the_baseline_ran_on_another_interpreter(capsys):
    run = _script()
    row = {"name": "dc_bs8_fp16", "workers": 1, "wall_s": 2.0}
    ref = {"plain_simpy_events_per_s": 1e6, "python": "CPython 2.7.18",
           "cases": [dict(row, wall_s=1.0)]}
    # 2 s at 0.5 M loop events/s against 1 s at 1 M: the same cost, within any slack
    assert run.check([row], 5e5, "b.json", ref, {"dc_bs8_fp16": ref["cases"][0]}, 0.0) == 0
    out = capsys.readouterr().out
    assert "baseline ran on CPython 2.7.18" in out and "x1.00" in out
    ref["python"] = run._interpreter()
    run.check([row], 5e5, "b.json", ref, {"dc_bs8_fp16": ref["cases"][0]}, 0.0)
    assert "baseline ran on" not in capsys.readouterr().out


def test_zero_workers_is_a_one_line_usage_error(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--workers", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers 0" in lines[0] and "1 or more" in lines[0]
    assert out.stdout == ""


def test_every_scale_case_is_a_scenario_the_window_holds():
    """The scale group's cases build (W 768 at BS 80), and W 768 at BS 128 is refused by
    the window: per token a data state holds the combine area (K+S) * Align512(2H) =
    8 * 14336 B and the dispatch grid 768 experts * 8192 B slots, 6,406,144 B, and
    510 MiB / 6,406,144 B = 83.5 tokens."""
    from npusim.errors import InputError
    from npusim.scenario import scenario_from_doc

    run = _script()

    def scenario(workload: dict):
        workload = dict(workload)
        doc = {"name": "scale", "hardware": workload.pop("hardware"), "workload": workload}
        return scenario_from_doc(doc, "scale", SCRIPT.parents[1])

    for name in run.SCALE:
        assert scenario(run.CASES[name]).workload.shape.W in (64, 256, 768)
    assert set(run.SCALE_TARGETS) <= set(run.SCALE)
    with pytest.raises(InputError, match=r"bs <= 83\b"):
        scenario(run._a3_ep(768, 128))
    scenario(run._a3_ep(768, 83))
    with pytest.raises(InputError, match="window too small"):
        scenario(run._a3_ep(768, 84))


def test_supernode_cases_are_the_shipped_normal_mode_scenarios():
    """The supernode group runs DeepEP normal mode on the A3 at 4096 tokens, timing only,
    at EP 32, 64 and 128, from the scenario files themselves, and none of it by default."""
    from npusim.scenario import load_scenario

    run = _script()
    for name, path in run.SUPERNODE.items():
        sc = load_scenario(SCRIPT.parents[1] / path)
        w = sc.workload
        assert (w.kernel, w.op, w.shape.BS, w.options["mode"]) == (
            "deepep", "dispatch_combine", 4096, "normal")
        assert w.timing_only and sc.hardware.name == "atlas_a3"
        assert name == f"deepep_a3_normal_ep{sc.tiling.W}_bs4096"
    assert all(f"_ep{w}_" in n for w, n in zip((32, 64, 128), run.SUPERNODE, strict=True))
    assert set(run.SUPERNODE_TARGETS) <= set(run.SUPERNODE)
    assert not set(run.SUPERNODE) & set(run.DEFAULT)


def test_supernode_line_weighs_wall_and_peak_against_the_target():
    run = _script()
    row = {"name": "deepep_a3_normal_ep128_bs4096", "wall_s": 540.0, "cpu_s": 1000.0,
           "events": 100_000_000, "peak_rss_mib": 2048.0, "peak_rss_forked_mib": 2048.0}
    line = run._supernode_line(dict(row), 2e6, 2e6)
    assert "9.0 min wall" in line and "4.3 GB peak" in line and ": met)" in line
    assert "CPU over wall 1.85" in line and "20 loop events per event" in line
    assert "NOT met" in run._supernode_line(dict(row, wall_s=601.0), 2e6, 2e6)
    assert "NOT met" in run._supernode_line(dict(row, peak_rss_forked_mib=9500.0), 2e6, 2e6)


def test_scale_and_supernode_together_is_a_one_line_usage_error():
    out = subprocess.run([sys.executable, str(SCRIPT), "--scale", "--supernode"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--scale with --supernode" in lines[0]
    assert out.stdout == ""


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="Linux pagemap")
def test_memory_breakdown_counts_the_pages_written_and_not_those_only_read():
    import numpy as np

    spec = importlib.util.spec_from_file_location(
        "benchmark_memory", SCRIPT.parent / "memory.py")
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    from npusim.hw.config import load_hardware
    from npusim.hw.machine import Machine

    # 8 cores x 256 KiB: a rank's UB map is a fresh anonymous map (from 1 MiB on), not heap
    # memory that may already be backed
    m = Machine(load_hardware("ascend950", {"chip.aiv_cores": 8}), world=2)
    zero = memory._zero_pfn()
    before = memory.breakdown(m, zero)
    r0 = m.ranks[0]
    r0.window.buf[5 * 4096 + 7] = 1  # one page of rank 0's window
    r0.cores[1].buffers["ub"].data[100:8292] = 3  # two or three pages of a UB
    assert not r0.window.buf[64 * 4096:80 * 4096].any()  # a read maps the zero page only
    after = memory.breakdown(m, zero)
    mib = 4096 / 2**20
    assert after["windows"] - before["windows"] == pytest.approx(mib)
    ub = after["local buffers (UB, L1, ...)"] - before["local buffers (UB, L1, ...)"]
    assert ub == pytest.approx(3 * mib)  # bytes 100..8291 of a page-aligned UB: pages 0-2
    assert np.isfinite(memory._vmrss_mib())


def test_object_census_counts_live_objects_by_type():
    import sys

    spec = importlib.util.spec_from_file_location(
        "benchmark_memory", SCRIPT.parent / "memory.py")
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)

    class CensusProbe:  # a type nothing else makes: exactly the 5000 below are alive
        __slots__ = ("a",)

    probes = [CensusProbe() for _ in range(5000)]
    alloc, rows = memory.census(top=10**6)
    found = {name: (n, mib) for name, n, mib in rows}
    assert found["CensusProbe"][0] == 5000
    assert found["CensusProbe"][1] == pytest.approx(5000 * sys.getsizeof(probes[0]) / 2**20)
    if sys.implementation.name == "cpython":
        # the probes alone are small objects handed out by pymalloc
        assert alloc["pymalloc blocks in use"] >= 5000 * sys.getsizeof(probes[0]) / 2**20
        assert alloc["pymalloc arenas at most"] >= alloc["pymalloc arenas"] > 0


def test_layers_class_functions_by_their_package():
    spec = importlib.util.spec_from_file_location("benchmark_layers",
                                                  SCRIPT.parent / "layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    assert layers.layer_of("/x/npusim/engine/flow.py", "_tick").startswith("flow network")
    assert layers.layer_of("/x/npusim/engine/env.py", "advance").startswith("event loop")
    assert layers.layer_of("/x/site-packages/simpy/events.py", "_resume").startswith("simpy")
    assert layers.layer_of("~", "<built-in method _heapq.heappop>") == "C built-ins: heapq"
    assert layers.layer_of("~", "<method 'fill' of 'numpy.ndarray' objects>") \
        == "C built-ins: numpy"
    assert layers.layer_of("~", "<method 'get' of 'dict' objects>").startswith("C built-ins: d")
    assert layers.layer_of("/usr/lib/python3.11/contextlib.py", "f") == "other Python"


@pytest.mark.skipif(sys.platform != "linux", reason="minor faults as Linux counts them")
def test_usage_counts_a_page_fault_per_page_first_touched():
    run = _script()
    pages = 2048  # 8 MiB of a fresh anonymous map, one byte written in each page
    user0, sys0, faults0 = run._usage()
    run.touch_fresh_pages(pages)
    user1, sys1, faults1 = run._usage()
    assert pages <= faults1 - faults0 < pages + 512  # the interpreter's own few aside
    assert user1 >= user0 and sys1 >= sys0
    assert 0 < run.page_fault_us(mib=4) < 1e6
