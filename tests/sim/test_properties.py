"""Property tests over random small valid scenarios: every run finishes, its outputs match
the numpy reference byte for byte, and latency does not fall when BS grows (by more than
one poll period: a polled wake-up lands on the poll loop's cadence, whose phase moves
with the work done before the loop started, so a larger BS can wake a core a little
earlier; see docs/model.md)."""

from __future__ import annotations

import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.kernels.cann_sample.reference import expert_outputs_from_dispatch
from npusim.sim import simulate
from tests.kernels.cann_sample.samplehelp import (
    assert_bytes_equal,
    combine_ref,
    dispatch_ref,
    scenario,
    workload_inputs,
)

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@st.composite
def workloads(draw):
    w = draw(st.integers(2, 4))
    per_rank = draw(st.integers(1, 4))
    k = draw(st.integers(1, min(4, w * per_rank)))
    return dict(
        op="dispatch_combine", ep_world_size=w, experts_per_rank=per_rank, k=k,
        bs=draw(st.integers(1, 12)), h=draw(st.sampled_from([1024, 1056, 2048])),
        dtype=draw(st.sampled_from(["float16", "bfloat16"])),
        dispatch_quant=draw(st.sampled_from(["none", "int8", "mxfp8"])),
        combine_quant=draw(st.sampled_from(["none", "int8"])),
        mxfp8_saturate=True,
        routing={"kind": draw(st.sampled_from(["uniform", "zipf"])),
                 "seed": draw(st.integers(0, 1000))},
    )


@SETTINGS
@given(workloads())
def test_random_scenarios_finish_and_match_the_reference(tmp_path_factory, w):
    sc = scenario(tmp_path_factory.mktemp("p"), **w)
    result = simulate(sc)
    inp = workload_inputs(sc)
    disp = dispatch_ref(sc, inp.x, inp.expert_ids)
    got = result.ops[0].outputs
    for r in range(w["ep_world_size"]):
        for name, want in disp[r].items():
            assert_bytes_equal(got[r][name], want, f"rank {r} {name}")
    experts = [expert_outputs_from_dispatch(d, w["dispatch_quant"], w["h"], w["dtype"])
               for d in disp]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want_x = combine_ref(sc, experts, inp.expert_ids, inp.expert_scales, recip=True,
                             disp=disp)
    for r in range(w["ep_world_size"]):
        assert_bytes_equal(result.ops[1].outputs[r]["x"], want_x[r], f"rank {r} x")


@SETTINGS
@given(w=st.integers(2, 4), per_rank=st.integers(1, 4), h=st.sampled_from([1024, 2048]),
       quant=st.sampled_from(["none", "mxfp8"]), cquant=st.sampled_from(["none", "int8"]),
       bs=st.integers(1, 24), more=st.integers(1, 24))
def test_latency_does_not_fall_when_bs_grows(tmp_path_factory, w, per_rank, h, quant, cquant, bs,
                                            more):
    tmp = tmp_path_factory.mktemp("bs")
    common = dict(op="dispatch_combine", ep_world_size=w, experts_per_rank=per_rank,
                  k=min(2, w * per_rank), h=h, dispatch_quant=quant, combine_quant=cquant,
                  timing_only=True)
    sc = scenario(tmp, name="small", bs=bs, **common)
    small = simulate(sc)
    large = simulate(scenario(tmp, name="large", bs=bs + more, **common))
    hw = sc.hardware
    # the longest poll read here is a few hundred bytes: latency + check, well under 0.2 us
    poll_period = hw.mte.gm_to_ub_latency_ns + 200.0
    for a, b in zip(small.ops, large.ops, strict=True):
        assert b.end_ns - b.start_ns >= a.end_ns - a.start_ns - poll_period, a.op
