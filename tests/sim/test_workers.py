"""workers = 2: combine simulated in a forked process alongside dispatch gives exactly the
run of workers = 1, and is thrown away (combine redone after dispatch) whenever it could
differ: when the simulated dispatch wrote other outputs than the reference, or when the
forked process failed. A failing dispatch leaves no child process behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

from npusim import sim
from npusim.errors import KernelError
from npusim.kernels.cann_sample import chain
from npusim.report.build import build_report
from npusim.sim import simulate
from tests.kernels.cann_sample.samplehelp import scenario

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

WORKLOADS = [
    pytest.param(dict(dispatch_quant="mxfp8", combine_quant="int8"), id="mxfp8-int8"),
    pytest.param(dict(dispatch_quant="none", combine_quant="none", dtype="bfloat16"),
                 id="none-none-bf16"),
    pytest.param(dict(dispatch_quant="int8", combine_quant="int8", timing_only=True),
                 id="int8-int8-timing-only"),
    pytest.param(dict(dispatch_quant="mxfp8", combine_quant="none", ep_world_size=5,
                      shared_experts=1, shared_expert_ranks=1), id="shared-expert"),
]


def _everything(result) -> tuple[str, list[bytes]]:
    """The report (wall clock aside) with every pipe span, and every output byte."""
    report = build_report(result)
    report["sim"].pop("wall_s", None)
    spans = [sorted((s.rank, s.core, s.lane, s.name, s.start_ns, s.end_ns, s.bytes,
                     s.delivered_ns or -1.0) for s in op.spans) for op in result.ops]
    outputs = [np.ascontiguousarray(v).tobytes() for op in result.ops for rank in op.outputs
               for _, v in sorted(rank.items())]
    return repr((report, spans, [(s.resource, s.t_ns, s.gbps) for s in result.samples],
                 result.events)), outputs


def _dispatch_combine(tmp_path, **w):
    base = dict(op="dispatch_combine", ep_world_size=4, experts_per_rank=2, k=4, bs=8,
                h=1024, routing={"kind": "uniform", "seed": 3})
    base.update(w)
    return scenario(tmp_path, **base)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_combine_ahead_is_kept_and_identical(tmp_path, workload):
    sc = _dispatch_combine(tmp_path, **workload)
    alone = simulate(sc, detailed_trace=True)
    ahead = simulate(sc, detailed_trace=True, workers=2)
    assert alone.combine_ahead == ""
    assert ahead.combine_ahead == "kept"
    assert _everything(ahead) == _everything(alone)


def test_other_dispatch_outputs_make_combine_run_again(tmp_path, monkeypatch):
    """The forked combine assumes a reference with one byte changed: its x would differ,
    so the run must not keep it."""
    sc = _dispatch_combine(tmp_path, dispatch_quant="none", combine_quant="none")
    alone = simulate(sc)
    true_reference = chain.reference_dispatch_outputs

    def off_by_one_byte(t, inputs):
        outs = true_reference(t, inputs)
        outs[1]["expand_x"].view(np.uint8)[0, 0] ^= 0x40
        return outs

    monkeypatch.setattr(chain, "reference_dispatch_outputs", off_by_one_byte)
    ahead = simulate(sc, workers=2)
    assert ahead.combine_ahead.startswith("redone: the simulated dispatch wrote other")
    assert _everything(ahead) == _everything(alone)


def _in_the_child_only(real):
    """`real`, but a MemoryError in any process other than this one (the fork)."""
    parent = os.getpid()

    def call(*args, **kw):
        if os.getpid() != parent:
            raise MemoryError("only in the child")
        return real(*args, **kw)

    return call


@pytest.mark.parametrize("module, name, error, note", [
    pytest.param(sim, "run_op", None, "redone: the forked combine did not finish",
                 id="the-child-fails"),
    pytest.param(chain, "reference_dispatch_outputs", MemoryError("no memory"),
                 "redone: cann_sample's reference of dispatch or its digest failed (",
                 id="no-reference"),
    pytest.param(os, "fork", OSError(11, "Resource temporarily unavailable"),
                 "redone: no second process (Resource temporarily unavailable)",
                 id="no-fork"),
])
def test_combine_runs_in_the_parent_when_the_child_cannot(tmp_path, monkeypatch, module, name,
                                                          error, note):
    sc = _dispatch_combine(tmp_path)
    alone = simulate(sc)

    def fail(*args):
        raise error

    monkeypatch.setattr(module, name, fail if error else _in_the_child_only(getattr(module, name)))
    ahead = simulate(sc, workers=2)
    assert ahead.combine_ahead.startswith(note)
    assert _everything(ahead) == _everything(alone)


def test_a_failing_dispatch_leaves_no_child(tmp_path, monkeypatch):
    sc = _dispatch_combine(tmp_path)

    def broken_dispatch(*args, **kwargs):
        raise KernelError("a kernel bug")

    monkeypatch.setattr(sim, "run_op", broken_dispatch)
    with pytest.raises(KernelError):
        simulate(sc, workers=2)
    with pytest.raises(ChildProcessError):  # every child has been reaped
        os.waitpid(-1, os.WNOHANG)


def test_combine_starts_where_dispatch_stopped(tmp_path):
    """The ops are placed back to back on the run's clock; combine's spans lie after
    dispatch's end."""
    result = simulate(_dispatch_combine(tmp_path))
    dispatch, combine = result.ops
    assert combine.start_ns >= dispatch.end_ns
    assert min(s.start_ns for s in combine.spans) >= combine.start_ns
    assert max(s.end_ns for s in combine.spans) <= combine.end_ns


def test_the_fork_makes_the_reference_it_runs_on(tmp_path, monkeypatch):
    """Both processes make the reference: the main process to hash it, after the fork, and
    the fork to run on. One held across the fork would count twice against the machine's
    memory, and a fork of a process holding a large reference (a timing-only combine's
    zero rows at EP 128: a terabyte of address space) is refused."""
    sc = _dispatch_combine(tmp_path)
    real = chain.reference_dispatch_outputs
    read_end, write_end = os.pipe()

    def noted(*args):
        os.write(write_end, f"{os.getpid()}\n".encode())
        return real(*args)

    monkeypatch.setattr(chain, "reference_dispatch_outputs", noted)
    ahead = simulate(sc, workers=2)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        pids = set(f.read().split())
    assert ahead.combine_ahead == "kept"
    assert len(pids) == 2 and str(os.getpid()).encode() in pids
