"""The block scheduler's stagger (kernel.block_stagger_ns): block b starts b steps after
block 0, and identical cores sharing the HBM leave lockstep (hand arithmetic on round
numbers, tests/conftest.py)."""

from __future__ import annotations

import pytest

from npusim.hw.machine import Machine
from npusim.runtime.launch import launch
from tests.conftest import round_hw
from tests.runtime.aichelp import aic_hw, mix_machine

ROW = 1000  # bytes each core loads per iteration


def _starts(machine: Machine, kind: str | None = None) -> dict[tuple[int, str], float]:
    seen: dict[tuple[int, str], float] = {}

    def program(ctx):
        seen[ctx.rank_id, ctx.core_label] = ctx.t
        yield from ()

    launch(machine, program, kind=kind)
    return seen


def test_block_b_starts_b_steps_after_block_0():
    hw = round_hw(**{"kernel.block_stagger_ns": 7.0, "kernel.launch_ns": 100.0})
    starts = _starts(Machine(hw, world=2))  # every rank's blocks in the same order
    assert sorted(starts.values()) == [100, 100, 107, 107, 114, 114, 121, 121]


def test_the_cores_of_a_mix_block_start_together():
    hw = aic_hw(**{"kernel.block_stagger_ns": 5.0, "kernel.launch_ns": 0.0})
    starts = _starts(mix_machine(hw), "mix_aic_1_2")
    blocks = {}
    for (_, label), t in starts.items():
        core = int(label.split()[0])
        blocks.setdefault(core // 3, set()).add(t)  # aic b, aiv 2b, aiv 2b+1: one block
    assert all(ts == {5.0 * b} for b, ts in blocks.items())


def _load_compute(stagger: float, iterations: int) -> list[float]:
    """Two cores, each `iterations` x (load ROW B from GM, wait, 10 ns of vector work).
    Port 100 GB/s, no latency, HBM 100 GB/s: a lone load takes 10 ns, two at once 20."""
    hw = round_hw(**{"chip.aiv_cores": 2, "kernel.block_stagger_ns": stagger,
                     "mte.gm_to_ub_gbps": 100.0, "mte.gm_to_ub_latency_ns": 0.0,
                     "hbm.bandwidth_gbps": 100.0})
    m = Machine(hw, world=1)
    m.ranks[0].tensor("x", 2 * iterations * ROW)
    ends = [0.0, 0.0]

    def program(ctx):
        buf = ctx.alloc("row", ROW)
        for i in range(iterations):
            yield from ctx.wait(ctx.copy_in(buf, ctx.tensor("x"),
                                            (ctx.core_id * iterations + i) * ROW, ROW))
            yield from ctx.wait(ctx.fixed("vector", "work", 10.0, reads=[buf]))
        ends[ctx.core_id] = ctx.t

    launch(m, program)
    return ends


def test_in_lockstep_every_load_shares_the_hbm():
    # 4 x (20 ns shared load + 10 ns work)
    assert _load_compute(0.0, 4) == pytest.approx([120.0, 120.0])


def test_a_stagger_of_one_load_lets_the_cores_alternate():
    # core 0 loads while core 1 works and back: 4 x 20 ns, core 1 10 ns behind
    assert _load_compute(10.0, 4) == pytest.approx([80.0, 90.0])
