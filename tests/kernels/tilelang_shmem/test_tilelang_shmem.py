"""Family tilelang_shmem: every output against the numpy reference (reference.py, which
knows nothing of the runtime) fed with the inputs the simulator read, at W 2..16 and BS
1..64 under uneven (zipf) routing; the one-line refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.kernels.tilelang_shmem.reference import reference_combine, reference_dispatch
from npusim.kernels.tilelang_shmem.tiling import default_ub_size
from npusim.scenario import load_scenario
from npusim.sim import simulate


def _scenario(tmp: Path, hardware: str = "atlas_a3", overrides: dict | None = None,
              **workload) -> Path:
    w = {"kernel": "tilelang_shmem", "op": "dispatch_combine", "bs": 8, "h": 1024, "k": 2,
         "ep_world_size": 2, "experts_per_rank": 2, "dtype": "bfloat16",
         "routing": {"kind": "zipf", "seed": 5}}
    w.update(workload)
    doc = {"name": "tl", "hardware": hardware, "workload": w}
    if overrides:
        doc["hardware_overrides"] = overrides
    p = tmp / "tl.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("hardware,w,bs,k,le,cores", [
    ("atlas_a3", 2, 1, 1, 1, 0),
    ("atlas_a3", 4, 7, 3, 2, 4),
    ("ascend950", 8, 16, 4, 2, 6),
    ("atlas_a3", 16, 64, 8, 1, 8),
])
def test_outputs_equal_the_numpy_reference(tmp_path, hardware, w, bs, k, le, cores):
    sc = load_scenario(_scenario(tmp_path, hardware, bs=bs, k=k, ep_world_size=w,
                                 experts_per_rank=le, ai_core_num=cores))
    result = simulate(sc, workers=1, keep_inputs=True)
    disp, comb = (r for r in result.ops)
    x = np.stack([disp.inputs[r]["x"] for r in range(w)])
    ids = np.stack([disp.inputs[r]["expert_ids"] for r in range(w)])
    counts = np.bincount(ids.reshape(-1), minlength=w * le)
    assert counts.max() > counts.min()  # the routing is uneven
    want = reference_dispatch(x, ids, le)
    for r in range(w):
        for name, arr in want[r].items():
            assert _same(disp.outputs[r][name], arr), (r, name)
    scales = np.stack([comb.inputs[r]["expert_scales"] for r in range(w)])
    out = reference_combine([d["expand_x_out"] for d in want], [d["expand_ids"] for d in want],
                            [d["ep_receive_count"] for d in want], scales)
    for r in range(w):
        assert _same(comb.outputs[r]["combine_out"], out[r]), r


def test_the_row_is_the_workers_ub_size():
    # Align512(Align32(2 * 7168) + 32 + 12) / 2 = Align512(14380) / 2 = 14848 / 2
    assert default_ub_size(7168) == 7424
    assert default_ub_size(1024) == 1280  # Align512(2048 + 44) = 2560


@pytest.mark.parametrize("workload,overrides,key", [
    ({"ub_size": 1000}, None, "workload.ub_size"),  # below x_ub's H + 22
    ({"ub_size": 200000}, None, "workload.ub_size"),  # the put would leave the UB
    ({"h": 8192}, {"ub": {"bytes": 98304}}, "workload.h"),  # x_ub and the rows overflow
    ({"bs": 512, "h": 8192, "ep_world_size": 64, "experts_per_rank": 4}, None, "the window is"),
    ({"dtype": "float16"}, None, "workload.dtype"),
    ({"ai_core_num": 25}, None, "workload.ai_core_num"),
])
def test_limits_are_one_line_exit_2(tmp_path, capsys, workload, overrides, key):
    p = _scenario(tmp_path, overrides=overrides, **workload)
    assert main(["run", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err, err
    assert not (tmp_path / "o").exists()


def test_the_framework_sweep_validates_every_point():
    from npusim.sweep import load_sweep

    root = Path(__file__).resolve().parents[3]
    name, points = load_sweep(root / "scenarios/sweeps/frameworks_w16.yaml")
    assert name == "frameworks_w16" and len(points) == 2 * 4 * 5  # chips x families x BS


def test_the_core_split_and_windows_follow_the_seeds_shapes():
    from npusim.kernels.common.split import split_share
    from npusim.kernels.tilelang_shmem.tiling import TileLangTiling
    from npusim.workload.shape import MoeShape

    # send_token_num = 10 // 4 = 2, remainder 2: vids 0 and 1 take one more
    assert [split_share(10, 4, v) for v in range(4)] == [(0, 3), (3, 3), (6, 2), (8, 2)]
    t = TileLangTiling(MoeShape(4, 8, 1024, 2, 3, dtype="bfloat16"), 5, 1280)
    assert t.aiv_num == 10 and t.status_per_core == 2  # ceil(4 * 3 / 10)
    z = t.window.regions()
    size = {k: b - a for k, (a, b) in z.items()}
    # win_data [W L Bs, ub_size] bf16, win_status [W L, 8] float, [Bs K, H] bf16, [Bs K, 8]
    assert size["combine_status"] == 8 * 2 * 8 * 4
    assert size["win_data"] >= 12 * 8 * 1280 * 2 and size["win_data"] - 12 * 8 * 1280 * 2 < 512
    assert size["win_status"] >= 12 * 8 * 4 and size["combine_data"] >= 8 * 2 * 1024 * 2
    assert t.triple_at == 2 * 1024 + 32  # int32 element (H + 16) / 2
