"""mega_moe end to end on small shapes: outputs against the numpy reference and the
harness's closed form, the 950-only refusal, the report's cube activity and overlap
figures, the trace's cube lanes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import yaml

from npusim.kernels.common.overlap import intersect, union
from npusim.kernels.mega_moe import reference as ref
from tests.kernels.mega_moe.megahelp import mega_scenario, reference_of, run_mega


@pytest.mark.parametrize(("mode", "W", "k", "L"), [("e4m3", 2, 2, 2), ("e5m2", 4, 3, 2)])
def test_random_inputs_match_the_reference(tmp_path, mode, W, k, L):
    sc, res = run_mega(tmp_path, mode=mode, ep_world_size=W, k=k, experts_per_rank=L, bs=12)
    want = reference_of(sc)
    for r in range(W):
        out = res.ops[0].outputs[r]
        assert out["expert_token_counts"].tolist() == want.expert_token_counts[r].tolist()
        assert ref.within_tolerance(out["y"], want.y[r], mode).all()
        y, w = out["y"].astype(np.float64), want.y[r].astype(np.float64)
        # far inside the harness's tolerance: the same quantisation steps, another sum order
        assert np.linalg.norm(y - w) / np.linalg.norm(w) < 0.01
    # every routed (token, k) pair was received by exactly one expert somewhere
    assert sum(int(c.sum()) for c in want.expert_token_counts) == W * 12 * k


@pytest.mark.parametrize("mode", ["e4m3", "e5m2"])
def test_harness_inputs_give_the_closed_form(tmp_path, mode):
    H, F = 1024, 512
    sc, res = run_mega(tmp_path, mode=mode, inputs="harness", h=H, ffn_dim=F, bs=8, k=3)
    y_hand = 1024.0 * 1024.0 * 256.0  # silu(1024) = 1024 (e^-1024 underflows) x H x F/2
    assert ref.closed_form(H, F) == y_hand
    for out in res.ops[0].outputs:
        y = out["y"].astype(np.float64)
        assert np.all(np.abs(y - y_hand) <= 0.05 * y_hand)


def test_capacity_and_options_are_checked(tmp_path):
    from npusim.errors import InputError
    with pytest.raises(InputError, match="max_received_tokens.*below BS \\* W \\* min"):
        mega_scenario(tmp_path, max_received_tokens=10)  # 8 * 2 * min(2, 2) = 32
    with pytest.raises(InputError, match="ffn_dim.*multiples of 64"):
        mega_scenario(tmp_path, ffn_dim=96)
    with pytest.raises(InputError, match="experts_per_rank.*exceed the 32 AIC"):
        mega_scenario(tmp_path, experts_per_rank=33, ep_world_size=2, k=2)


def test_other_presets_are_refused_in_one_line(tmp_path):
    path = tmp_path / "a3.yaml"
    doc = {"name": "a3", "hardware": "atlas_a3",
           "workload": {"kernel": "mega_moe", "op": "mega_moe", "bs": 8, "h": 1024, "k": 2,
                        "ep_world_size": 2, "experts_per_rank": 2, "inputs": "harness"}}
    path.write_text(yaml.safe_dump(doc))
    p = subprocess.run([sys.executable, "-m", "npusim", "run", str(path), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "hardware" in lines[0] and "ascend950" in lines[0]
    assert not (tmp_path / "out").exists()


def test_report_shows_cube_work_overlap_and_tensors(tmp_path):
    mega_scenario(tmp_path, inputs="harness", routing={"kind": "balanced", "seed": 0})
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "npusim", "run", str(tmp_path / "mm.yaml"), "--out",
                        str(out),
                        "--trace", "--tensors", str(out / "t"), "--quiet"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rep = json.loads((out / "report.json").read_text())
    op = rep["ops"][0]
    ff = op["family_fields"]
    assert ff["busy_us_total"]["aic_cube"] > 0 and ff["busy_us_total"]["aic_fixpipe"] > 0
    assert ff["critical_stage"] in ff["stage_us"] and ff["critical_stage"] != "synchronize_ranks"
    assert set(ff["stage_us"]) == {p["name"] for p in _phases()}
    for r in ff["communication_per_rank"]:
        assert 0 <= r["hidden_us"] <= r["communication_us"]
        assert r["exposed_us"] == pytest.approx(r["communication_us"] - r["hidden_us"], abs=1e-3)
    assert 0 <= ff["communication_hidden_fraction"] <= 1
    assert ff["expert_token_counts"] == [[8, 8], [8, 8]]  # balanced: 32 routes over 4 experts
    md = (out / "report.md").read_text()
    assert "communication_hidden_fraction" in md
    # the text summary: the one-number family fields on one line, the rest in report.md
    family = [line for line in p.stdout.splitlines() if line.startswith("  family: ")]
    assert family == [f"  family: communication_hidden_fraction "
                      f"{ff['communication_hidden_fraction']:.6g}, critical_stage "
                      f"{ff['critical_stage']}"]
    trace = json.loads((out / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    for pipe in ("cube", "mte1", "fixpipe"):  # the AIC's pipes as lanes of their own
        assert any(name.endswith(pipe) for name in lanes), pipe
    y = np.load(out / "t" / "mega_moe" / "rank_1" / "out" / "y.npy").view(ml_dtypes.bfloat16)
    assert np.all(np.abs(y.astype(np.float64) / ref.closed_form(1024, 512) - 1) <= 0.05)


def _phases():
    from npusim.kernels.mega_moe.family import PHASES
    return [{"name": p.name} for p in PHASES]


def test_interval_arithmetic_by_hand():
    assert union([(3, 5), (0, 2), (1, 4), (7, 8)]) == [(0, 5), (7, 8)]
    assert intersect([(0, 5), (7, 8)], [(4, 7.5)]) == pytest.approx(1.5)


def test_unfused_path_runs_the_same_layer_in_three_kernels(tmp_path):
    """cann_sample dispatch, the expert GEMMs, cann_sample combine: the dispatch's per
    expert rows are the fused kernel's counts, the GEMM kernel does cube work."""
    sc, res = run_mega(tmp_path, kernel="mega_moe_unfused", op="unfused", bs=12, k=2)
    assert [o.op for o in res.ops] == ["dispatch", "expert_gemms", "combine"]
    want = reference_of(mega_scenario(tmp_path, name="fused", bs=12, k=2))
    for r in range(2):
        nums = res.ops[0].outputs[r]["expert_token_nums"]
        assert nums.tolist() == want.expert_token_counts[r].tolist()
    gemm = res.ops[1]
    cube = sum(b.get("cube", 0.0) for row in gemm.core_busy_ns for b in row)
    assert cube > 0
    # the GEMM kernel starts after dispatch ended everywhere, combine after the GEMMs
    assert gemm.start_ns >= res.ops[0].end_ns and res.ops[2].start_ns >= gemm.end_ns


