"""Timing-only runs skip payload numerics but must give exactly the same times."""

from __future__ import annotations

import dataclasses

import pytest

from npusim.scenario import load_scenario
from npusim.sim import simulate
from tests.kernels.cann_sample.samplehelp import scenario
from tests.kernels.deepep.deepephelp import write_scenario


@pytest.mark.parametrize("workload", [
    dict(op="dispatch_combine", dispatch_quant="mxfp8", combine_quant="int8"),
    dict(op="dispatch_combine", dispatch_quant="none", combine_quant="none", dtype="bfloat16"),
    dict(op="combine", combine_quant="int8", ep_world_size=8, experts_per_rank=4, k=8, bs=33),
    dict(op="dispatch", dispatch_quant="int8", routing={"kind": "uniform", "seed": 3}),
], ids=["mxfp8-int8", "none-bf16", "combine-w8", "dispatch-int8-uniform"])
def test_timing_only_gives_identical_times(tmp_path, workload):
    _assert_same_timing(scenario(tmp_path, **workload))


@pytest.mark.parametrize("op", ["dispatch_combine", "combine"])
def test_deepep_normal_timing_only_gives_identical_times(tmp_path, op):
    """DeepEP's normal mode: a timing-only dispatch writes records of zeros (no triple), and
    the combine reads its triples from the routing; the times must not move."""
    shape = {"bs": 64, "h": 7168, "k": 8, "ep_world_size": 4, "experts_per_rank": 4,
             "quant": "int8"}
    _assert_same_timing(load_scenario(write_scenario(tmp_path, shape, "atlas_a3", "n", 5,
                                                     op=op)))


def _assert_same_timing(full):
    """The scenario functional and timing-only: equal op times, spans and event counts."""
    timing = dataclasses.replace(full, workload=dataclasses.replace(full.workload,
                                                                    timing_only=True))
    a, b = simulate(full), simulate(timing)
    assert [(op.op, op.start_ns, op.end_ns) for op in a.ops] == \
        [(op.op, op.start_ns, op.end_ns) for op in b.ops]
    spans = lambda r: [(s.rank, s.core, s.name, s.start_ns, s.end_ns)  # noqa: E731
                       for op in r.ops for s in op.spans]
    assert spans(a) == spans(b)
    assert a.events == b.events
