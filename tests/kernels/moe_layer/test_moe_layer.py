"""moe_layer end to end on small shapes: every kernel's outputs byte for byte against the
numpy reference, timing-only runs the same time, the tilings derived by hand from the
A3 preset, and the refusals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from npusim import sim
from npusim.errors import InputError
from npusim.kernels.moe_layer import tiling as tl
from npusim.kernels.moe_layer.gmm import blocks_of
from tests.kernels.moe_layer.layerhelp import (
    assert_refused,
    layer_scenario,
    reference_of,
    run_layer,
)


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize(("W", "k", "L", "bs", "i2", "h"),
                         [(2, 2, 2, 4, 256, 1024), (3, 3, 2, 5, 512, 1024),
                          (4, 2, 3, 3, 256, 1024),
                          # GMM2: 56 blocks of 16 rows on 24 AICs; AIV0 gets no chunk
                          (2, 2, 2, 4, 256, 7168)])
def test_every_kernel_matches_the_reference(tmp_path, W, k, L, bs, i2, h):
    sc, res = run_layer(tmp_path, ep_world_size=W, k=k, experts_per_rank=L, bs=bs,
                        intermediate=i2, h=h)
    want = reference_of(sc)
    ops = {o.op: o for o in res.ops}
    assert list(ops) == ["ones_like", "low_latency_dispatch", "gmm1", "dequant_swiglu_quant",
                         "gmm2", "low_latency_combine"]
    assert sum(int(s.counts.sum()) for s in want.stages) == W * bs * k
    for r in range(W):
        st = want.stages[r]
        n = st.recv_x.shape[0]
        d = ops["low_latency_dispatch"].outputs[r]
        assert d["packed_recv_count"].tolist() == st.counts.tolist()
        assert _bits(d["packed_recv_x"][:n]) == _bits(st.recv_x)
        assert _bits(d["packed_recv_x_scales"][:n]) == _bits(st.recv_scales)
        assert _bits(ops["gmm1"].outputs[r]["y"][:n]) == _bits(st.gmm1)
        dsq = ops["dequant_swiglu_quant"].outputs[r]
        assert _bits(dsq["y"][:n]) == _bits(st.swiglu)
        assert _bits(dsq["scale"][:n]) == _bits(st.swiglu_scale)
        assert _bits(ops["gmm2"].outputs[r]["y"][:n]) == _bits(st.gmm2)
        assert _bits(ops["low_latency_combine"].outputs[r]["combined_x"]) == _bits(want.y[r])


def test_timing_only_runs_the_same_time(tmp_path):
    full = sim.simulate(layer_scenario(tmp_path, ep_world_size=3, k=3, bs=5))
    fast = sim.simulate(layer_scenario(tmp_path, name="fast", ep_world_size=3, k=3, bs=5,
                                       timing_only=True))
    for a, b in zip(full.ops, fast.ops, strict=True):
        assert (a.op, a.end_ns - a.start_ns) == (b.op, b.end_ns - b.start_ns)
    # the layer's figures sit on the last kernel: the sum of the six kernels' times; each
    # kernel starts when the one before has ended
    for a, b in zip(fast.ops, fast.ops[1:], strict=False):
        assert b.start_ns >= a.end_ns
    last = fast.ops[-1].family_fields
    assert last["layer_ops_us"] == {o.op: round((o.end_ns - o.start_ns) / 1e3, 4)
                                    for o in fast.ops}
    assert last["layer_latency_us"] == round(sum(o.end_ns - o.start_ns for o in fast.ops) / 1e3, 4)


class Aic:
    cores, l1_bytes, l0a_bytes, l0b_bytes, l0c_bytes = 24, 512 * 1024, 65536, 65536, 131072


def test_gmm_tiling_by_hand():
    # baseN 256; baseK = 32 KiB / 256 = 128; baseM = min(32 KiB / 128, 128 KiB / 1 KiB) = 128
    t = tl.gmm_tiling(Aic, 196608, 32768, 7168, 4096, 16)
    assert (t.base_m, t.base_n, t.base_k) == (128, 256, 128)
    # L1 less 2 KiB of scales: A (512 KiB - 2 KiB - 256 KiB) / 2 / 16 KiB = 7, B 128 KiB /
    # 32 KiB = 4; A's made a multiple of B's: 4
    assert (t.step_ka, t.step_kb, t.cores) == (4, 4, 24)
    # UB less 2 (256 * 2 + 128 * 4) = 194560 B, / 28 = 6948 -> 6144 elements / 256 = 24
    assert t.vec_rows == 24
    few = tl.gmm_tiling(Aic, 196608, 40, 1024, 512, 2)  # baseM: 40 rows -> 48
    assert few.base_m == 48
    assert few.cores == (2 + (40 - 2) // 48) * 2  # blocks fewer than the AIC


def test_dsq_tiling_by_hand():
    t = tl.dsq_tiling(196608, 48, 32768, 4096, 16)
    assert (t.ub_rows, t.cores) == (16384 // 4096, 36)  # PERFORMANCE_UB_FACTOR, core cap
    # maxOutDimy = (196608 - 1124) / 37 = 5283 -> 5280 (a multiple of 32): 2I <= 10560
    assert tl.dsq_max_in_dim(196608) == 10560
    # 2I = 512: (196608 - 1024 - 256 * 4 - 32 - 2 * 256 * 4) B over 2 (512 + 8) 4 + 256 + 4
    # + 512 * 4 B a row = 192480 / 6468 -> 29 rows; 1000 rows over them: 35 cores
    t = tl.dsq_tiling(196608, 48, 1000, 512, 4)
    assert (t.ub_rows, t.cores) == (29, 35)


def test_blocks_carry_on_over_groups():
    t = replace(tl.gmm_tiling(Aic, 196608, 64, 256, 512, 2), cores=3)
    assert (t.base_m, t.base_n) == (64, 256)
    # group 0 (10 rows): blocks 0, 1 -> cores 0, 1; group 1 (20 rows) counts on from 2:
    # its blocks 2, 3 -> cores 2, 0 (core 0's second turn)
    got = [list(blocks_of(t, [10, 20], c)) for c in range(3)]
    assert got == [[(0, 0, 10, 0, 256), (1, 10, 20, 256, 256)], [(0, 0, 10, 256, 256)],
                   [(1, 10, 20, 0, 256)]]


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"weight_dtype": "bfloat16"}, "workload.weight_dtype", "W8A8"),
    ({"intermediate": 255}, "workload.intermediate", "allowed: even"),
    ({"intermediate": 10592}, "workload.intermediate", "CountMaxDim"),
    ({"bs": 600}, "workload.bs", "xDim0(BS)"),
    # the family's limits are every form's (fused_deep_moe takes h from 512); the unfused
    # chain's low-latency kernels refuse h below 1024 in its misfit
    ({"h": 8224}, "workload.h", "allowed: 512..8192"),
    ({"h": 768}, "workload.h", "allowed: 1024..8192"),
])
def test_refusals_name_the_key_and_the_limit(tmp_path, change, key, words):
    assert_refused(lambda: layer_scenario(tmp_path, **change), key, words)


def test_other_presets_are_refused(tmp_path):
    import yaml

    from npusim.scenario import load_scenario
    path = tmp_path / "a2.yaml"
    path.write_text(yaml.safe_dump({"name": "a2", "hardware": "atlas_a2", "workload": {
        "kernel": "moe_layer", "op": "moe_layer", "bs": 4, "h": 1024, "k": 2,
        "ep_world_size": 2, "experts_per_rank": 2, "dtype": "bfloat16"}}))
    with pytest.raises(InputError, match="allowed: atlas_a3"):
        load_scenario(path)
