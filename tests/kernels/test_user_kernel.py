"""Kernel families users write: examples/kernels/toy_moe.py (the docs/authoring.md
tutorial) named by file, checked against its own numpy reference, its phases in the
report, a deliberately broken variant caught by the sanitiser, and every way a user
family can fail to load as one line with exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.kernels import registry
from npusim.report.build import build_report
from npusim.scenario import load_scenario
from npusim.sim import load_inputs, simulate
from tests.kernels.cann_sample.samplehelp import assert_bytes_equal

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "kernels" / "toy_moe.py"
SHIPPED = ROOT / "scenarios" / "examples" / "user_kernel.yaml"


def _scenario(tmp: Path, kernel: str | Path = TOY, **extra) -> Path:
    w = {"kernel": str(kernel), "op": "dispatch_combine", "bs": 5, "h": 1024, "k": 3,
         "ep_world_size": 4, "experts_per_rank": 2, "routing": {"kind": "uniform", "seed": 4},
         **extra}
    p = tmp / "toy.yaml"
    p.write_text(yaml.safe_dump({"name": "toy", "workload": w}))
    return p


def _toy_module():
    return sys.modules[type(registry.from_file(TOY)).__module__]


@pytest.mark.parametrize("scale", [True, False])
def test_outputs_match_the_familys_own_reference(tmp_path, scale):
    sc = load_scenario(_scenario(tmp_path, scale_by_weight=scale))
    toy = _toy_module()
    result = simulate(sc)
    t, inputs = sc.tiling, load_inputs(sc)
    want = toy.FAMILY.reference_dispatch(t, inputs)
    dispatch, combine = result.ops
    for r in range(t.world):
        for name, arr in want[r].items():
            assert_bytes_equal(dispatch.outputs[r][name], arr, f"rank {r} {name}")
    xs = toy.reference_combine(t, want, [inp["expert_scales"] for inp in inputs])
    for r in range(t.world):
        assert_bytes_equal(combine.outputs[r]["x"], xs[r], f"rank {r} x")
        # identity experts: every token's K rows are its own row
        w = inputs[r]["expert_scales"].sum(axis=1, keepdims=True) if scale else t.shape.K
        assert np.allclose(combine.outputs[r]["x"].astype(np.float64),
                           inputs[r]["x"].astype(np.float64) * w, rtol=2e-3, atol=2e-2)


def test_its_phases_are_in_the_report_and_it_runs_alone(tmp_path):
    sc = load_scenario(_scenario(tmp_path))
    assert sc.to_dict()["workload"]["kernel"] == str(TOY)
    rep = build_report(simulate(sc, workers=2))
    assert [op["op"] for op in rep["ops"]] == ["dispatch", "combine"]
    assert rep["ops"][0]["phase_order"] == ["send", "count", "receive"]
    assert rep["ops"][1]["phase_order"] == ["send_back", "reduce"]
    alone = simulate(load_scenario(_scenario(tmp_path, op="combine")))
    assert [op.op for op in alone.ops] == ["combine"]


def test_the_shipped_user_kernel_scenario_runs(tmp_path, capsys):
    assert main(["run", str(SHIPPED), "--out", str(tmp_path), "--workers", "1"]) == 0
    assert "toy_moe.py dispatch_combine" in capsys.readouterr().out


BROKEN = '''
import sys
from npusim.kernels import registry
toy = sys.modules[type(registry.from_file(registry.resolve_file({toy!r}, None))).__module__]


def load_without_wait(ctx, buf, src, offset, nbytes):
    ctx.copy_in(buf, src, offset, nbytes, name="load_row")  # no wait: the bug
    yield from ()


class BrokenDispatch(toy.ToyDispatch):
    load = staticmethod(load_without_wait)


class Broken(toy.ToyMoe):
    name = "broken_toy"
    ops = (BrokenDispatch(), toy.ToyCombine())


FAMILY = Broken()
'''


def test_a_broken_variant_is_caught_by_the_sanitiser(tmp_path, capsys):
    f = tmp_path / "broken.py"
    f.write_text(BROKEN.format(toy=str(TOY)))
    assert main(["run", str(_scenario(tmp_path, f)), "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("npusim: kernel error:") and err.count("\n") == 1
    assert "scalar store into UB buffer 'rec0'" in err and "missing wait" in err
    assert "rank 0" in err and "step 'send'" in err


@pytest.mark.parametrize("text, expect", [
    (None, "kernel file {f} not found"),
    ("x = 1\ny = undefined_name\n",
     "NameError: name 'undefined_name' is not defined ({f}, line 2)"),
    ("def broken(:\n", "SyntaxError"),
    ("x = 1\n", "{f} defines no FAMILY"),
    ("from npusim.kernels.family import Family\nclass F(Family):\n    name = 'f'\nFAMILY = F()\n",
     "incomplete kernel family: no ops, runs, tiling, window, make_inputs"),
])
def test_a_user_family_that_cannot_load_is_one_line_exit_2(tmp_path, capsys, text, expect):
    f = tmp_path / "fam.py"
    if text is not None:
        f.write_text(text)
    assert main(["run", str(_scenario(tmp_path, "fam.py")), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload.kernel" in err
    assert expect.format(f=f.resolve()) in err
    assert not (tmp_path / "o").exists()


def test_lint_does_not_import_a_user_family(tmp_path, capsys):
    f = tmp_path / "fam.py"
    f.write_text("raise RuntimeError('imported')\n")
    sc = _scenario(tmp_path, "fam.py", some_option=3)
    assert main(["lint", str(sc)]) == 0
    assert "not imported" in capsys.readouterr().out
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    assert "RuntimeError: imported" in capsys.readouterr().err
    f.unlink()
    assert main(["lint", str(sc)]) == 2  # the file must still exist


def test_lint_leaves_an_unimported_familys_shape_limits_to_the_run(tmp_path, capsys):
    """lint cannot read the shape limits of a family it does not import: a bs beyond the
    default limits is not refused there, and the run holds it to the family's own."""
    f = tmp_path / "fam.py"
    f.write_text("from npusim.kernels.shmem_classic.family import ShmemClassic\n"
                 "class F(ShmemClassic):\n    name = 'f'\nFAMILY = F()\n")
    sc = _scenario(tmp_path, "fam.py", bs=1000)
    assert main(["lint", str(sc)]) == 0
    assert "shape limits and window fit are checked when it runs" in capsys.readouterr().out
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "workload.bs: 1000 is out of range; allowed: 1..512 (npusim's default limit)" in err
