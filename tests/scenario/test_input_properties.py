"""Property: whatever scalar a user sets on whatever key (`npusim lint --set KEY=VALUE`),
npusim answers exit 0, or exactly one line and exit 2; never a traceback.

Two key groups, each drawn by hypothesis with 50 values: every key of a scenario (the
generic workload keys, routing, run, data, and every option its family declares, for an
mc2 scenario on the 950 and A3 and an rms_norm_quant one on A2), and every value of every
preset as a hardware override. The values are the ones probing found trouble with: NaN,
infinities, integers past float range and past Python's 4300-digit limit (decimal and
hexadecimal), long strings, nested YAML aliases (9^levels items), odd text. Driven through
the CLI's main() in-process with lint (no run), derandomized so CI sees the same cases.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.cli import main
from npusim.hw.config import load_hardware, preset_names
from npusim.kernels import registry

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
# small shapes, so that one lint is quick whatever key a value lands on
BASES: dict[str, dict[str, Any]] = {
    "ascend950": {"kernel": "mc2", "op": "dispatch_combine", "bs": 4, "h": 1024, "k": 2,
                  "ep_world_size": 2, "experts_per_rank": 2, "dtype": "bfloat16",
                  "routing": {"kind": "uniform", "seed": 1}},
    "atlas_a2": {"kernel": "rms_norm_quant", "op": "rms_norm_quant", "step": 2, "rows": 64,
                 "cols": 256},
}
BASES["atlas_a3"] = BASES["ascend950"]
GENERIC = ("name", "description", "hardware", "workload.kernel", "workload.op",
           "workload.bs", "workload.h", "workload.k", "workload.ep_world_size",
           "workload.experts_per_rank", "workload.dtype", "workload.shared_experts",
           "workload.shared_expert_ranks", "workload.timing_only", "workload.routing",
           "workload.routing.kind", "workload.routing.seed", "workload.routing.s",
           "workload.routing.sigma", "workload.routing.path", "run.sim_time_limit_us",
           "data.case_dir", "hardware_overrides")


def _leaves(doc: Any, prefix: str) -> list[str]:
    if not isinstance(doc, dict):
        return [prefix]
    return [k for key, v in doc.items() for k in _leaves(v, f"{prefix}.{key}")]


def _scenario_keys() -> list[tuple[str, str]]:
    """(preset, dotted key): every generic key and every option of the base's family."""
    keys = []
    for preset, wl in BASES.items():
        family = registry.get(wl["kernel"])
        own = tuple(f"workload.{o.name}" for o in family.options)
        keys += [(preset, k) for k in GENERIC + own]
    return keys


def _hardware_keys() -> list[tuple[str, str]]:
    """(preset, hardware_overrides.KEY) for every value of every shipped preset."""
    return [(name, k) for name in preset_names()
            for k in _leaves(load_hardware(name).to_dict(), "hardware_overrides")
            if not k.endswith(".name")]


def _bomb(levels: int) -> str:
    rows = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return f"[{', '.join(rows)}]"


VALUES = st.one_of(
    st.sampled_from([".nan", "-.nan", ".inf", "-.inf", "1e400", "-1e400", "nan", "null",
                     "~", "true", "''", "[]", "{}", "[.nan]", "{a: .inf}", "0", "-1",
                     "{a: 1, a: 2}", "{<<: {a: 1}, a: 2}", "*nowhere", "!!int x"]),
    st.integers(-(10 ** 12), 10 ** 12).map(str),
    st.integers(300, 6000).map(lambda n: "9" * n),  # past float range / the digit limit
    st.integers(300, 6000).map(lambda n: "0x" + "f" * n),  # no digit limit in base 16
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(10 ** 4, 10 ** 6).map(lambda n: "x" * n),  # long strings
    st.integers(1, 9).map(_bomb),  # nested aliases: 9^levels items in a few bytes
    st.text(max_size=40),
)


def _lint(tmp: Path, preset: str, key: str, text: str) -> tuple[int, str]:
    path = tmp / f"{preset}.yaml"
    if not path.exists():
        doc = {"name": "p", "hardware": preset, "workload": BASES[preset]}
        path.write_text(yaml.safe_dump(doc))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["lint", str(path), "--set", f"{key}={text}"])
    return code, err.getvalue()


def _check(code: int, err: str) -> None:
    assert code in (0, 2), err[:2000]
    if code == 2:
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err[:2000]
        assert len(err) < 5000, err[:2000]  # a bounded message, whatever the value


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bases")


def test_every_base_is_valid(bases: Path) -> None:
    for preset in BASES:
        assert _lint(bases, preset, "description", "base")[0] == 0


@SETTINGS
@given(key=st.sampled_from(_scenario_keys()), text=VALUES)
def test_any_value_on_any_scenario_key_is_exit_0_or_one_line(bases, key, text):
    _check(*_lint(bases, *key, text))


@SETTINGS
@given(key=st.sampled_from(_hardware_keys()), text=VALUES)
def test_any_value_on_any_preset_value_is_exit_0_or_one_line(bases, key, text):
    _check(*_lint(bases, *key, text))
