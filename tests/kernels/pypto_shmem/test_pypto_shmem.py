"""Family pypto_shmem: dispatch outputs byte for byte and combine's output to one bf16
rounding (its weighted sum is a cube Matmul) against the numpy reference of
tilelang_shmem/reference.py (plain numpy, the same dispatch semantics: slots
le * W + src, rows in (token, k) order), at W 2..16, BS 1..64, zipf routing; the
refusals; the AICPU preset section leaves the presets without it untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.hw.config import load_hardware
from npusim.kernels.tilelang_shmem.reference import reference_combine, reference_dispatch
from npusim.scenario import load_scenario
from npusim.sim import simulate


def _scenario(tmp: Path, hardware: str = "atlas_a3", **workload) -> Path:
    w = {"kernel": "pypto_shmem", "op": "dispatch_combine", "bs": 8, "h": 1024, "k": 2,
         "ep_world_size": 2, "experts_per_rank": 2, "dtype": "bfloat16",
         "routing": {"kind": "zipf", "seed": 7}}
    w.update(workload)
    p = tmp / "pp.yaml"
    p.write_text(yaml.safe_dump({"name": "pp", "hardware": hardware, "workload": w}))
    return p


def _within_one_bf16_rounding(got: np.ndarray, want: np.ndarray) -> bool:
    g, w = got.astype(np.float64), want.astype(np.float64)
    ulp = np.ldexp(1.0, np.floor(np.log2(np.maximum(np.abs(w), 1e-30))).astype(int) - 7)
    return bool((np.abs(g - w) <= ulp).all())


@pytest.mark.parametrize("hardware,w,bs,k,le", [
    ("atlas_a3", 2, 1, 1, 2),
    ("ascend950", 4, 9, 3, 2),
    ("atlas_a3", 8, 16, 4, 2),
    ("atlas_a3", 16, 64, 8, 1),
])
def test_outputs_match_the_numpy_reference(tmp_path, hardware, w, bs, k, le):
    sc = load_scenario(_scenario(tmp_path, hardware, bs=bs, k=k, ep_world_size=w,
                                 experts_per_rank=le))
    disp, comb = simulate(sc, workers=1, keep_inputs=True).ops
    x = np.stack([disp.inputs[r]["x"] for r in range(w)])
    ids = np.stack([disp.inputs[r]["expert_ids"] for r in range(w)])
    counts = np.bincount(ids.reshape(-1), minlength=w * le)
    assert counts.max() > counts.min()
    want = reference_dispatch(x, ids, le)
    names = {"expand_x": "expand_x_out", "assist_info_for_combine": "expand_ids",
             "ep_recv_counts": "ep_receive_count"}
    for r in range(w):
        for got_name, ref_name in names.items():
            got, ref = disp.outputs[r][got_name], want[r][ref_name]
            assert got.dtype == ref.dtype and np.array_equal(got.view(np.uint8),
                                                             ref.view(np.uint8)), (r, got_name)
    scales = np.stack([comb.inputs[r]["expert_scales"] for r in range(w)])
    out = reference_combine([d["expand_x_out"] for d in want], [d["expand_ids"] for d in want],
                            [d["ep_receive_count"] for d in want], scales)
    for r in range(w):
        assert _within_one_bf16_rounding(comb.outputs[r]["out"], out[r]), r


@pytest.mark.parametrize("workload,key", [
    ({"dtype": "float16"}, "workload.dtype"),
    ({"bs": 512, "h": 8192, "ep_world_size": 64, "experts_per_rank": 4}, "the window is"),
])
def test_limits_are_one_line_exit_2(tmp_path, capsys, workload, key):
    p = _scenario(tmp_path, **workload)
    assert main(["run", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err, err
    assert not (tmp_path / "o").exists()


def test_a_preset_without_aicpus_is_refused_in_one_line(tmp_path, capsys):
    assert load_hardware("atlas_a2").aicpu is None
    assert "aicpu" not in load_hardware("atlas_a2").to_dict()
    p = _scenario(tmp_path, "atlas_a2")
    assert main(["run", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "aicpu" in err, err


SHIPPED = Path(__file__).resolve().parents[3] / "scenarios" / "pypto_shmem"


def _with_payload(path: Path) -> bool:
    return not yaml.safe_load(path.read_text())["workload"].get("timing_only", False)


@pytest.mark.parametrize("path", sorted(p for p in SHIPPED.glob("*.yaml") if _with_payload(p)),
                         ids=lambda p: p.stem)
def test_the_public_tests_shapes_match_the_numpy_reference(path):
    """hicann/pypto's test_moe_distributed_dispatch_combine.py shapes as shipped: H 5120,
    160 experts, K 8, bf16, on the chip npusim runs the family on."""
    sc = load_scenario(path)
    s = sc.workload.shape
    assert (s.H, s.K, s.W * s.L, s.dtype) == (5120, 8, 160, "bfloat16")
    ops = simulate(sc, workers=1, keep_inputs=True).ops
    W, L = s.W, s.L
    disp = ops[0] if ops[0].op == "dispatch" else None
    x = np.stack([ops[0].inputs[r]["x"] for r in range(W)])
    ids = np.stack([ops[0].inputs[r]["expert_ids"] for r in range(W)])
    want = reference_dispatch(x, ids, L)
    if disp is not None:
        for r in range(W):
            for got, ref in (("expand_x", "expand_x_out"), ("assist_info_for_combine",
                                                            "expand_ids"),
                             ("ep_recv_counts", "ep_receive_count")):
                assert np.array_equal(disp.outputs[r][got].view(np.uint8),
                                      want[r][ref].view(np.uint8)), (r, got)
    comb = [o for o in ops if o.op == "combine"]
    if comb:
        scales = np.stack([comb[0].inputs[r]["expert_scales"] for r in range(W)])
        out = reference_combine([d["expand_x_out"] for d in want],
                                [d["expand_ids"] for d in want],
                                [d["ep_receive_count"] for d in want], scales)
        for r in range(W):
            assert _within_one_bf16_rounding(comb[0].outputs[r]["out"], out[r]), r


def test_stitching_sets_the_submissions_and_each_one_costs_its_sync(tmp_path):
    """W 2, BS 2, K 2, 2 experts a rank (E 4): the dispatch's root functions are the
    Prepare, 4 send_token iterations, 4 send_signal, the CumSum and 4 receive slots, 14;
    a combine's are its rank's received rows M and the 2 tokens. Device tasks: ceil(roots /
    stitch). Stitched one by one, the dispatch passes 13 syncs of at least submit_ns each."""
    submit = load_hardware("atlas_a3").aicpu.submit_ns
    runs = {}
    for stitch in (1, 4, 128):
        sc = load_scenario(_scenario(tmp_path, bs=2, k=2, ep_world_size=2, experts_per_rank=2,
                                     stitch_function_max_num=stitch))
        runs[stitch] = simulate(sc, workers=1, keep_inputs=True).ops
    ids = np.stack([runs[1][0].inputs[r]["expert_ids"] for r in range(2)])
    rows = np.bincount(ids.reshape(-1) // 2, minlength=2)  # rows each rank receives
    for stitch, (disp, comb) in runs.items():
        assert disp.family_fields["submissions"] == -(-14 // stitch), stitch
        assert comb.family_fields["submissions"] == max(-(-(m + 2) // stitch) for m in rows)
    one = runs[1][0]
    assert one.end_ns - one.start_ns >= 13 * submit
