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


def test_zero_workers_is_a_one_line_usage_error(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--workers", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers 0" in lines[0] and "1 or more" in lines[0]
    assert out.stdout == ""