def test_the_harness_example_shape_gives_its_closed_form(tmp_path):
    """The issue's check: scenarios/mega_moe/w2_e4m3_harness.yaml (TOKEN_COUNT 256,
    MODEL_DIM 4096, FFN_DIM 1024, top 6, 4 local experts, W 2) runs, y is
    silu(4096) * 4096 * 512 = 2^33 within 5% everywhere, and the cubes worked. About 15 s
    of CPU (one BLAS thread: numpy's threads only contend on a shared machine)."""
    from npusim.shipped import scenarios
    out = tmp_path / "out"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "npusim", "run",
                        str(scenarios()["mega_moe/w2_e4m3_harness"]), "--out", str(out),
                        "--tensors", str(out / "t"), "--quiet"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        y = np.load(out / "t" / "mega_moe" / f"rank_{r}" / "out" / "y.npy")
        y = y.view(ml_dtypes.bfloat16).astype(np.float64)
        assert np.all(np.abs(y / 2.0 ** 33 - 1) <= 0.05)
        counts = np.load(out / "t" / "mega_moe" / f"rank_{r}" / "out" / "expert_token_counts.npy")
        assert counts.tolist() == [384] * 4  # 2 * 256 * 6 routes round robin over 8 experts
    op = json.loads((out / "report.json").read_text())["ops"][0]
    assert op["family_fields"]["busy_us_total"]["aic_cube"] > 0
    assert op["pipe_ratios"]["cube"] > 0
