"""moe_layer form dispatch_ffn_combine: the kernel's outputs byte for byte against the
numpy reference of its own arithmetic (dispatch_ffn_combine/reference.py), the reference
against hand arithmetic, timing-only runs the same time, and the refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npusim import sim
from npusim.errors import InputError
from npusim.kernels.moe_layer.dispatch_ffn_combine import family as dfc_family
from npusim.kernels.moe_layer.dispatch_ffn_combine import reference as ref
from npusim.kernels.moe_layer.dispatch_ffn_combine import tiling
from npusim.kernels.moe_layer.dispatch_ffn_combine.family import weights_of
from tests.kernels.moe_layer.layerhelp import layer_scenario

FORM = {"form": "dispatch_ffn_combine"}


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def dfc_reference(sc) -> ref.Layer:
    ins = sim.load_inputs(sc)
    return ref.reference_layer([a["x"] for a in ins], [a["expert_ids"] for a in ins],
                               [a["probs"] for a in ins], [weights_of(a) for a in ins],
                               sc.workload.shape.L)


def test_reference_outputs_are_the_layers(tmp_path):
    """The form's reference_outputs (for the family's references hook) per rank."""
    sc = layer_scenario(tmp_path, ep_world_size=2, k=2, bs=3, **FORM)
    want = dfc_reference(sc)
    got = dfc_family.reference_outputs(sc.tiling, sim.load_inputs(sc))
    assert [_bits(g["out"]) for g in got] == [_bits(y) for y in want.y]
    assert [g["expert_token_nums"].tolist() for g in got] == [
        s.expert_token_nums.tolist() for s in want.stages]


@pytest.mark.parametrize(("W", "k", "L", "bs", "i2", "h"),
                         [(2, 2, 2, 4, 512, 1024), (3, 3, 2, 5, 512, 1024),
                          (4, 2, 3, 3, 256, 1024),
                          # experts of ~200 rows: two M tiles; N 640: a 128-column tile
                          (2, 4, 2, 100, 640, 1024)])
def test_the_layer_matches_the_reference(tmp_path, W, k, L, bs, i2, h):
    sc = layer_scenario(tmp_path, ep_world_size=W, k=k, experts_per_rank=L, bs=bs,
                        intermediate=i2, h=h, **FORM)
    res = sim.simulate(sc)
    want = dfc_reference(sc)
    (op,) = res.ops
    assert op.op == "dispatch_ffn_combine"
    ids = [a["expert_ids"] for a in sim.load_inputs(sc)]
    glob = np.bincount(np.concatenate([i.reshape(-1) for i in ids]), minlength=W * L)
    for r in range(W):
        st, out = want.stages[r], op.outputs[r]
        assert out["expert_token_nums"].tolist() == glob[r * L:(r + 1) * L].tolist()
        assert out["expert_token_nums"].tolist() == st.expert_token_nums.tolist()
        assert _bits(out["out"]) == _bits(want.y[r])


def test_the_one_core_sort_path_matches_the_reference(tmp_path):
    """2496 routes at H 8192: 2496 * 4 * 9 + 32 + 64 + 13 * 8192 > 196352 B, so IsFullLoad
    is false, and 2496 <= 6112 fits one sort: tiling key 11000 (sort on core 0, split
    count, scatter, gather)."""
    sc = layer_scenario(tmp_path, ep_world_size=2, k=4, experts_per_rank=2, bs=624,
                        intermediate=256, h=8192, **FORM)
    assert not sc.tiling.full_load and sc.tiling.gather_cores == 40
    res = sim.simulate(sc)
    want = dfc_reference(sc)
    (op,) = res.ops
    for r in range(2):
        assert op.outputs[r]["expert_token_nums"].tolist() == (
            want.stages[r].expert_token_nums.tolist())
        assert _bits(op.outputs[r]["out"]) == _bits(want.y[r])


def test_routing_tiling_by_hand():
    """sortLoopMaxElement = 196352 / 32 aligned to 32 = 6112; at H 7168, 4096 routes need
    4096 * 4 * 9 + 64 + 13 * 7168 > 196352 B, so not full load, one-core sort."""
    assert tiling.sort_loop_max() == 6112
    assert tiling.routing_fits(256 * 8, 7168, 256)
    assert not tiling.routing_fits(512 * 8, 7168, 256)
    assert tiling.routing_fits(2464, 8192, 4) and not tiling.routing_fits(2496, 8192, 4)


def test_timing_only_runs_the_same_time(tmp_path):
    full = sim.simulate(layer_scenario(tmp_path, ep_world_size=3, k=3, bs=5, **FORM))
    fast = sim.simulate(layer_scenario(tmp_path, name="fast", ep_world_size=3, k=3, bs=5,
                                       timing_only=True, **FORM))
    for a, b in zip(full.ops, fast.ops, strict=True):
        assert (a.op, a.end_ns - a.start_ns) == (b.op, b.end_ns - b.start_ns)


def test_routing_quant_truncates_to_fp16_then_rounds_half_away():
    """amax 127: s = 127 / 127 = 1 and y = x; ROUND takes 2.5, -2.5 and 0.5 away from
    zero (RINT would give 2, -2, 0). TRUNC: 2.5 - 2^-11 is below fp16's 2.5 by a quarter
    of its spacing (2^-9): RNE gives 2.5, TRUNC 2.5 - 2^-9, so the int8 is 2, not 3."""
    x = np.array([[127.0, 2.5, -2.5, 0.5]], np.float32).astype(ml_dtypes.bfloat16)
    q, s = ref.routing_quant(x)
    assert q.tolist() == [[127, 3, -3, 1]] and s.tolist() == [1.0]
    y = np.array([2.5 - 2.0 ** -11, -(2.5 - 2.0 ** -11)], np.float32)
    assert ref.trunc_f16(y).tolist() == [2.5 - 2.0 ** -9, -(2.5 - 2.0 ** -9)]
    assert y.astype(np.float16).tolist() == [2.5, -2.5]
    assert ref.round_i8(ref.trunc_f16(y)).tolist() == [2, -2]


def test_reference_orders_routes_by_expert_then_route():
    ids = np.array([[3, 0], [0, 2]])  # routes 0:3 1:0 2:0 3:2
    assert ref.expert_order(ids).tolist() == [1, 2, 3, 0]


def test_fixpipe_dequant_rounds_c_to_fp16():
    acc = np.array([[2049, 3]], np.int32)
    got = ref.fixpipe_f16(acc, np.array([0.5, 1.0 / 3.0], np.float32))
    assert got.tolist() == [[1024.0, float(np.float16(1.0))]]


@pytest.mark.parametrize(("workload", "key"), [
    ({"weight_dtype": "bfloat16"}, "workload.weight_dtype"),
    ({"intermediate": 255}, "workload.intermediate"),
    ({"hccl_buffsize": 10}, "workload.hccl_buffsize"),
    ({"experts_per_rank": 1}, "workload.experts_per_rank"),
    ({"bs": 512, "k": 12, "experts_per_rank": 8}, "workload.bs"),
])
def test_refusals_name_the_key(tmp_path, workload, key):
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        layer_scenario(tmp_path, **{**FORM, **workload})


def test_ascend950_is_refused(tmp_path):
    import yaml

    from npusim.scenario import load_scenario
    w = {"kernel": "moe_layer", "op": "moe_layer", "bs": 4, "h": 1024, "k": 2,
         "ep_world_size": 2, "experts_per_rank": 2, "dtype": "bfloat16",
         "intermediate": 256, **FORM}
    path = tmp_path / "a5.yaml"
    path.write_text(yaml.safe_dump({"name": "a5", "hardware": "ascend950", "workload": w}))
    with pytest.raises(InputError, match=r"built for atlas_a3 only"):
        load_scenario(path)


def test_reference_by_hand_on_one_token_two_experts():
    """H 2, 2I 2, one rank, one token to experts 1 and 0 (probs 0.5, 0.25), unit scales.
    x = [127, -127]: s = 1, q = x. Expert 0: w1 rows [1, 1], [0, 0] -> acc [127, 127],
    gate 127, silu 127 (exp(-127) vanishes against 1), out 127 * 127 = 16129, q 127 with
    scale 16129 / 127 = 127; w2 [1, 0] -> [127, 0] -> bf16(127 * 127) = 16128 (bf16
    spacing 64 there). Expert 1: w1 = identity -> gate 127, up -127 -> q -127, scale 127;
    w2 [0, 1] -> [0, -16128]. Sorted order: expert 0's route (k = 1) first. Out:
    0.5 * [0, -16128] + 0.25 * [16128, 0] = [4032, -8064], exact in bf16."""
    bf = ml_dtypes.bfloat16
    x = np.array([[127.0, -127.0]], np.float32).astype(bf)
    w1 = np.array([[[1, 1], [0, 0]], [[1, 0], [0, 1]]], np.int8)
    w2 = np.array([[[1, 0]], [[0, 1]]], np.int8)
    ones = np.ones((2, 2), np.float32)
    wt = ref.DfcWeights(w1, ones, w2, ones)
    got = ref.reference_layer([x], [np.array([[1, 0]])], [np.array([[0.5, 0.25]], np.float32)],
                              [wt], 2)
    st = got.stages[0]
    assert st.expanded_row_idx.tolist() == [1, 0]
    assert st.expert_token_nums.tolist() == [1, 1]
    assert st.gmm1.tolist() == [[127.0, 127.0], [127.0, -127.0]]
    assert st.swiglu.tolist() == [[127], [-127]] and st.swiglu_scale.tolist() == [127.0, 127.0]
    assert st.gmm2.astype(np.float32).tolist() == [[16128.0, 0.0], [0.0, -16128.0]]
    assert got.y[0].astype(np.float32).tolist() == [[4032.0, -8064.0]]
