"""The guard around user code: a user family's declarations of the wrong type (exit 2 at
load), its constructor, its hooks raising or returning the wrong type (exit 3), every
kind of BaseException from a program or at import, and loops that never end, in a
program on every core, at import or in a hook: the wall-clock limit stops them (exit 3)
and so does Ctrl-C (exit 130). Each is one stderr line naming the file, the declaration or
hook and what is allowed, and nothing is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from npusim import api
from npusim.cli import main
from npusim.errors import KernelError
from tests.kernels.userhelp import HEAD

ROOT = Path(__file__).resolve().parents[2]

FAMILY = HEAD + '''

def spin():
    while True: pass  # the loop


{top}


class D(toy.ToyDispatch):
    def program(self, t):
        def program(ctx):
            with ctx.phase("send"):
                ctx.scalar(1)
                {body}
                yield from ctx.sync()
        return program
{kernel}


class F(toy.ToyMoe):
    name = "guarded"
    ops = (D(), toy.ToyCombine())
{family}


FAMILY = {obj}
'''

WORKLOAD = {"op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
            "experts_per_rank": 2, "routing": {"kind": "uniform", "seed": 1}}


def _files(tmp: Path, top: str = "", body: str = "pass", kernel: str = "",
           family: str = "", obj: str = "F()", wall_s: float | None = None) -> tuple[Path, Path]:
    """The kernel file and a scenario naming it."""
    f = tmp / "fam.py"
    f.write_text(FAMILY.format(top=top, body=body, kernel=kernel, family=family, obj=obj))
    doc = {"name": "guarded", "workload": {"kernel": "fam.py", **WORKLOAD}}
    if wall_s is not None:
        doc["run"] = {"wall_time_limit_s": wall_s}
    sc = tmp / "s.yaml"
    sc.write_text(yaml.safe_dump(doc))
    return f.resolve(), sc


def _line(f: Path, marker: str) -> int:
    """The line of the kernel file that holds `marker`."""
    return next(i for i, s in enumerate(f.read_text().splitlines(), 1) if marker in s)


def _run(tmp: Path, capsys, **parts: str) -> tuple[int, str, Path]:
    f, sc = _files(tmp, **parts)
    code = main(["run", str(sc), "--out", str(tmp / "o"), "--quiet", "--workers", "1"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp / "o").exists()
    return code, err, f


@pytest.mark.parametrize("where, text, allowed", [
    ("family", "    ops = 5", "declaration ops = 5; allowed: a tuple of Kernel objects"),
    ("family", "    runs = ['dispatch']",
     "declaration runs = ['dispatch']; allowed: a dict {op name: (kernel name, ...)}"),
    ("family", "    runs = {'dispatch': 'D'}",
     "declaration runs = {'dispatch': 'D'}; allowed: a dict {op name: (kernel name, ...)}"),
    ("family", "    options = 7", "declaration options = 7; allowed: a tuple of Option objects"),
    ("family", "    uses_moe_shape = 'no'",
     "declaration uses_moe_shape = 'no'; allowed: True or False"),
    ("family", "    variants = None",
     "declaration variants = null; allowed: a tuple of Variant objects"),
    ("kernel", "    phases = 'send'",
     "kernel D declaration phases = 'send'; allowed: a tuple of Phase objects"),
    ("kernel", "    outputs = [3]",
     "kernel D declaration outputs = [3]; allowed: a tuple of TensorSpec objects"),
])
def test_a_declaration_of_the_wrong_type_is_exit_2(tmp_path, capsys, where, text, allowed):
    code, err, f = _run(tmp_path, capsys, **{where: text})
    assert code == 2
    assert err.startswith(f"npusim: error: {tmp_path / 's.yaml'}: workload.kernel: {f}: ")
    assert allowed in err


def test_a_constructor_that_raises_is_exit_2_at_its_line(tmp_path, capsys):
    code, err, f = _run(tmp_path, capsys, obj="F",
                        family="    def __init__(self):\n        raise ValueError('no')")
    assert code == 2 and "workload.kernel" in err
    assert (f"{f}: the kernel family's constructor: ValueError: no "
            f"({f}, line {_line(f, 'raise ValueError')})") in err


def test_a_declaration_that_raises_when_read_is_exit_2(tmp_path, capsys):
    code, err, f = _run(tmp_path, capsys, family=(
        "    @property\n    def options(self):\n        raise Odd('options')"))
    assert code == 2 and "workload.kernel" in err
    assert (f"{f}: reading the kernel family's declarations: Odd: options "
            f"({f}, line {_line(f, 'raise Odd')})") in err


# (the family's hook or the kernel's, its arguments, where its owner is, its class)
HOOKS = [
    ("tiling", "self, shape, options, hw, timing_only=False", "family", "F"),
    ("misfit", "self, shape, options, hw, op", "family", "F"),
    ("make_inputs", "self, shape, options, op, routing, payload", "family", "F"),
    ("window", "self, t", "family", "F"),
    ("op_inputs", "self, kernel, t, inputs, previous", "family", "F"),
    ("runs_of", "self, options=None", "family", "F"),
    ("fields", "self, call", "kernel", "D"),
]


# the toy's misfit builds a tiling: without it, tiling is the first hook called
NO_MISFIT = "    def misfit(self, *a):\n        return None\n"


def _hook(where: str, hook: str, args: str, body: str) -> dict[str, str]:
    """The kernel file's part that defines the hook."""
    text = f"    def {hook}({args}):\n        {body}"
    return {where: (NO_MISFIT + text) if hook == "tiling" else text}


