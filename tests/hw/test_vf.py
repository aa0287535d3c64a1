"""The VF unit's timing and MemBase fusion (npusim/hw/vf.py), against hand arithmetic."""

from __future__ import annotations

import pytest

from npusim.hw.vf import (
    BARRIER,
    VF,
    Call,
    Operand,
    VFTiming,
    VLoop,
    fuse,
    membase_vf,
    membase_vfs,
    vi,
)

T = VFTiming(call_cycles=100, latency_cycles=2, pair_issue=2, loads_per_cycle=1,
             stores_per_cycle=1)
F32 = 4


def gelu_body() -> tuple:
    """gelu_with_vf.asc's loop body, one register per instruction."""
    return (vi("load", "x"), vi("mul", "c", "x", "x"), vi("mul", "c", "c", "x"),
            vi("muls", "t", "x"), vi("add", "c", "c", "t"), vi("muls", "c", "c"),
            vi("exp", "c", "c"), vi("adds", "c", "c"), vi("div", "y", "x", "c"),
            vi("store", None, "y"))


def test_gelu_vf_is_issue_bound_with_pairs_across_iterations() -> None:
    loop = VLoop(gelu_body(), 128)
    # two Mul, two Muls pair: 1 + 1; Add, Adds pair with the next iteration's: 0.5 + 0.5;
    # Exp and Div do not pair: 1 + 1  ->  5 cycles per iteration
    assert T.issue_cycles(loop) == pytest.approx(5.0)
    critical, recurrence = T.chains(loop)
    # load 2, mul 4, mul 6, add 8 (muls ready at 4), muls 10, exp 12, adds 14, div 16, store 18
    assert critical == pytest.approx(18.0)
    assert recurrence == 0.0
    assert T.cycles(VF("gelu", (loop,))) == pytest.approx(100 + 128 * 5 + 18)


def test_straight_line_code_pairs_only_within_itself() -> None:
    one = VLoop((vi("add", "a"), vi("mul", "b"), vi("mul", "c")), 1)
    assert T.issue_cycles(one) == pytest.approx(1 + 1)  # add alone, the two muls paired


def test_accumulator_bounds_each_iteration() -> None:
    body = (vi("load", "v"), vi("mul", "s", "v", "v"), vi("add", "acc", "acc", "s"))
    critical, recurrence = T.chains(VLoop(body, 64))
    assert recurrence == pytest.approx(2.0)  # the add waits for the previous add
    assert critical == pytest.approx(6.0)
    slow = VFTiming(0, 5, 2, 1, 1)
    assert slow.loop_cycles(VLoop(body, 64)) == pytest.approx(64 * 5 + 15)


def test_software_loop_does_not_overlap_iterations() -> None:
    body = (vi("load", "v"), vi("exp", "e", "v"), vi("store", None, "e"))
    assert T.loop_cycles(VLoop(body, 10, hardware=False)) == pytest.approx(10 * 6)
    assert T.loop_cycles(VLoop(body, 10)) == pytest.approx(10 * 1 + 6)


def test_counts_every_executed_instruction() -> None:
    vf = VF("v", (VLoop((vi("dup", "a"),)), VLoop(gelu_body(), 128)))
    assert vf.counts() == {"RVECEX": 1 + 8 * 128, "RVECLD": 128, "RVECST": 128}


def op(kind: str, dst: str, *srcs: str, n: int = 8192, size: int = F32) -> Call:
    return Call(kind, Operand(dst, size), tuple(Operand(s, size) for s in srcs), n)


def gelu_membase() -> list:
    """gelu_without_vf.asc's gelu_compute, barriers included."""
    return [BARRIER, op("mul", "cube", "x", "x"), BARRIER, op("mul", "cube", "cube", "x"),
            op("muls", "t", "x"), BARRIER, op("add", "cube", "cube", "t"), BARRIER,
            op("muls", "cube", "cube"), BARRIER, op("exp", "cube", "cube"), BARRIER,
            op("adds", "cube", "cube"), BARRIER, op("div", "y", "x", "cube"), BARRIER]


def test_barriers_split_and_calls_without_one_fuse() -> None:
    groups = fuse(gelu_membase(), 256)
    assert [len(g) for g in groups] == [1, 2, 1, 1, 1, 1, 1]
    fused = membase_vf(groups[1], 256)
    # x is loaded once for both calls; both results are stored
    assert fused.counts() == {"RVECEX": 2 * 128, "RVECLD": 2 * 128, "RVECST": 2 * 128}


def test_fused_chain_keeps_intermediates_in_registers() -> None:
    vf = membase_vf([op("muls", "r", "r"), op("adds", "r", "r"), op("sqrt", "r", "r")], 256)
    # one load, three operations, one store (the first two stores are overwritten)
    assert vf.counts() == {"RVECEX": 3 * 128, "RVECLD": 128, "RVECST": 128}


def test_different_control_flow_does_not_fuse() -> None:
    calls = [op("cast", "x32", "x16", n=8192), op("cast", "y8", "h16", n=8192, size=2)]
    assert len(fuse(calls, 256)) == 2  # 64 and 128 lanes
    assert len(fuse([op("mul", "a", "b"), op("mul", "a", "b", n=4096)], 256)) == 2
    red = [op("mul", "s", "x", "x"), op("reduce_sum", "r", "s"), op("muls", "s", "s")]
    assert [len(g) for g in fuse(red, 256)] == [1, 1, 1]


def test_gelu_membase_cycles_by_hand() -> None:
    vfs = membase_vfs(gelu_membase(), 256)
    total = sum(T.cycles(v) for v in vfs)
    # per register: mul 1 | mul+muls 2 (two loads, two stores) | add 2 (two loads) |
    # muls 1 | exp 1 | adds 1 | div 2 (two loads) = 10; fill load-op-store 6 per VF
    assert total == pytest.approx(7 * 100 + 128 * 10 + 7 * 6)


def test_broadcast_source_loads_once() -> None:
    c = Call("dup", Operand("rms", F32), (Operand("red", F32, first_only=True),), 8192)
    vf = membase_vf([c, op("muls", "rms", "rms")], 256)
    assert vf.counts() == {"RVECEX": 2 * 128, "RVECLD": 1, "RVECST": 128}
