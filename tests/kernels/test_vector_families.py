"""cann_gelu and rms_norm_quant as registry families: scenario -> run -> report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.kernels.cann_gelu.reference import gelu_reference
from npusim.kernels.rms_norm_quant import reference as ref
from npusim.report.build import build_report
from npusim.scenario import scenario_from_doc
from npusim.sim import simulate


def run(tmp: Path, **workload: Any) -> tuple[Any, dict[str, Any]]:
    """The vector families' scenarios need no MoE keys (bs, h, k, ...)."""
    doc = {"name": "t", "hardware": "ascend950", "workload": workload}
    result = simulate(scenario_from_doc(doc, "test", tmp))
    return result, build_report(result)


@pytest.mark.parametrize("vf", [False, True])
def test_gelu_runs_as_a_family(tmp_path: Path, vf: bool) -> None:
    result, report = run(tmp_path, kernel="cann_gelu", op="gelu", vf=vf, elements=20000,
                         routing={"kind": "uniform", "seed": 4})
    x = np.random.default_rng(4).uniform(-10, 10, 20000).astype(np.float32)
    np.testing.assert_allclose(result.ops[0].outputs[0]["y"], gelu_reference(x), atol=1e-3)
    op = report["ops"][0]
    assert op["phase_order"] == ["gelu"]
    core = op["ranks"][0]["cores"][0]
    assert set(core["busy_us"]) == {"scalar", "vector", "mte2", "mte3"}
    # 20000 fp32 = 312.5 registers in 3 tiles (2 x 128 + 57): 8 compute instructions each
    assert core["instructions"]["RVECEX"] == 8 * (2 * 128 + 57)
    assert op["instructions"]["RVECEX"] == core["instructions"]["RVECEX"]
    assert 0 < op["pipe_ratios"]["vector"] < 1


def test_rms_norm_quant_runs_as_a_family(tmp_path: Path) -> None:
    result, report = run(tmp_path, kernel="rms_norm_quant", op="rms_norm_quant", step=5,
                         rows=96, cols=1024, routing={"kind": "uniform", "seed": 2})
    rng = np.random.default_rng(2)  # the family's inputs: gen_data.py's distributions
    x = rng.uniform(-100, 100, (96, 1024)).astype(np.float16)
    g = rng.uniform(-100, 100, 1024).astype(np.float16)
    s = rng.uniform(-10, 10, 1).astype(np.float16)
    o = rng.uniform(-10, 10, 1).astype(np.int8)
    y = result.ops[0].outputs[0]["y"]
    assert np.abs(y.astype(int) - ref.golden(x, g, s, o).astype(int)).max() <= 1
    op = report["ops"][0]
    assert op["phase_order"] == ["init", "gamma", "rows"]
    cores = op["ranks"][0]["cores"]
    assert len(cores) == 48  # 96 rows, 2 per core, on 48 of the 64 cores
    total = sum(c["instructions"]["RVECLD"] for c in cores)
    assert op["instructions"]["RVECLD"] == total
    # per core: gamma's Cast (1024 / 64 lanes = 16 registers), then per row ComputeRmsVf's
    # 16 loads and ComputeNormQuantVf's 1 + 2 x 16
    assert cores[0]["instructions"]["RVECLD"] == 16 + 2 * (16 + 1 + 32)


def test_family_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="workload.step"):
        run(tmp_path, kernel="rms_norm_quant", op="rms_norm_quant", step=7)
    with pytest.raises(InputError, match="workload.tile_bytes"):
        run(tmp_path, kernel="cann_gelu", op="gelu", tile_bytes=100)


def _doc(kernel: str, op: str, **workload: Any) -> dict[str, Any]:
    return {"name": "t", "hardware": "ascend950",
            "workload": {"kernel": kernel, "op": op, **workload}}


@pytest.mark.parametrize("kernel, op", [("cann_gelu", "gelu"),
                                        ("rms_norm_quant", "rms_norm_quant")])
def test_a_vector_family_has_no_moe_shape_and_refuses_its_keys(
        tmp_path: Path, kernel: str, op: str) -> None:
    """Its own options size its run: the workload carries no MoE shape, and a MoE key is
    refused (it would size nothing). A MoE family still requires them."""
    assert scenario_from_doc(_doc(kernel, op), "test", tmp_path).workload.shape is None
    for key in ("bs", "experts_per_rank", "shared_experts"):
        with pytest.raises(InputError, match="reads no MoE shape") as info:
            scenario_from_doc(_doc(kernel, op, **{key: 1}), "test", tmp_path)
        assert info.value.key == f"workload.{key}"
    with pytest.raises(InputError, match="workload.bs"):
        scenario_from_doc({"name": "t", "hardware": "ascend950",
                           "workload": {"op": "dispatch"}}, "test", tmp_path)


