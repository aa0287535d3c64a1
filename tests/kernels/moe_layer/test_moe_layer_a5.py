"""form unfused on the Ascend 950 (MX weights): every kernel's output byte-equal to
the numpy reference, timing-only equal to the functional run, the host tilings against
hand arithmetic, the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim import sim
from npusim.kernels.moe_layer.a5 import reference as ref
from npusim.scenario import Scenario
from tests.kernels.moe_layer.layerhelp import layer_scenario


def a5_scenario(tmp: Path, name: str = "a5", hardware: str = "ascend950", **workload: Any
                ) -> Scenario:
    return layer_scenario(tmp, name, hardware, **{"weight_dtype": "fp8_e4m3", **workload})


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def reference_of(sc: Scenario) -> tuple[list[ref.Stages], list[np.ndarray]]:
    ins = sim.load_inputs(sc)
    t = sc.tiling
    experts = [ref.Experts(a["gmm1_weight"], a["gmm1_weight_scale"], a["gmm2_weight"],
                           a["gmm2_weight_scale"]) for a in ins]
    return ref.reference_layer(t.mc2.shape, (t.gmm1, t.gmm2), [a["x"] for a in ins],
                               [a["expert_ids"] for a in ins],
                               [a["expert_scales"] for a in ins], experts, t.mode)


@pytest.mark.parametrize("W, k, L, bs, i2, h, fp8", [
    (2, 2, 2, 4, 256, 1024, "fp8_e4m3"),
    (3, 3, 2, 5, 384, 1024, "fp8_e5m2"),
    # GMM2's N 1536: six 256-column blocks; GMM1's K 1536: six L0 K steps
    (4, 2, 3, 3, 512, 1536, "fp8_e4m3"),
    # about 300 rows an expert: two 256-row block rows in the sliding window's walk
    (2, 1, 1, 300, 256, 1024, "fp8_e4m3")])
def test_every_kernel_matches_the_reference(tmp_path, W, k, L, bs, i2, h, fp8):
    sc = a5_scenario(tmp_path, ep_world_size=W, k=k, experts_per_rank=L, bs=bs,
                     intermediate=i2, h=h, weight_dtype=fp8)
    res = sim.simulate(sc)
    stages, ys = reference_of(sc)
    ops = {o.op: o for o in res.ops}
    assert list(ops) == ["dispatch", "mx_gmm1", "swiglu", "dynamic_mx_quant", "mx_gmm2",
                         "combine"]
    assert sum(s.dispatch.n for s in stages) == W * bs * k
    for r, st in enumerate(stages):
        n = st.dispatch.n
        got = {(op, name): ops[op].outputs[r][name] for op, name in (
            ("dispatch", "expand_x"), ("mx_gmm1", "y"), ("swiglu", "y"),
            ("dynamic_mx_quant", "y"), ("dynamic_mx_quant", "scale"), ("mx_gmm2", "y"))}
        want = {("dispatch", "expand_x"): st.dispatch.expand_x, ("mx_gmm1", "y"): st.gmm1,
                ("swiglu", "y"): st.swiglu, ("dynamic_mx_quant", "y"): st.quant,
                ("dynamic_mx_quant", "scale"): st.quant_scale, ("mx_gmm2", "y"): st.gmm2}
        counts = ops["dispatch"].outputs[r]["expert_token_nums"]
        assert counts.tolist() == st.dispatch.expert_token_nums.tolist()
        for key, arr in got.items():
            assert _bits(arr[:n]) == _bits(want[key][:n]), key
        assert _bits(ops["combine"].outputs[r]["x"]) == _bits(ys[r])


def test_timing_only_runs_the_same_time(tmp_path):
    runs = [sim.simulate(a5_scenario(tmp_path, name=f"t{fast}", ep_world_size=3, k=3, bs=5,
                                      timing_only=fast)).ops for fast in (False, True)]
    spans = [[(o.op, o.end_ns - o.start_ns) for o in ops] for ops in runs]
    assert spans[0] == spans[1]
    # the layer's figures on the combine: the six kernels' times and their sum
    last = runs[1][-1].family_fields
    assert list(last["layer_ops_us"]) == [op for op, _ in spans[1]]
    assert last["layer_latency_us"] == round(sum(ns for _, ns in spans[1]) / 1e3, 4)