@pytest.mark.parametrize("hook, args, where, owner", HOOKS)
def test_a_hook_that_raises_is_exit_3_at_its_line(tmp_path, capsys, hook, args, where,
                                                   owner):
    code, err, f = _run(tmp_path, capsys, **_hook(where, hook, args,
                                                  f"raise ValueError('in {hook}')"))
    assert code == 3
    assert err == (f"npusim: kernel error: {f}: {owner}.{hook} raised ValueError: in {hook} "
                   f"({f}, line {_line(f, 'raise ValueError')})\n")


# what each hook returns instead, and what the line says is allowed
WRONG = {"tiling": ("None", "the call's tiling, an object whose `world` is its ranks"),
         "misfit": ("'too big'", "a npusim.kernels.family.Misfit (key, message) or None"),
         "make_inputs": ("None", "a list of dicts of arrays"),
         "window": ("None", "the window layout, an object with regions()"),
         "op_inputs": ("[{}, {}]", "a list of 2 dicts (one per rank) of the arrays x, "
                                   "expert_ids"),
         "runs_of": ("{'dispatch': ('nope',)}",
                     "a dict whose 'dispatch' names kernels of combine, dispatch"),
         "fields": ("['a']", "a dict of {name: JSON-able value}")}


@pytest.mark.parametrize("hook, args, where, owner", HOOKS)
def test_a_hook_that_returns_the_wrong_type_is_exit_3(tmp_path, capsys, hook, args, where,
                                                      owner):
    value, allowed = WRONG[hook]
    code, err, f = _run(tmp_path, capsys, **_hook(where, hook, args, f"return {value}"))
    assert code == 3
    got = "None" if value == "None" else f"a {type(eval(value)).__name__}"
    assert err.startswith(f"npusim: kernel error: {f}: {owner}.{hook} returned {got}; "
                          f"allowed: {allowed}"), err


