"""Property: whatever a user's kernel file does wrong, `npusim run` answers exit 0, or one
stderr line and exit 2 (at load) or 3 (its code failed), never a traceback, and writes
nothing when it fails.

Hypothesis writes kernel files (examples/kernels/toy_moe.py subclassed) in which one
declaration of the family or of a kernel has a value of a random type, or one hook (the
family's or a kernel's), the program or the import raises a random kind of exception
(BaseExceptions, KeyboardInterrupt, SystemExit, GeneratorExit, one whose __str__ raises)
or a hook returns a random value. Driven through the CLI's main() in-process,
derandomized so CI sees the same cases.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.cli import main
from tests.kernels.userhelp import HEAD

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

TEMPLATE = HEAD + '''

{top}


class D(toy.ToyDispatch):
{kernel}

    def program(self, t):
        base = super().program(t)

        def program(ctx):
            {body}
            yield from base(ctx)
        return program


class F(toy.ToyMoe):
    name = "prop"
    ops = (D(), toy.ToyCombine())
{family}


FAMILY = F()
'''

FAMILY_DECLARATIONS = ("name", "help", "ops", "runs", "options", "case_format",
                       "uses_moe_shape", "variants", "dispatch_quants", "combine_quants",
                       "references", "chains", "shape_limits")
KERNEL_DECLARATIONS = ("name", "phases", "inputs", "outputs", "scratch", "core_kind",
                       "engines", "variant", "profiles")
# hook -> its arguments after self
FAMILY_HOOKS = {"tiling": "shape, options, hw, timing_only=False",
                "misfit": "shape, options, hw, op",
                "tiling_misfit": "t, shape, options, hw, op",
                "make_inputs": "shape, options, op, routing, payload",
                "op_inputs": "kernel, t, inputs, previous",
                "window": "t",
                "pair_bytes": "t, op, timing_only, workers",
                "runs_of": "options=None"}
KERNEL_HOOKS = {"fields": "call", "cores": "t", "launch_ns": "hw"}
RAISES = ("ValueError('v')", "KeyboardInterrupt", "GeneratorExit", "SystemExit(3)",
          "Odd('o')", "Mute()", "RecursionError", "MemoryError", "StopIteration")
# Python literals of every shape a wrong value takes, among them near misses (a list of one
# dict per rank, of arrays of the wrong kind)
VALUES = st.one_of(
    st.sampled_from(["None", "True", "0", "-1", "3", "1e300", "float('nan')", "'x'", "b''",
                     "[]", "()", "{}", "[{}, {}]", "[{'x': 1}, {'x': 1}]", "{'a': ()}",
                     "{'dispatch': 'D'}", "('a', 'b')", "[3]", "object()", "np.zeros(3)",
                     "lambda *a: None", "{1: 2}", "D()", "[D()]"]),
    st.integers(-5, 5).map(str),
    st.text(max_size=8).map(repr),
    st.lists(st.integers(-2, 2), max_size=3).map(repr),
)
_n = itertools.count()


@st.composite
def faults(draw: st.DrawFn) -> dict[str, str]:
    """One fault of a kernel file: the template parts that hold it."""
    where = draw(st.sampled_from(["declaration", "kernel declaration", "hook", "kernel hook",
                                  "program", "import"]))
    if where in ("declaration", "kernel declaration"):
        names = FAMILY_DECLARATIONS if where == "declaration" else KERNEL_DECLARATIONS
        text = f"    {draw(st.sampled_from(names))} = {draw(VALUES)}"
        return {"family" if where == "declaration" else "kernel": text}
    raise_ = f"raise {draw(st.sampled_from(RAISES))}"
    if where in ("program", "import"):
        return {"body" if where == "program" else "top": raise_}
    hooks = FAMILY_HOOKS if where == "hook" else KERNEL_HOOKS
    hook = draw(st.sampled_from(sorted(hooks)))
    action = draw(st.one_of(st.just(raise_), VALUES.map(lambda v: f"return {v}")))
    text = f"    def {hook}(self, {hooks[hook]}):\n        {action}"
    return {"family" if where == "hook" else "kernel": text}


def _run(tmp: Path, parts: dict[str, str]) -> tuple[int, str, Path]:
    n = next(_n)  # a new file each time: the registry keeps a file's family
    f = tmp / f"fam{n}.py"
    f.write_text(TEMPLATE.format(**{"top": "", "kernel": "", "family": "", "body": "pass",
                                    **parts}))
    sc = tmp / f"s{n}.yaml"
    sc.write_text(yaml.safe_dump({"name": "prop", "workload": {
        "kernel": f.name, "op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
        "experts_per_rank": 2, "routing": {"kind": "uniform", "seed": 1}}}))
    out = tmp / f"o{n}"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", str(sc), "--out", str(out), "--quiet", "--workers", "1"])
    return code, err.getvalue(), out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("userkernels")


def test_the_template_runs_as_it_is(folder):
    code, err, out = _run(folder, {})
    assert code == 0, err
    assert (out / "report.json").is_file()


@SETTINGS
@given(parts=faults())
def test_any_fault_of_a_user_kernel_is_exit_0_or_one_line(folder, parts):
    code, err, out = _run(folder, parts)
    # a MemoryError is out of memory wherever it comes from: this machine's (exit 1)
    memory = code == 1 and "out of memory" in err and "MemoryError" in str(parts)
    assert code in (0, 2, 3) or memory, err[:2000]
    if code == 0:
        assert (out / "report.json").is_file()
        return
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[:2000]
    assert len(err) < 5000, err[:2000]
    assert not out.exists()
