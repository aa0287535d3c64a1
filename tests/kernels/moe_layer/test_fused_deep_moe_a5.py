"""moe_layer form fused_deep_moe on the Ascend 950 (FusedDeepMoe's A5 build): each
stage's bytes and the output against the numpy reference, the reference against hand
arithmetic, timing-only runs the same time, the block walk by hand, the refusals."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim import sim
from npusim.kernels.moe_layer.fused_deep_moe_a5 import reference as ref
from npusim.kernels.moe_layer.fused_deep_moe_a5.inputs import mx_weights_of
from npusim.kernels.moe_layer.fused_deep_moe_a5.tiling import block_walk
from npusim.kernels.moe_layer.fused_deep_moe_base.swizzle import block_coord
from npusim.kernels.quant import BF16
from npusim.scenario import Scenario
from tests.kernels.moe_layer.layerhelp import assert_refused, layer_scenario


def a5_scenario(tmp: Path, name: str = "a5", hardware: str = "ascend950", **workload: Any
                ) -> Scenario:
    small = {"form": "fused_deep_moe", "weight_dtype": "fp8_e4m3", "h": 512,
             "intermediate": 1024}
    return layer_scenario(tmp, name, hardware, **{**small, **workload})


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize(("W", "bs", "k", "L", "h", "i2", "wd"), [
    (2, 4, 2, 2, 512, 1024, "fp8_e4m3"),
    # K chunks of 64 at the end (H = 576), two N1 column tiles per half, E5M2
    (3, 5, 3, 2, 576, 2048, "fp8_e5m2"),
    # one expert a rank: 288 rows, two M tiles; more tokens than AICs in the weighted sum
    (4, 96, 3, 1, 512, 1024, "fp8_e4m3"),
])
def test_every_stage_matches_the_reference(tmp_path, W, bs, k, L, h, i2, wd):
    sc = a5_scenario(tmp_path, ep_world_size=W, bs=bs, k=k, experts_per_rank=L, h=h,
                     intermediate=i2, weight_dtype=wd)
    res = sim.simulate(sc)
    assert [o.op for o in res.ops] == ["fused_deep_moe_a5"]
    ins = sim.load_inputs(sc)
    want = ref.reference_layer([a["x"] for a in ins], [a["expert_ids"] for a in ins],
                               [a["expert_scales"] for a in ins],
                               [mx_weights_of(a) for a in ins], L, sc.tiling.mode)
    assert sum(int(s.counts.sum()) for s in want.stages) == W * bs * k
    for r in range(W):
        got, st = res.ops[0].outputs[r], want.stages[r]
        n = st.x1.shape[0]
        assert got["expert_token_nums"].tolist() == st.counts.tolist()
        for name, stage in (("x1", st.x1), ("x1_scale", st.x1_scales),
                            ("swiglu_out", st.swiglu), ("x2", st.x2),
                            ("x2_scale", st.x2_scales)):
            assert _bits(got[name][:n]) == _bits(stage), name
        assert _bits(got["output"]) == _bits(want.y[r])


def test_reference_by_hand():
    """x all ones, every weight 1 (code 1.0, E8M0 127), one expert per token, weight 1/2:
    GMM1 gives H = 512 in every column; SiLU(512) = 512 in fp32; 512 * 512 = 2^18 is MX
    exact (E8M0 137, code 256); GMM2 sums N1/2 = 512 of them: 2^27; y = 2^27 / 2."""
    H, n1, L = 512, 1024, 1
    one = np.ones(1).astype(np.dtype("float8_e4m3fn")).view(np.uint8)[0]
    wt = ref.MxWeights(np.full((L, H, n1), one, np.uint8), np.full((L, H // 32, n1), 127,
                                                                   np.uint8),
                       np.full((L, n1 // 2, H), one, np.uint8),
                       np.full((L, n1 // 64, H), 127, np.uint8))
    x = [np.ones((1, H), BF16) for _ in range(2)]
    ids = [np.array([[1]], np.int32), np.array([[0]], np.int32)]
    w = [np.full((1, 1), 0.5, np.float32)] * 2
    got = ref.reference_layer(x, ids, w, [wt, wt], L, "e4m3")
    assert np.all(got.stages[0].swiglu == np.float32(512))
    assert np.all(got.stages[0].x2_scales == 127 + 10) and np.all(
        got.stages[0].x2.view(np.dtype("float8_e4m3fn")).astype(np.float32) == 256)
    for y in got.y:
        assert np.all(y.astype(np.float64) == 2.0 ** 26)


def test_silu_half_by_hand():
    """The left half: bf16 first, then c / (exp(-c) + 1); the right half only bf16."""
    c = np.array([[1.0, -1.0, 1 + 2 ** -9, 3.0]], np.float32)
    s = ref.silu_half(c)
    assert s[0, 0] == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-6)
    assert s[0, 1] == pytest.approx(-1 / (1 + math.exp(1)), rel=1e-6)
    assert s[0, 2] == 1.0  # 1 + 2^-9 is under half a bf16 ulp of 1
    assert s[0, 3] == 3.0


def test_timing_only_runs_the_same_time(tmp_path):
    full = sim.simulate(a5_scenario(tmp_path, ep_world_size=3, k=3, bs=5))
    fast = sim.simulate(a5_scenario(tmp_path, name="fast", ep_world_size=3, k=3, bs=5,
                                    timing_only=True))
    a, b = full.ops[0], fast.ops[0]
    assert a.end_ns - a.start_ns == b.end_ns - b.start_ns


def test_block_walk_by_hand():
    # GemmIdentityBlockSwizzle<3, 0>, 4 x 2 tiles: band 0 (rows 0-2) down each column,
    # band 1 (row 3) with its columns reversed
    order = [block_coord(i, 4, 2) for i in range(8)]
    assert order == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 1), (3, 0)]
    # 3 cores, N = 512 (2 column tiles); group 0 of 300 rows (2 x 2 tasks), group 1 of
    # 10 rows (1 x 2) starts at core 4 mod 3 = 1
    walks = [block_walk(512, 3, c) for c in range(3)]
    first = [[(b.row, b.rows, b.col) for b in wk.next(300)] for wk in walks]
    assert first == [[(0, 256, 0), (256, 44, 256)], [(256, 44, 0)], [(0, 256, 256)]]
    second = [[(b.row, b.rows, b.col) for b in wk.next(10)] for wk in walks]
    assert second == [[], [(300, 10, 0)], [(300, 10, 256)]]


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"bs": 257}, "workload.bs", "fused_deep_moe_tiling.cpp:448"),
    ({"h": 7232}, "workload.h", "[512, 7168]"),
    ({"intermediate": 1536}, "workload.intermediate", "divisible by 1024"),
    ({"intermediate": 7168}, "workload.intermediate", "[1024, 6144]"),
    ({"k": 13, "experts_per_rank": 8}, "workload.k", "<= 12"),
    ({"experts_per_rank": 300}, "workload.experts_per_rank", "<= 512"),
    ({"weight_dtype": "int8"}, "workload.weight_dtype", "allowed: fp8_e4m3, fp8_e5m2"),
    ({"weight_dtype": "fp4_e2m1"}, "workload.weight_dtype", "not modelled"),
    ({"h": 7168, "bs": 64, "hccl_buffsize": 1}, "workload.hccl_buffsize", "HCCL_BUFFSIZE"),
    # the A3 has its own build, of int8 weights
    ({"hardware": "atlas_a3"}, "workload.weight_dtype", "allowed: int8"),
])
def test_refusals_name_the_key_and_the_limit(tmp_path, change, key, words):
    assert_refused(lambda: a5_scenario(tmp_path, **change), key, words)
