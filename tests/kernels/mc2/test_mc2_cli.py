"""Family mc2 from the command line: runs on both presets, --tensors dumps that agree with
the routing and with an identity-expert round trip, one-line exit-2 errors."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml

from npusim.cli import main


def _scenario(tmp: Path, name: str, hardware: str, **workload) -> Path:
    w = {"kernel": "mc2", "op": "dispatch_combine", "bs": 4, "h": 1024, "k": 4,
         "ep_world_size": 8, "experts_per_rank": 2, "dtype": "bfloat16",
         "dispatch_quant": "int8", "routing": {"kind": "uniform", "seed": 3}}
    w.update(workload)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "hardware": hardware, "workload": w}))
    return p


def _load(d: Path, op: str, r: int, side: str, name: str) -> np.ndarray:
    return np.load(d / op / f"rank_{r}" / side / f"{name}.npy")


@pytest.mark.parametrize("hardware,W", [("atlas_a3", 16), ("ascend950", 8)])
def test_dispatch_combine_dumps_agree_with_the_routing(tmp_path, hardware, W):
    sc = _scenario(tmp_path, "t", hardware, ep_world_size=W)
    tens = tmp_path / "tensors"
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--tensors", str(tens),
                 "--workers", "1"]) == 0
    L, K = 2, 4
    ids = np.stack([_load(tens, "dispatch", r, "in", "expert_ids") for r in range(W)])
    for q in range(W):
        # expert_token_nums: how many (token, k) of all ranks name each of my experts
        want = [int((ids == q * L + j).sum()) for j in range(L)]
        assert _load(tens, "dispatch", q, "out", "expert_token_nums").tolist() == want
        # identity experts: x * sum_k w_k, within the INT8 error of each row
        x = _load(tens, "dispatch", q, "in", "x").view(ml_dtypes.bfloat16).astype(np.float32)
        w = _load(tens, "dispatch", q, "in", "expert_scales")
        y = _load(tens, "combine", q, "out", "x").view(ml_dtypes.bfloat16).astype(np.float32)
        exact = x * w.sum(axis=1, keepdims=True)
        amax = np.abs(x).max(axis=1, keepdims=True)
        bound = (w.sum(axis=1, keepdims=True) * (0.5 * amax / 127 + np.abs(x) / 256)
                 + np.abs(exact) / 128)
        assert (np.abs(y - exact) <= bound).all()
    assert K == ids.shape[2]


def test_the_default_ccl_buffer_is_never_refused(tmp_path, capsys):
    # fullmesh_v2 on the 950 at BS 32, W 8, L 4, INT8 dispatch, bf16, ccl_buffer_size left
    # at 0: get_low_latency_ccl_buffer_size's 19 MB misses the check's W * 1 KiB by 8 KiB
    sc = _scenario(tmp_path, "default_fits", "ascend950", bs=32, h=7168, k=8,
                   ep_world_size=8, experts_per_rank=4, dtype="bfloat16",
                   comm_alg="fullmesh_v2", dispatch_quant="int8")
    assert main(["lint", str(sc)]) == 0, capsys.readouterr().err


def test_the_default_ccl_buffer_grows_to_what_the_slots_need(tmp_path, capsys):
    # the 950, BS 128, W 8, L 32, K 8, bf16, no quantisation: dispatch slots
    # Align512(2 * 7168 + 44) = 14848 B, combine slots ceil(14336 / 480) * 512 = 15360 B;
    # 128 * (14848 * 8 * 32 + 15360 * 8) = 502267904 B per data half, so the buffer needs
    # ceil((2 * 502267904 + 1 MiB + 8 KiB) / 2 MiB) = 480 MB, one more than the helper's 479
    # that the operator's check accepts
    common = dict(bs=128, h=7168, k=8, ep_world_size=8, experts_per_rank=32,
                  dispatch_quant="none")
    sc = _scenario(tmp_path, "grows", "ascend950", **common)
    assert main(["lint", str(sc)]) == 0, capsys.readouterr().err
    sc = _scenario(tmp_path, "helpers", "ascend950", ccl_buffer_size=479, **common)
    assert main(["lint", str(sc)]) == 2
    err = capsys.readouterr().err
    assert "would overrun it; ccl_buffer_size >= 480 MB" in err


def test_a_small_ccl_buffer_is_one_line_naming_the_need(tmp_path, capsys):
    sc = _scenario(tmp_path, "small", "atlas_a3", bs=32, h=7168, k=8, ep_world_size=16,
                   experts_per_rank=16, ccl_buffer_size=20)
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "workload.ccl_buffer_size" in err and "too SMALL" in err
    assert "= 240 MB of CCL buffer" in err and ">= 120 MB" in err
    assert not out.exists()


@pytest.mark.parametrize("key,value,where", [
    ("comm_alg", "hierarchy", "workload.comm_alg"),
    ("bs_per_rank", [4, 4, 4], "workload.bs_per_rank: 3 entries"),
    ("bs_per_rank", [4, "x"], "workload.bs_per_rank[1]"),
    ("mxfp8_saturate", True, "cann_sample"),
])
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, key, value, where):
    sc = _scenario(tmp_path, "bad", "atlas_a3", **{key: value})
    assert main(["lint", str(sc)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and where in err


def test_zero_and_copy_experts_and_uneven_bs_run(tmp_path):
    sc = _scenario(tmp_path, "special", "atlas_a3", ep_world_size=4, zero_experts=1,
                   copy_experts=1, bs_per_rank=[4, 1, 3, 2], x_active_mask="2d")
    tens = tmp_path / "tensors"
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--tensors", str(tens),
                 "--workers", "1"]) == 0
    assert [_load(tens, "combine", r, "out", "x").shape[0] for r in range(4)] == [4, 1, 3, 2]


def test_performance_info_is_a_report_field(tmp_path):
    """workload.performance_info: both ops carry family_fields.performance_info_us, per rank
    the W waits the --tensors dump holds (combine: the max of its per-core rows, the
    operator's AtomicMax); report.md has the table; without the option there is none."""
    import json

    W = 4
    sc = _scenario(tmp_path, "perf", "atlas_a3", ep_world_size=W, performance_info=True)
    tens = tmp_path / "tensors"
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--tensors", str(tens),
                 "--workers", "1"]) == 0
    rep = json.loads((out / "report.json").read_text())
    d, c = (op["family_fields"]["performance_info_us"] for op in rep["ops"])
    for r in range(W):
        assert d[r] == _load(tens, "dispatch", r, "out", "performance_info").tolist()
        rows = _load(tens, "combine", r, "out", "performance_info_cores").reshape(-1, W)
        assert c[r] == rows.max(axis=0).tolist()
        assert len(d[r]) == len(c[r]) == W
    assert "performance_info_us:" in (out / "report.md").read_text()
    sc = _scenario(tmp_path, "plain", "atlas_a3", ep_world_size=W)
    assert main(["run", str(sc), "--out", str(tmp_path / "o2"), "--workers", "1"]) == 0
    rep = json.loads((tmp_path / "o2" / "report.json").read_text())
    assert all(op["family_fields"] == {} for op in rep["ops"])
