"""comm_alg fullmesh_v2 (MoeDistributeDispatchV2FullMesh) in family mc2: the core roles and
block indices by hand from the source's formulas, the host's limits as one-line errors,
and every path's outputs byte for byte against the numpy reference on both presets."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from test_mc2_cli import _load, _scenario
from test_mc2_kernels import _check_dispatch, _inputs

from npusim.cli import main
from npusim.hw.config import load_hardware
from npusim.kernels.mc2 import reference as ref
from npusim.kernels.mc2 import tiling as tl
from npusim.kernels.mc2.window import full_mesh_slot, low_latency_ccl_buffer_mb
from npusim.workload.shape import MoeShape
from tests.kernels.mc2.mc2help import machine_for, make_tiling, run_combine, run_dispatch

BF16 = ml_dtypes.bfloat16


def _tiling(preset: str, W: int, bs: int, E: int, K: int = 8, quant: str = "int8", **kw):
    shape = ref.mc2_shape(W=W, bs=(bs,) * W, H=1024, K=K, E=E)
    return make_tiling(shape, load_hardware(preset), quant, comm_alg="fullmesh_v2", **kw)


# --------------------------------------------------------------------------- roles by hand
@pytest.mark.parametrize("preset,E,want", [
    ("ascend950", 256, 8),   # 256 / 16 = 16, capped at CUMSUM_MAX_CORE_NUM 8
    ("ascend950", 64, 4),    # 64 / 16
    ("ascend950", 8, 1),     # 8 / 16 = 0 -> at least 1
    ("atlas_a3", 256, 8),    # 256 / 32
    ("atlas_a3", 1024, 16),  # 32, capped at 16
])
def test_count_cores(preset, E, want):
    t = _tiling(preset, 8, 4, E)
    assert tl.count_cores(t, 0) == want
    assert tl.all_to_all_cores(t, 0) == t.cores - want
    assert tl.full_mesh_moe_cores(t, 0) == t.cores - want  # no shared experts


def test_count_cores_on_a_shared_rank_are_at_most_its_w_entries():
    # W 4 with one shared expert on rank 0: rscvStatusNum_ there is W = 4
    shape = ref.mc2_shape(W=4, bs=(4,) * 4, H=1024, K=4, E=3 * 64, S=1, S_r=1)
    t = make_tiling(shape, load_hardware("ascend950"), "int8", comm_alg="fullmesh_v2")
    # (1 + 192) / 16 = 12 -> 8 on a MoE rank, 4 on the shared rank
    assert tl.count_cores(t, 1) == 8 and tl.count_cores(t, 0) == 4
    # sharedUsedAivNum_: (64 - 8) * 1 // (4 + 1) = 11
    assert tl.full_mesh_shared_cores(t, 1) == 11 and tl.full_mesh_moe_cores(t, 1) == 45


@pytest.mark.parametrize("bs,kw,want", [
    (40, {}, True),     # 40 > 16 and 40 % 40 == 0 (moe 48 - 8 = 40)
    (80, {}, True),     # 80 % 40 == 0
    (20, {}, True),     # fewer tokens than cores: 40 % 20 == 0
    (16, {}, False),    # 16 is not > 16
    (32, {}, False),    # neither 32 % 40 nor 40 % 32 is 0
    (128, {}, False),   # 128 % 40 == 8
    (40, {"x_active_mask": "2d"}, False),          # a 2-D mask
    (40, {"smooth_scales": True}, False),          # int8 smooth scales (E', H): per expert
])
def test_bs_mode_condition(bs, kw, want):
    t = _tiling("atlas_a3", 8, bs, 256, **kw)
    assert tl.full_mesh_moe_cores(t, 0) == 40
    assert tl.bs_mode(t, 0, bs) is want


def test_bs_mode_static_scales_and_the_950():
    per_channel = _tiling("atlas_a3", 8, 40, 256, quant="static_int8", smooth_scales=True)
    per_expert = dataclasses.replace(per_channel, static_scales="per_expert")
    assert tl.bs_mode(per_channel, 0, 40)  # scalesCount_ = H
    assert not tl.bs_mode(per_expert, 0, 40)  # scalesCount_ = E * H > H
    assert not tl.bs_mode(_tiling("ascend950", 8, 56, 256), 0, 56)  # the 950 splits by token


def test_bs_token_ranges_by_hand():
    t = _tiling("atlas_a3", 8, 20, 256, K=8)  # 40 MoE cores, 20 tokens: 2 cores per token
    assert tl.bs_token_range(t, 0, 0, 20) == (0, 1, 0, 4, True)
    assert tl.bs_token_range(t, 0, 1, 20) == (0, 1, 4, 8, True)
    assert tl.bs_token_range(t, 0, 39, 20) == (19, 20, 4, 8, True)
    t7 = _tiling("atlas_a3", 8, 20, 256, K=7)  # 7 = 4 + 3: the first share one more
    assert tl.bs_token_range(t7, 0, 0, 20)[2:4] == (0, 4)
    assert tl.bs_token_range(t7, 0, 1, 20)[2:4] == (4, 7)
    t80 = _tiling("atlas_a3", 8, 80, 256)  # 80 / 40 = 2 consecutive tokens per core
    assert tl.bs_token_range(t80, 0, 3, 80) == (6, 8, 0, 8, False)


def test_bs_mode_k_stagger_by_hand():
    # a core's token 3 of K 8 starts at k 3; tokens shared by cores keep k in order
    assert tl.bs_k_order(3, 0, 8, 8, False) == [3, 4, 5, 6, 7, 0, 1, 2]
    assert tl.bs_k_order(0, 0, 8, 8, False) == list(range(8))
    assert tl.bs_k_order(5, 4, 8, 8, True) == [4, 5, 6, 7]


def test_expert_split_by_hand():
    # 10 experts over 4 cores: 2 each, the remainder 8, 9 shared by cores of equal core % 2
    assert tl.split_expert_num_to_core(10, 4, 0) == [(0, 1, 0), (1, 1, 0), (8, 2, 0)]
    assert tl.split_expert_num_to_core(10, 4, 1) == [(2, 1, 0), (3, 1, 0), (9, 2, 0)]
    assert tl.split_expert_num_to_core(10, 4, 2) == [(4, 1, 0), (5, 1, 0), (8, 2, 1)]
    assert tl.split_expert_num_to_core(10, 4, 3) == [(6, 1, 0), (7, 1, 0), (9, 2, 1)]


def test_rotated_blocks_by_hand():
    W, L = 4, 2
    # source 1 to rank 3, expert 7 (local 1): ((1 + 3) % 4) * 2 + 1
    assert tl.rotated_block(1, 3, 7, W, L) == 1
    # source 3 to rank 2, expert 4 (local 0): ((3 + 2) % 4) * 2 + 0
    assert tl.rotated_block(3, 2, 4, W, L) == 2
    # on each receiver the W sources of one local expert land in W different blocks
    for dst in range(W):
        got = {tl.rotated_block(s, dst, dst * L + 1, W, L) for s in range(W)}
        assert got == {b * L + 1 for b in range(W)}


def test_full_mesh_slot_and_buffer_size_by_hand():
    # INT8 at H 7168: 7168 B + 4 B scale -> triplet at 7200, + 32 = 7232 B -> 16 blocks
    s = full_mesh_slot(7168, "int8")
    assert (s.triplet_offset, s.blocks, s.slot, s.ub_row) == (7200, 16, 8192, 7680)
    # unquantised H 1024: 2048 B, triplet at 2048, 2080 B -> 5 blocks of 512
    assert full_mesh_slot(1024, "none").slot == 2560
    # get_low_latency_ccl_buffer_size(comm_alg="fullmesh_v2"): tokenNeedSizeDispatch =
    # ceil((14336 + 44) / 480) * 512 = 15360; BS 128, W 8, L 32, K 8:
    # 2 * (128 * 15360 * 256 + 128 * 14336 * 8) + 1 MiB = 1,037,041,664 B -> 990 MB -> 495
    assert low_latency_ccl_buffer_mb(128, 7168, 8, 32, 8, 0, "fullmesh_v2") == 495
    assert low_latency_ccl_buffer_mb(128, 7168, 8, 32, 8, 0) == 479  # fullmesh_v1


def test_host_ub_check_by_hand():
    # CheckUBSize, A3, BS 256, H 8192, K 12, 256 experts, INT8:
    # 32 + inQueue 2 * 16384 + outBuf 2 * 9216 (18 blocks) + ids Align256(12288) = 12288
    # + tempBuf 8256 + 2 * maxSize 32768 + expert masks 384 * ceil(256 / 40) + 4 * 256
    shape = ref.mc2_shape(W=8, bs=(256,) * 8, H=8192, K=12, E=256)
    t = make_tiling(shape, load_hardware("atlas_a3"), "int8", comm_alg="fullmesh_v2",
                    timing_only=True)
    want = 32 + 32768 + 18432 + 12288 + 8256 + 65536 + 384 * 7 + 1024
    assert tl.host_ub_check_v2(t, 0) == want


# --------------------------------------------------------------------------- limits
@pytest.mark.parametrize("hardware,key,value,where", [
    ("atlas_a3", "bs", 257, "workload.bs: 257: comm_alg fullmesh_v2 on A3 (arch22) allows "
     "bs 1..256"),
    ("atlas_a3", "k", 13, "workload.k: 13: comm_alg fullmesh_v2 allows k 1..12"),
    ("ascend950", "k", 13, "workload.k: 13: comm_alg fullmesh_v2 allows k 1..12"),
    ("atlas_a3", "performance_info", True, "workload.performance_info: true: not modelled"),
])
def test_limits_are_one_line_exit_2(tmp_path, capsys, hardware, key, value, where):
    sc = _scenario(tmp_path, "bad", hardware, comm_alg="fullmesh_v2", experts_per_rank=4,
                   **{key: value})
    assert main(["lint", str(sc)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and where in err and "bad.yaml" in err


def test_a_small_ccl_buffer_names_the_480_512_token_size(tmp_path, capsys):
    # CheckWinSize for fullmesh_v2: tokenNeedSizeDispatch = ceil((14336 + 44) / 480) * 512
    sc = _scenario(tmp_path, "small", "atlas_a3", comm_alg="fullmesh_v2", bs=32, h=7168, k=8,
                   ep_world_size=16, experts_per_rank=16, ccl_buffer_size=20)
    assert main(["lint", str(sc)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "workload.ccl_buffer_size" in err
    assert "tokenNeedSizeDispatch 15360" in err


def test_the_950_allows_bs_512_and_a3_bs_256(tmp_path, capsys):
    ok950 = _scenario(tmp_path, "ok950", "ascend950", comm_alg="fullmesh_v2", bs=300, h=1024)
    ok_a3 = _scenario(tmp_path, "oka3", "atlas_a3", comm_alg="fullmesh_v2", bs=256, h=1024)
    assert main(["lint", str(ok950), str(ok_a3)]) == 0


def test_bs_mode_with_expand_scales_is_refused(tmp_path, capsys):
    # 8 experts: 1 count core, 47 MoE cores; BS 47 takes the BS mode, which writes no scale
    sc = _scenario(tmp_path, "es", "atlas_a3", comm_alg="fullmesh_v2", bs=47, ep_world_size=4,
                   experts_per_rank=2, expand_scales=True)
    assert main(["lint", str(sc)]) == 2
    err = capsys.readouterr().err.strip()
    assert "workload.expand_scales: true" in err and "SendBSExpertLoop" in err


# --------------------------------------------------------------------------- outputs
def _round_trip(preset: str, shape: MoeShape, quant: str, seed: int = 0, mask=None,
                es_out: bool = False):
    cfg = load_hardware(preset)
    t = make_tiling(shape, cfg, quant, comm_alg="fullmesh_v2", x_active_mask=mask or "none",
                    expert_scales_out=es_out)
    ins = _inputs(shape, seed, mask=mask)
    _, outs = run_dispatch(machine_for(cfg, t), t, ins)
    want = ref.reference_dispatch(shape, ins, quant)
    _check_dispatch(outs, want)
    if es_out:
        for o, w in zip(outs, want, strict=True):
            assert np.array_equal(o.expand_scales[:o.n], w.expand_scales[:w.n])
    rows = [ref.dequantized_rows(o, quant, shape.dtype) for o in outs]
    cin = [dict(expert_ids=i.expert_ids, expert_scales=i.expert_scales,
                x_active_mask=i.x_active_mask) for i in ins]
    _, xs = run_combine(machine_for(cfg, t), t, outs, rows, cin)
    cref = [ref.CombineInputs(rows[r], ins[r].expert_ids, ins[r].expert_scales,
                              ins[r].x_active_mask) for r in range(shape.W)]
    wx = ref.reference_combine(shape, outs, cref)
    for r in range(shape.W):
        assert np.array_equal(xs[r].view(np.uint16), wx[r].view(np.uint16))
    return t


@pytest.mark.parametrize("preset,W,bs,E,quant,path", [
    ("atlas_a3", 2, 6, 4, "none", "expert"),
    ("atlas_a3", 4, 6, 8, "int8", "expert"),
    ("atlas_a3", 2, 47, 4, "int8", "bs"),       # 47 MoE cores, 47 tokens: one each
    ("atlas_a3", 2, 20, 256, "none", "bs"),     # 40 MoE cores share 20 tokens' K
    ("ascend950", 2, 6, 4, "none", "token"),
    ("ascend950", 4, 7, 64, "int8", "token"),   # 4 count cores, 60 senders
])
def test_each_path_is_exact(preset, W, bs, E, quant, path):
    shape = ref.mc2_shape(W=W, bs=(bs,) * W, H=1024, K=4, E=E)
    t = _round_trip(preset, shape, quant, seed=W + bs)
    assert tl.bs_mode(t, 0, bs) is (path == "bs")


@pytest.mark.parametrize("preset,mask", [("atlas_a3", "1d"), ("ascend950", "2d"),
                                         ("atlas_a3", "2d")])
def test_masks_are_exact(preset, mask):
    shape = ref.mc2_shape(W=2, bs=(6, 6), H=1024, K=4, E=4)
    _round_trip(preset, shape, "int8", seed=3, mask=mask)


def test_shared_experts_and_expand_scales_on_the_950():
    shape = ref.mc2_shape(W=3, bs=(5,) * 3, H=1024, K=2, E=4, S=1, S_r=1)
    _round_trip("ascend950", shape, "int8", seed=5, es_out=True)


def test_shared_experts_on_a3():
    shape = ref.mc2_shape(W=3, bs=(5,) * 3, H=1024, K=2, E=4, S=1, S_r=1)
    _round_trip("atlas_a3", shape, "none", seed=6)


@pytest.mark.parametrize("hardware,W,L,bs", [("atlas_a3", 4, 2, 47),  # BS mode: 47 cores
                                            ("atlas_a3", 4, 2, 20),  # expert split
                                            ("ascend950", 4, 16, 20)])
def test_cli_tensor_dumps_are_consistent(tmp_path, hardware, W, L, bs):
    sc = _scenario(tmp_path, "v2", hardware, ep_world_size=W, experts_per_rank=L, bs=bs,
                   comm_alg="fullmesh_v2")
    tens = tmp_path / "tensors"
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--tensors", str(tens),
                 "--workers", "1", "--quiet"]) == 0
    ids = np.stack([_load(tens, "dispatch", r, "in", "expert_ids") for r in range(W)])
    total = 0
    for q in range(W):
        nums = _load(tens, "dispatch", q, "out", "expert_token_nums")
        assert nums.tolist() == [int((ids == q * L + j).sum()) for j in range(L)]
        total += int(nums.sum())
        # identity experts: x * sum_k w_k within the INT8 error of each row
        x = _load(tens, "dispatch", q, "in", "x").view(BF16).astype(np.float32)
        w = _load(tens, "dispatch", q, "in", "expert_scales")
        y = _load(tens, "combine", q, "out", "x").view(BF16).astype(np.float32)
        exact = x * w.sum(axis=1, keepdims=True)
        amax = np.abs(x).max(axis=1, keepdims=True)
        bound = (w.sum(axis=1, keepdims=True) * (0.5 * amax / 127 + np.abs(x) / 256)
                 + np.abs(exact) / 128)
        assert (np.abs(y - exact) <= bound).all()
    assert total == ids.size  # every (token, k) pair of every rank arrived once
