"""Core kinds: a test-only kind with an extra pipe and an extra local buffer runs through
launch, the drain, the sanitiser's buffer and pipe checks, the report and the trace's
lanes, declared in one place (npusim.hw.cores) and nowhere in the runtime's core loop."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.engine.trace import Trace
from npusim.errors import KernelError
from npusim.hw.cores import AIV, BufferKind, CoreKind, PipeKind, register
from npusim.hw.machine import Machine
from npusim.kernels.kernel import Kernel
from npusim.report.build import build_report
from npusim.report.trace import build_trace
from npusim.result import RunResult
from npusim.runtime.launch import launch
from npusim.sim import _op_run

SDMA_NS = 5000.0
FAKE = register(CoreKind(
    "test_fake", "chip.aiv_cores",
    pipes=(*AIV.pipes, PipeKind("sdma", "fixed", "SDMA engine")),
    buffers=(*AIV.buffers, BufferKind("l1", "ub.bytes", "ub.alignment")),
))


class FakeKernel(Kernel):
    name = "fake_op"
    core_kind = FAKE.name

    def program(self, tiling):
        def program(ctx):
            with ctx.phase("move"):
                a = ctx.alloc("a", 64, buffer="l1")
                ctx.fixed("sdma", "sdma_move", SDMA_NS, writes=[a])
            yield from ()  # returns at once: only the drain waits for the engine
        return program


def _machine(hw, detailed=False):
    return Machine(hw, 2, Trace(detailed=detailed), (FAKE,))


def test_the_kind_builds_its_pipes_and_buffers(hw):
    m = _machine(hw)
    core = m.ranks[1].cores[3]
    assert len(m.ranks[1].cores) == hw.chip.aiv_cores
    assert set(core.pipes) == {"scalar", "vector", "mte2", "mte3", "sdma"}
    assert set(core.buffers) == {"ub", "l1"} and core.l1.capacity == hw.ub.bytes
    assert FAKE.drained() == ("vector", "mte2", "mte3", "sdma")


def test_launch_drains_the_declared_extra_pipe(hw):
    m = _machine(hw)
    res = launch(m, FakeKernel().program(None))
    # the round preset: launch 0 ns, scalar issue 0 ns; the core ends when its SDMA op is
    # done, SDMA_NS after the start, because the drain waits for every declared pipe
    assert res.core_end_ns == [[SDMA_NS] * hw.chip.aiv_cores] * 2


def test_the_sanitiser_checks_buffers_and_pipes_against_the_kind(hw):
    def program(ctx):
        ctx.alloc("x", 32, buffer="l0a")
        yield from ()

    with pytest.raises(KernelError, match=r"no local buffer 'l0a'; buffers: ub, l1"):
        launch(Machine(hw, 2, kinds=(FAKE,)), program)

    def aiv_program(ctx):
        yield from ctx.pipe_barrier("sdma")

    with pytest.raises(KernelError, match=r"core kind aiv has no pipe 'sdma'"):
        launch(Machine(hw, 2), aiv_program)

    def hazard(ctx):  # the extra pipe gets the same hazard checks as vector, on its L1
        buf = ctx.alloc("b", 64, buffer="l1")
        ctx.copy_in(buf, ctx.window(), 0, 64)
        ctx.fixed("sdma", "too_early", 10.0, reads=[buf])
        yield from ()

    with pytest.raises(KernelError, match=r"sdma 'too_early' reads L1 buffer 'b' before"):
        launch(Machine(hw, 2, kinds=(FAKE,)), hazard)


def test_report_and_trace_lanes_follow_the_kind(hw):
    m = _machine(hw, detailed=True)
    kernel = FakeKernel()
    res = launch(m, kernel.program(None))
    run = _op_run(m, kernel, res, [])
    result = RunResult({"name": "fake"}, hw.to_dict(), [run], m.env.events_processed, 0.0)
    op = build_report(result)["ops"][0]
    assert op["cores_per_rank"] == hw.chip.aiv_cores
    assert op["latency_us"] == SDMA_NS / 1000.0
    assert set(op["ranks"][0]["cores"][0]["stream_us"]) == {"mte2", "mte3"}
    events = build_trace(result)["traceEvents"]
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "core 0 sdma" in threads
    sdma = [e for e in events if e["name"] == "sdma_move"]
    assert len(sdma) == 2 * hw.chip.aiv_cores
    assert all(e["dur"] == SDMA_NS / 1000.0 for e in sdma)
    assert np.unique([e["tid"] for e in sdma if e["pid"] == 0]).size == hw.chip.aiv_cores
