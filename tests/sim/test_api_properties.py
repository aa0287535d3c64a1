"""Property: whatever a caller passes to any argument of npusim.api's public functions,
the call works or raises InputError with one line (docs/api.md); never a TypeError,
RecursionError, KeyError or any other exception from deep inside.

Hypothesis draws (function, argument) from every public entry point and a value from
the kinds probing found trouble with: strings where a flag or number belongs, bools
where a number belongs, NaN, infinities, negative and 400-digit integers, numpy scalars,
bytes, containers that hold themselves or nest 200 deep, objects and callables. Every
other argument keeps a valid value on a tiny timing-only scenario, so a call that works
is quick. Derandomized so CI sees the same cases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npusim.api as npu
from tests.sim.test_api_arguments import TINY, one_point_sweep

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _holds_itself_list() -> list[Any]:
    x: list[Any] = []
    x.append(x)
    return x


def _holds_itself_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["workload"] = d
    return d


def _nested(levels: int) -> Any:
    v: Any = 1
    for _ in range(levels):
        v = [v]
    return v


ODD = [
    "", "false", "true", "0", "x" * 5000, "a\x00b", b"bytes", True, False, None,
    0, 1, 2, -1, -3, 10**400, -(10**400), 0.0, -0.5, 0.05, math.nan, math.inf, -math.inf,
    np.int64(2), np.int64(-3), np.float64(math.nan), np.float32(0.05), np.bool_(True),
    [], {}, (), [1, "a"], ["workload.bs=2"], ["workload.bs"], [5], {"workload.bs": 2},
    {5: 1}, {"": 1}, {"workload": {"bs": np.int64(2)}}, set(), object(), len,
    _holds_itself_list(), _holds_itself_dict(), _nested(200), Path("nowhere"),
]
WRONG = st.one_of(
    st.sampled_from(ODD),
    st.text(alphabet="ab01 _-=\x00é", max_size=12),  # no '/' or '.': stays in tmp
    st.integers(),
    st.floats(),
    st.lists(st.text(alphabet="ab.=", max_size=6), max_size=3),
    st.dictionaries(st.text(alphabet="ab.", max_size=6),
                    st.integers() | st.text(max_size=4), max_size=3),
)
SET_KEYS = ("name", "workload.bs", "workload.timing_only", "workload.routing",
            "workload.routing.seed", "run.sim_time_limit_us", "hardware_overrides",
            "hardware_overrides.fabric.egress_gbps", "data.case_dir")


@pytest.fixture(scope="module")
def done() -> npu.Run:
    return npu.run(TINY)


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-point sweep of the tiny scenario, run once so that later calls resume."""
    path = one_point_sweep(tmp_path_factory.mktemp("sweep"))
    npu.sweep(path, path.parent / "out")
    return path


def _calls(run: npu.Run, sweep: Path) -> dict[str, Callable[[Any], Any]]:
    """Every public entry point's arguments, one at a time, the others valid."""
    out = sweep.parent / "out"
    return {
        "load scenario": lambda v: npu.load(v),
        "load set": lambda v: npu.load(TINY, set=v),
        "load case_dir": lambda v: npu.load(TINY, case_dir=v),
        "run scenario": lambda v: npu.run(v, timing_only=True),
        "run set": lambda v: npu.run(TINY, set=v),
        "run trace": lambda v: npu.run(TINY, trace=v),
        "run timing_only": lambda v: npu.run(TINY, timing_only=v),
        "run workers": lambda v: npu.run(TINY, workers=v),
        "run keep_inputs": lambda v: npu.run(TINY, keep_inputs=v),
        "run progress": lambda v: npu.run(TINY, progress=v),
        "compare a": lambda v: npu.compare(v, run.report),
        "compare b": lambda v: npu.compare(run.report, v),
        "compare tolerance": lambda v: npu.compare(run.report, run.report, tolerance=v),
        "sweep path": lambda v: npu.sweep(v, out),
        "sweep out": lambda v: npu.sweep(sweep, v),
        "sweep workers": lambda v: npu.sweep(sweep, out, workers=v),
        "sweep backend": lambda v: npu.sweep(sweep, out, backend=v),
        "sweep quiet": lambda v: npu.sweep(sweep, out, quiet=v),
        "write out": lambda v: run.write(v),
        "write trace": lambda v: run.write("w", trace=v),
        "write tensors": lambda v: run.write("w", tensors=v),
        "write harness_csv": lambda v: run.write("w", harness_csv=v),
        "latency_us op": lambda v: run.latency_us(v),
        "phases op": lambda v: run.phases(v),
        **{f"set {k}": (lambda v, k=k: npu.load(TINY, set={k: v})) for k in SET_KEYS},
    }


NAMES = sorted(_calls(None, Path()))  # type: ignore[arg-type]  # the names only


@SETTINGS
@given(which=st.sampled_from(NAMES), value=WRONG)
def test_any_argument_works_or_is_one_input_error(done, sweep_file, tmp_path_factory,
                                                 monkeypatch, which, value):
    call = _calls(done, sweep_file)[which]
    with monkeypatch.context() as m:
        m.chdir(tmp_path_factory.mktemp("cwd"))  # what works writes here
        try:
            call(value)
        except npu.InputError as exc:
            text = str(exc)
            assert text and "\n" not in text, (which, text)
