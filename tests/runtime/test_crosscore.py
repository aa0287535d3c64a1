"""CrossCoreSetFlag / CrossCoreWaitFlag in a MIX launch: counters per (core, id) as Ascend
C documents them, the modes' targets, the set's pipe order, and a wait nothing satisfies
reported as a deadlock (tests/runtime/aichelp.py: 1 GHz, aic.flag_ns 100, issue slots free)."""

from __future__ import annotations

import pytest

from npusim.errors import DeadlockError, KernelError
from npusim.hw.config import load_hardware
from npusim.runtime.launch import launch
from tests.runtime.aichelp import aic_hw, mix_machine


def _block0(aic=None, aiv0=None, aiv1=None):
    def program(ctx):
        if ctx.block_idx != 0:
            return
        role = ctx.core.kind.name if ctx.core.kind.name == "aic" else f"aiv{ctx.sub_block_idx}"
        body = {"aic": aic, "aiv0": aiv0, "aiv1": aiv1}[role]
        if body is not None:
            with ctx.phase(role):
                yield from body(ctx)
    return program


def test_mode_4_aiv1s_id_reaches_the_aic_as_id_plus_16_after_its_pipe():
    t = {}

    def aiv1(ctx):
        buf = ctx.alloc("x", 256)
        ctx.fixed("vector", "work", 500.0, writes=[buf])
        ctx.cross_core_set_flag(4, 2, "vector")  # lands when the vector op is done
        yield from ()

    def aiv0(ctx):
        ctx.cross_core_set_flag(4, 2)  # AIV0's id 2 is the AIC's id 2, not 18
        yield from ()

    def aic(ctx):
        yield from ctx.cross_core_wait_flag(2)
        t["id2"] = ctx.t
        yield from ctx.cross_core_wait_flag(18)
        t["id18"] = ctx.t

    launch(mix_machine(aic_hw()), _block0(aic, aiv0, aiv1))
    assert t["id2"] == pytest.approx(100.0)  # set at 0 on the scalar pipe, + flag_ns
    assert t["id18"] == pytest.approx(500.0 + 100.0)  # the vector op's end, + flag_ns


def test_mode_4_the_aics_ids_16_26_reach_aiv1():
    t = {}

    def aic(ctx):
        ctx.cross_core_set_flag(4, 16 + 3)
        ctx.cross_core_set_flag(4, 3)
        yield from ()

    def aiv(ctx):
        yield from ctx.cross_core_wait_flag(3)
        t[ctx.sub_block_idx] = ctx.t

    launch(mix_machine(aic_hw()), _block0(aic, aiv, aiv))
    assert t == {0: pytest.approx(100.0), 1: pytest.approx(100.0)}


def test_a_counter_counts_sets_and_a_wait_takes_one():
    t = {}

    def aic(ctx):
        for _ in range(2):
            ctx.cross_core_set_flag(4, 5)
        buf = ctx.alloc("l0c", 1024, "l0c")
        ctx.fixed("cube", "mm", 1000.0, writes=[buf])
        ctx.cross_core_set_flag(4, 5, "cube")
        yield from ()

    def aiv0(ctx):
        for i in range(3):
            yield from ctx.cross_core_wait_flag(5)
            t[i] = ctx.t

    launch(mix_machine(aic_hw()), _block0(aic, aiv0))
    # two sets at 0 (both landed at 100), the third after the cube's 1000 ns
    assert [t[0], t[1], t[2]] == pytest.approx([100.0, 100.0, 1100.0])


def test_mode_2_the_aic_waits_for_both_aivs():
    t = {}

    def aiv0(ctx):
        ctx.cross_core_set_flag(2, 1, "mte3")  # nothing on MTE3: lands after flag_ns
        yield from ()

    def aiv1(ctx):
        buf = ctx.alloc("x", 256)
        ctx.fixed("vector", "work", 300.0, writes=[buf])
        ctx.cross_core_set_flag(2, 1, "vector")
        yield from ()

    def aic(ctx):
        yield from ctx.cross_core_wait_flag(1)
        t["aic"] = ctx.t

    hw = load_hardware("atlas_a3", {"chip.clock_ghz": 1.0, "chip.aiv_cores": 4,
                                    "scalar.cycles_per_op": 0.0, "kernel.launch_ns": 0.0,
                                    "aic.flag_ns": 100.0})
    launch(mix_machine(hw), _block0(aic, aiv0, aiv1))
    assert t["aic"] == pytest.approx(300.0 + 100.0)  # the later of the two, + flag_ns


def test_mode_4_is_the_950s_only():
    hw = load_hardware("atlas_a3", {"chip.aiv_cores": 4})

    def aic(ctx):
        ctx.cross_core_set_flag(4, 1)
        yield from ()

    with pytest.raises(KernelError, match=r"mode 4: preset atlas_a3 has modes 0, 1, 2"):
        launch(mix_machine(hw), _block0(aic))

    def on_pipe_s(ctx):
        ctx.cross_core_set_flag(2, 1)
        yield from ()

    with pytest.raises(KernelError, match=r"PIPE_S: preset atlas_a3 does not take it"):
        launch(mix_machine(hw), _block0(on_pipe_s))


@pytest.mark.parametrize("role,flag", [("aiv0", 11), ("aiv0", 16), ("aic", 27)])
def test_a_flag_id_outside_its_range_is_an_error(role, flag):
    def body(ctx):
        ctx.cross_core_set_flag(4, flag)
        yield from ()

    with pytest.raises(KernelError, match=rf"flag id {flag} is outside"):
        launch(mix_machine(aic_hw()), _block0(**{role: body}))


def test_more_than_15_pending_sets_is_an_error():
    def aic(ctx):
        for _ in range(16):
            ctx.cross_core_set_flag(4, 0)
        yield from ()

    with pytest.raises(KernelError, match=r"at most 15") as info:
        launch(mix_machine(aic_hw()), _block0(aic))
    assert info.value.core == "0 (aic 0)"


def test_a_wait_nothing_will_satisfy_is_a_deadlock_naming_the_flag():
    def aiv1(ctx):
        ctx.cross_core_set_flag(4, 2)  # reaches the AIC as 18
        yield from ()

    def aic(ctx):
        yield from ctx.cross_core_wait_flag(18)
        yield from ctx.cross_core_wait_flag(2)  # AIV0 never sets 2

    with pytest.raises(DeadlockError) as info:
        launch(mix_machine(aic_hw()), _block0(aic, None, aiv1))
    text = str(info.value)
    assert "deadlock at 0.100 us" in text
    assert "1 of 6 cores blocked" in text
    assert "CrossCoreWaitFlag(2) by the aic, counter 0" in text
    assert "set by AIV0's CrossCoreSetFlag<4>(2)" in text
    assert info.value.blocked[0].startswith("rank 0 core 0 (aic 0) in step 'aic'")


def test_mode_0_releases_every_aiv_once_all_have_set():
    t = {}

    def program(ctx):
        if ctx.core.kind.name != "aiv":
            return
        buf = ctx.alloc("x", 256)
        ctx.fixed("vector", "work", 100.0 * ctx.kind_index, writes=[buf])
        ctx.cross_core_set_flag(0, 7, "vector")
        yield from ctx.cross_core_wait_flag(7)
        t[ctx.kind_index] = ctx.t

    launch(mix_machine(aic_hw()), program)
    # four AIVs (2 blocks); the last sets when its 300 ns of work ends
    assert t == {i: pytest.approx(300.0 + 100.0) for i in range(4)}