# BaseExceptions that are not Exceptions, a KeyboardInterrupt the kernel raises itself and
# an exception whose __str__ raises
RAISES = [
    ("raise GeneratorExit", "GeneratorExit"),
    ("raise Odd('odd')", "Odd: odd"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("raise Mute()", "Mute: (its message cannot be shown: str() raised)"),
]


@pytest.mark.parametrize("value", ["{'a': object()}", "{'a': 10 ** 5000}", "{1: 2}",
                                   "{'a': loop}", "{'a': {'b': np.zeros(2, object)}}"])
def test_fields_the_report_cannot_write_are_exit_3(tmp_path, capsys, value):
    code, err, f = _run(tmp_path, capsys, top="loop = []\nloop.append(loop)", kernel=(
        f"    def fields(self, call):\n        return {value}"))
    assert code == 3
    assert err == (f"npusim: kernel error: {f}: D.fields returned a dict; allowed: a "
                   "dict of {name: JSON-able value}\n")


@pytest.mark.parametrize("zones", ["{'a': ('x', 'y')}", "{'a': (5, 1)}", "{'a': (0,)}",
                                   "[(0, 1)]"])
def test_window_zones_that_are_not_byte_ranges_are_exit_3(tmp_path, capsys, zones):
    code, err, f = _run(tmp_path, capsys, top=f"class W:\n    def regions(self):\n"
                        f"        return {zones}",
                        family="    def window(self, t):\n        return W()")
    assert code == 3
    assert err.startswith(f"npusim: kernel error: {f}: W.regions returned a ")
    assert err.endswith("; allowed: a dict {zone name: (start, end)}, whole bytes "
                        "0 <= start <= end\n")


def _bad_tensor(shape: str) -> str:
    """A kernel part whose output tensor's shape is `shape` (a Python expression of t)."""
    return ("    outputs = (toy.TensorSpec('expand_x', lambda t: np.float32,\n"
            f"                              lambda t, r: {shape}),  # the tensor\n"
            "               *toy.ToyDispatch.outputs[1:])")


def test_a_tensor_shape_that_raises_is_exit_3_at_its_line(tmp_path, capsys):
    code, err, f = _run(tmp_path, capsys, kernel=_bad_tensor("t.nowhere"))
    assert code == 3
    assert err == (f"npusim: kernel error: {f}: D tensor 'expand_x' raised AttributeError: "
                   f"'ToyTiling' object has no attribute 'nowhere' "
                   f"({f}, line {_line(f, 'lambda t, r')})\n")


@pytest.mark.parametrize("shape, shown", [("(-1, 4)", "[-1, 4]"), ("[2, 2]", "[2, 2]"),
                                          ("(2.5,)", "[2.5]"), ("None", "null")])
def test_a_tensor_shape_of_the_wrong_type_is_exit_3(tmp_path, capsys, shape, shown):
    code, err, f = _run(tmp_path, capsys, kernel=_bad_tensor(shape))
    assert code == 3
    assert err == (f"npusim: kernel error: {f}: D tensor 'expand_x': its shape is {shown}; "
                   "allowed: a tuple of whole numbers >= 0\n")


@pytest.mark.parametrize("raise_, says", RAISES)
def test_any_baseexception_in_a_program_is_exit_3(tmp_path, capsys, raise_, says):
    code, err, f = _run(tmp_path, capsys, body=f"{raise_}  # the fault")
    assert code == 3
    assert err == (f"npusim: kernel error: rank 0, core 0, step 'send': the kernel program "
                   f"raised {says} ({f}, line {_line(f, '# the fault')})\n")


@pytest.mark.parametrize("raise_, says", RAISES)
def test_any_baseexception_at_import_is_exit_2(tmp_path, capsys, raise_, says):
    code, err, f = _run(tmp_path, capsys, top=f"{raise_}  # the fault")
    assert code == 2 and "workload.kernel" in err
    assert f"cannot import {f}: {says} ({f}, line {_line(f, '# the fault')})" in err


def test_the_api_raises_the_hooks_kernel_error(tmp_path):
    f, sc = _files(tmp_path, family="    def make_inputs(self, *a, **k):\n        return 5")
    with pytest.raises(KernelError, match=r"F\.make_inputs returned a int; allowed: a list"):
        api.run(sc)


def test_check_fails_the_scenario_naming_the_hook(tmp_path, capsys):
    f, sc = _files(tmp_path, family="    def make_inputs(self, *a, **k):\n"
                                    "        raise Odd('boom')")
    (tmp_path / "b").mkdir()
    assert main(["check", "--scenarios", str(sc), "--baselines", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert (f"FAILED           s  {f}: F.make_inputs raised Odd: boom "
            f"({f}, line {_line(f, 'raise Odd')})") in out
    assert not list((tmp_path / "b").iterdir())


def test_advise_names_the_family_file_of_a_bad_declaration(tmp_path, capsys):
    f, _ = _files(tmp_path, family="    options = 7")
    shape = tmp_path / "shape.yaml"
    shape.write_text(yaml.safe_dump({"name": "shape", "workload": WORKLOAD}))
    assert main(["advise", str(shape), "--family", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--family" in err
    assert f"{f}: kernel family declaration options = 7; allowed: a tuple of Option" in err


# ---- loops that never end: in a subprocess, each bounded by a timeout

SPIN = {"program": {"body": "spin()"},
        "import": {"top": "spin()"},
        "tiling": {"family": NO_MISFIT + "    def tiling(self, *a, **k):\n"
                                        "        spin()"},
        "make_inputs": {"family": "    def make_inputs(self, *a, **k):\n"
                                  "        spin()"},
        "swallowed": {"body": "while True:  # swallows\n                    try:\n"
                              "                        pass\n"
                              "                    except BaseException:\n"
                              "                        pass"}}


def _npusim(sc: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "npusim", "run", str(sc), "--out", str(out),
                             "--quiet", "--workers", "1"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)


def _ended(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("npusim did not stop")
    return proc.returncode, err


@pytest.mark.parametrize("where", list(SPIN))
def test_the_wall_clock_limit_stops_a_loop_anywhere(tmp_path, where):
    f, sc = _files(tmp_path, wall_s=1, **SPIN[where])
    code, err = _ended(_npusim(sc, tmp_path / "o"))
    assert code == 3 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "wall-clock limit of 1 s (run.wall_time_limit_s) reached" in err
    if where == "swallowed":  # stopped where the alarm landed outside its `try`
        first = _line(f, "# swallows")
        assert any(f"({f}, line {n})" in err for n in range(first, first + 5)), err
    else:
        assert f"({f}, line {_line(f, '# the loop')})" in err
    if where in ("program", "swallowed"):  # every core spins: the first one is named, and
        # every unfinished core is listed in blocked.txt, as for a deadlock
        assert err.startswith("npusim: rank 0, core 0, step 'send': "), err
        listing = tmp_path / "o" / "blocked.txt"
        assert err.rstrip().endswith(f"every unfinished core: {listing}"), err
        assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["blocked.txt"]
        assert "rank 0 core 0" in listing.read_text()
    else:  # stopped before any core ran: nothing written
        assert err.startswith("npusim: kernel error: ")
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", list(SPIN))
def test_ctrl_c_stops_a_loop_anywhere(tmp_path, where):
    _, sc = _files(tmp_path, wall_s=600, **SPIN[where])
    proc = _npusim(sc, tmp_path / "o")
    time.sleep(3)  # started, and spinning (a Ctrl-C before the run is exit 130 as well)
    proc.send_signal(signal.SIGINT)
    code, err = _ended(proc)
    assert code == 130 and err.count("\n") == 1 and err.startswith("npusim: interrupted"), err
    assert not (tmp_path / "o").exists()