def test_a_vector_familys_hooks_receive_no_shape(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """tiling, misfit and make_inputs of a family without the MoE shape get shape None."""
    from npusim.kernels.cann_gelu.family import CannGelu

    seen: list[tuple[str, Any]] = []
    for hook in ("tiling", "misfit", "make_inputs"):
        real = getattr(CannGelu, hook)

        def spy(self: Any, shape: Any, *args: Any, _real: Any = real, _hook: str = hook,
                **kwargs: Any) -> Any:
            seen.append((_hook, shape))
            return _real(self, shape, *args, **kwargs)

        monkeypatch.setattr(CannGelu, hook, spy)
    simulate(scenario_from_doc(_doc("cann_gelu", "gelu", elements=64), "test", tmp_path))
    assert sorted(h for h, _ in seen) == ["make_inputs", "misfit", "tiling"]
    assert all(shape is None for _, shape in seen)


def test_lint_shows_a_vector_familys_op_and_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No MoE shape to show: lint names the op and the options it runs with (the
    declared defaults filled in)."""
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_doc("rms_norm_quant", "rms_norm_quant", step=2, rows=64)))
    assert main(["lint", str(p)]) == 0
    assert capsys.readouterr().out == (
        f"ok  {p}  (rms_norm_quant rms_norm_quant, step 2, rows 64, cols 8192, "
        "on ascend950)\n")


@pytest.mark.parametrize("hardware,workload", [
    ("atlas_a3", {"kernel": "cann_gelu", "op": "gelu", "vf": True}),
    ("atlas_a2", {"kernel": "rms_norm_quant", "op": "rms_norm_quant", "step": 3}),
    ("atlas_a3", {"kernel": "rms_norm_quant", "op": "rms_norm_quant", "step": 6}),
])
def test_a_vf_program_on_a_membase_preset_is_refused_by_lint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], hardware: str,
        workload: dict[str, Any]) -> None:
    # was a "kernel error" (exit 3) at run time after lint passed
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "hardware": hardware, "workload": workload}))
    assert main(["lint", str(p)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{p}: hardware: {hardware}'s vector unit is " \
        "membase" in err and "need regbase" in err, err
    # the MemBase variants (vf: false, steps 0-2) run there
    fine = {**workload, "vf": False} if "vf" in workload else {**workload, "step": 2}
    p.write_text(yaml.safe_dump({"name": "s", "hardware": hardware, "workload": fine}))
    assert main(["lint", str(p)]) == 0


@pytest.mark.parametrize("step,per_element,buffers", [
    # bytes of UB per element of a row (the sample's InitBuffer calls): x fp16 and y int8
    # per queue slot, gamma fp16 + float32, and steps 0-2's float32 x and rms rows
    (0, 2 + 1 + 2 + 4 + 4 + 4, 32),  # + the 32 B reduce block
    (3, 2 + 1 + 2 + 4, 32),  # + the 32 B rms block
    (4, 2 * (2 + 1) + 2 + 4, 32),
])
def test_rms_norm_quant_cols_are_bounded_by_the_ub_its_step_takes(
        tmp_path: Path, step: int, per_element: int, buffers: int) -> None:
    ub = 262144  # the 950's UB
    top = (ub - buffers) // per_element // 32 * 32  # rAlign is whole 32-element blocks
    wl = {"kernel": "rms_norm_quant", "op": "rms_norm_quant", "step": step, "rows": 1}
    doc = {"name": "t", "hardware": "ascend950", "workload": {**wl, "cols": top + 32}}
    with pytest.raises(InputError) as e:  # steps 3-4 overflowed UB in the kernel (exit 3)
        scenario_from_doc(doc, "test", tmp_path)
    assert e.value.key == "workload.cols" and f"allowed: cols <= {top}" in e.value.message
    # the kernel runs at the largest size the check lets through: the two agree
    result, _ = run(tmp_path, **wl, cols=top, routing={"kind": "uniform", "seed": 1})
    assert result.ops[0].outputs[0]["y"].shape == (1, top)
