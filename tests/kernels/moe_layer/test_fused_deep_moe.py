"""moe_layer form fused_deep_moe end to end on small shapes: the one kernel's output and
receive counts byte for byte against the fused numpy reference, its phases, a timing-only
run the same time, and the refusals as a scenario meets them."""

from __future__ import annotations

import numpy as np
import pytest

from npusim import sim
from npusim.errors import InputError
from npusim.kernels.exchange import received
from npusim.kernels.moe_layer.fused_deep_moe.reference import reference_fused_layer
from npusim.kernels.moe_layer.reference import ExpertWeights
from tests.kernels.moe_layer.layerhelp import layer_scenario

FUSED = {"form": "fused_deep_moe", "intermediate": 1024, "h": 512}
PHASES = ["dispatch_send", "dispatch_recv", "gmm1", "swiglu", "quant", "stage_barrier",
          "gmm2", "combine", "weight_sum"]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _reference(sc):
    ins = sim.load_inputs(sc)
    ids = [np.asarray(a["topk_idx"]) for a in ins]
    layer = reference_fused_layer(
        [a["x"] for a in ins], ids, [a["topk_weights"] for a in ins],
        [ExpertWeights(a["gmm1_weight"], a["gmm1_weight_scale"], a["gmm2_weight"],
                       a["gmm2_weight_scale_fp32"]) for a in ins], sc.workload.shape.L)
    return layer.y, [got.counts.reshape(-1) for got in received(ids, sc.workload.shape.L)]


@pytest.mark.parametrize(("W", "k", "L", "bs", "i2", "h"), [
    (2, 2, 2, 4, 1024, 512),
    (3, 3, 2, 5, 1024, 1024),
    (4, 2, 3, 3, 1280, 512),  # 24 receive cores over 3 experts, empty (source, expert)s
    (2, 4, 5, 40, 1024, 768),  # 5 experts: 4 receive cores each, 4 left idle
])
def test_the_layer_matches_the_fused_reference(tmp_path, W, k, L, bs, i2, h):
    sc = layer_scenario(tmp_path, **{**FUSED, "ep_world_size": W, "k": k,
                                     "experts_per_rank": L, "bs": bs, "intermediate": i2,
                                     "h": h})
    res = sim.simulate(sc)
    [op] = res.ops
    assert op.op == "fused_deep_moe"
    assert list(op.phase_order) == PHASES
    ys, counts = _reference(sc)
    assert sum(int(c.sum()) for c in counts) == W * bs * k
    for r in range(W):
        assert op.outputs[r]["ep_recv_count"].tolist() == counts[r].tolist()
        assert _bits(op.outputs[r]["output"]) == _bits(ys[r])
    f = op.family_fields
    assert f["ep_recv_count"] == [c.tolist() for c in counts]
    # the report: every stage's span, the dispatch told apart from the combine
    assert list(f["stage_us"]) == PHASES
    assert f["critical_stage"] in PHASES and f["critical_stage"] != "stage_barrier"
    assert f["overlap"]["dispatch"]["hidden_behind"] == "gmm1"
    assert f["overlap"]["combine"]["hidden_behind"] == "gmm2"
    assert all(f["overlap"][c]["communication_us"] > 0 for c in ("dispatch", "combine"))


def test_more_blocks_than_ring_stages_and_two_m_tiles_per_expert(tmp_path):
    # ~260 rows per expert: 2 GMM1 M tiles x 32 N tiles, 5-6 blocks per AIC, so the
    # soft-sync waits and GMM2's stage flags go round the 4-stage ring
    sc = layer_scenario(tmp_path, **{**FUSED, "bs": 256, "intermediate": 4096})
    [op] = sim.simulate(sc).ops
    ys, _ = _reference(sc)
    for r in range(2):
        assert _bits(op.outputs[r]["output"]) == _bits(ys[r])


def test_timing_only_runs_the_same_time(tmp_path):
    kw = {**FUSED, "ep_world_size": 3, "k": 3, "bs": 5}
    full = sim.simulate(layer_scenario(tmp_path, **kw))
    fast = sim.simulate(layer_scenario(tmp_path, name="fast", timing_only=True, **kw))
    [a], [b] = full.ops, fast.ops
    assert a.end_ns - a.start_ns == b.end_ns - b.start_ns


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"h": 256}, "workload.h", "allowed: 512..8192"),  # the family's range
    ({"h": 7680}, "workload.h", "fused_deep_moe_tiling.cpp:82-83"),
    ({"intermediate": 512}, "workload.intermediate", "allowed: 1024..6144"),
    ({"intermediate": 1088}, "workload.intermediate", "multiples of 128"),
    ({"k": 13, "experts_per_rank": 8}, "workload.k", "allowed: 1..12"),
    ({"bs": 300}, "workload.bs", "allowed: 1..256"),
    ({"experts_per_rank": 1}, "workload.experts_per_rank", "shallow-dispatch"),
    ({"experts_per_rank": 25}, "workload.experts_per_rank", "aivNum / 2 = 24"),
    ({"weight_dtype": "bfloat16"}, "workload.weight_dtype", "allowed: int8"),
    ({"hccl_buffsize": 1, "bs": 256, "h": 4096}, "workload.hccl_buffsize", "allowed: at least"),
])
def test_refusals_name_the_key_and_the_limit(tmp_path, change, key, words):
    with pytest.raises(InputError) as info:
        layer_scenario(tmp_path, **{**FUSED, **change})
    assert info.value.key == key
    assert words in info.value.message
    assert "\n" not in info.value.message


def test_h_below_1024_reaches_the_fused_form_only(tmp_path):
    assert layer_scenario(tmp_path, **FUSED).workload.shape.H == 512
    with pytest.raises(InputError, match="allowed: 1024..8192"):
        layer_scenario(tmp_path, name="unfused", h=512)


def test_the_cube_block_keeps_the_note_it_is_given():
    """FusedDeepMoe's GEMMs note each mmad through CubeBlock's `note` (its overlap figures
    count the cube's busy time); the block must keep the callable it was built with."""
    from types import SimpleNamespace

    from npusim.kernels.moe_layer.gmm import CubeBlock
    from npusim.kernels.moe_layer.tiling import GmmTiling

    ctx = SimpleNamespace(alloc=lambda *a, **k: object())
    seen: list = []
    t = GmmTiling(256, 512, 128, 2, 256, 128, 128, 4, 4, 24, 256)
    assert CubeBlock(ctx, t, note=seen.append).note == seen.append
