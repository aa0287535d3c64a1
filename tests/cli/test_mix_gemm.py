"""The MIX example end to end from the CLI (examples/kernels/mix_gemm.py,
scenarios/examples/mix_gemm.yaml): the AIC's mmad reaches the AIVs' UB by FixPipe, their
epilogue writes y; y against numpy, the AIC pipes' busy times by hand from the preset,
the cube's lanes in the trace, and the A3 refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml

from npusim.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "scenarios" / "examples" / "mix_gemm.yaml"
BF16 = ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mix")
    assert main(["run", str(SHIPPED), "--out", str(out / "r"), "--trace", "--tensors",
                 str(out / "t"), "--quiet"]) == 0
    return out


def test_y_is_relu_of_x_at_w(run):
    load = {n: np.load(run / "t" / "gemm" / "rank_0" / d / f"{n}.npy").view(BF16)
            for d, n in (("in", "x"), ("in", "w"), ("out", "y"))}
    want = np.maximum(load["x"].astype(np.float64) @ load["w"].astype(np.float64), 0)
    # bf16 keeps 8 bits of mantissa: within one rounding of the exact result
    assert np.allclose(load["y"].astype(np.float64), want, rtol=2 ** -8, atol=1e-6)
    assert (load["y"].astype(np.float64) > 0).mean() == pytest.approx((want > 0).mean(),
                                                                       abs=0.01)


def test_the_aic_pipes_busy_times_come_from_the_preset(run):
    op = json.loads((run / "r" / "report.json").read_text())["ops"][0]
    cores = op["ranks"][0]["cores"]
    aic, aiv0, aiv1 = cores[0], cores[1], cores[2]
    assert (aic["kind"], aiv0["kind"], aiv1["kind"]) == ("aic 0", "aiv 0", "aiv 1")
    cycle_us = 1 / 1.65e3  # ascend950: 1.65 GHz
    # one 64 x 64 tile, K 512 in 4 steps of 128 (bf16): per step 4 x 4 x 8 fractals of
    # 16x16x16 at 4096 MACs a cycle, + cube_issue_cycles 20
    assert aic["busy_us"]["cube"] == pytest.approx(4 * (128 + 20) * cycle_us, abs=1e-4)
    # MTE1 per step: two loads of 16 KiB at 256 B per cycle, + mte1_issue_cycles 10 each
    assert aic["busy_us"]["mte1"] == pytest.approx(4 * 2 * (64 + 10) * cycle_us, abs=1e-4)
    assert set(aic["busy_us"]) == {"scalar", "mte2", "mte1", "cube", "fixpipe"}
    assert set(aiv0["busy_us"]) == {"scalar", "vector", "mte2", "mte3"}
    # FixPipe's stream at the UB path's 128 B/cycle is not what the report's GM cap says;
    # its port time at the GM cap (32 B/cycle): 2 x 8 KiB of fp32
    assert aic["stream_us"]["fixpipe"] == pytest.approx(16384 / (32 * 1.65) / 1e3, abs=1e-4)
    assert op["pipe_ratios"]["cube"] > 0 and op["phase_order"] == ["mmad", "fixpipe",
                                                                   "epilogue"]


def test_the_trace_has_lanes_for_the_cube_pipes(run):
    events = json.loads((run / "r" / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 0}
    for lane in ("mte2", "mte1", "cube", "fixpipe"):
        assert f"core 0 (aic 0) {lane}" in names
    assert "core 1 (aiv 0) vector" in names
    mmads = [e for e in events if e["name"] == "mmad" and e["pid"] == 0 and e["ph"] == "X"
             and e.get("dur", 0) < 1]
    assert len(mmads) == 16 * 4  # 16 tiles on 16 blocks, 4 K steps each


def test_on_the_a3_it_is_one_line_exit_2(tmp_path, capsys):
    code = main(["run", str(SHIPPED), "--out", str(tmp_path), "--set", "hardware=atlas_a3"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "--set hardware: mix_gemm needs AIC cores with FixPipe into UB" in err


def test_a_preset_without_aic_cores_is_one_line_exit_2(tmp_path, capsys):
    preset = yaml.safe_load((ROOT / "configs" / "ascend950.yaml").read_text())
    del preset["aic"]  # a user's preset from before the AIC cores
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(preset))
    scenario = yaml.safe_load(SHIPPED.read_text())
    scenario["hardware"] = str(tmp_path / "old.yaml")
    scenario["workload"]["kernel"] = str(ROOT / "examples" / "kernels" / "mix_gemm.py")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("hardware: ascend950 has no AIC cores (aic.cores is not in the "
                        "preset); mix_gemm's gemm runs on mix_aic_1_2")
    assert not (tmp_path / "o").exists()
