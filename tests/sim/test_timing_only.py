"""Timing-only runs skip payload numerics but must give exactly the same times."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.scenario import load_scenario
from npusim.sim import simulate
from tests.cli.test_kernel_faults import FAULTY, TOY, faulty_scenario
from tests.kernels.cann_sample.samplehelp import (
    assert_bytes_equal,
    dispatch_ref,
    scenario,
    workload_inputs,
)
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


def test_timing_only_moves_the_counts_and_flags_kernels_read(tmp_path):
    """What the kernels read of one another (the arrival flags they poll, the status counts
    they sum, the triplets in the records) still moves in a timing-only run: the dispatch's
    assist info and counts are the numpy reference's from the routing alone, and the
    payload outputs are zeros."""
    sc = scenario(tmp_path, op="dispatch", dispatch_quant="mxfp8", bs=16,
                  routing={"kind": "uniform", "seed": 7}, timing_only=True)
    ids = workload_inputs(sc).expert_ids
    shape = sc.workload.shape
    ref = dispatch_ref(sc, [np.zeros((shape.BS, shape.H), np.float16)] * len(ids), ids)
    out = simulate(sc).ops[0].outputs
    for r, (got, want) in enumerate(zip(out, ref, strict=True)):
        for name in ("assist_info_for_combine", "expert_token_nums", "ep_recv_count"):
            assert_bytes_equal(got[name], want[name], f"rank {r} {name}")
        assert not got["expand_x"].view(np.uint8).any()
        assert not got["dynamic_scales"].view(np.uint8).any()


FAULTS = {
    "out_of_bounds": ("ctx.put(0, ctx.window().nbytes - 32, buf, 64)",
                      "rank 1, core 2, step 'send', address {end:#x}, size 64: put of 64 B at "
                      "offset {end} is outside 'window' of rank 0"),
    "race": ("ctx.put(0, 0, buf, 64); ctx.put(0, 32, buf, 64)",
             "rank 1, core 2, step 'send', address 0x20, size 64: put to the window of rank 0 "
             "overlaps the bytes an earlier put of this call wrote (rank 1 core 2 send "
             "[0x0, 0x40)): a race"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_timing_only_still_catches_a_kernel_fault(tmp_path, capsys, fault):
    """A put out of the window and two puts on the same bytes end a timing-only run as a
    functional one: exit 3, one line with rank, core, step and address."""
    body, says = FAULTS[fault]
    lines = []
    for timing_only in (False, True):
        sc, _ = faulty_scenario(tmp_path, FAULTY.format(toy=str(TOY), body=(
            "buf = ctx.alloc('row', 64); ctx.ub_write(buf, 0, "
            "__import__('numpy').zeros(64, 'uint8'), ops=0); " + body)))
        doc = yaml.safe_load(sc.read_text())
        doc["workload"]["timing_only"] = timing_only
        sc.write_text(yaml.safe_dump(doc))
        code = main(["run", str(sc), "--out", str(tmp_path / f"o{timing_only}"), "--quiet",
                     "--workers", "1"])
        err = capsys.readouterr().err
        assert code == 3, err
        lines.append(err)
    window = load_scenario(sc).hardware.window.bytes
    assert lines[0] == lines[1]
    assert lines[1].startswith("npusim: kernel error: " + says.format(end=window - 32))
