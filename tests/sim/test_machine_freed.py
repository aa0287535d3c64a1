"""A leg's machine must be gone before the next leg is built (so the peak holds one machine),
whether the next leg runs in the same run or in a later one; run_op breaks its reference
cycles, so reference counting frees it when the op is over, without a full collection."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import npusim.sim as sim
from npusim import api
from npusim.runtime.context import KernelContext


def _recording_machines(monkeypatch) -> list[tuple[weakref.ref, int]]:
    """Each Machine built, with how many earlier machines were still alive at that moment."""
    built: list[tuple[weakref.ref, int]] = []
    real = sim.Machine

    def build(*args, **kwargs):
        alive = sum(ref() is not None for ref, _ in built)
        m = real(*args, **kwargs)
        built.append((weakref.ref(m), alive))
        return m

    monkeypatch.setattr(sim, "Machine", build)
    return built


def test_each_leg_starts_with_no_earlier_machine_alive(monkeypatch) -> None:
    built = _recording_machines(monkeypatch)
    sc = api.load("dispatch_bs8_none", set={"workload.op": "dispatch_combine"})
    sim.simulate(sc, workers=1)
    sim.simulate(sc, workers=1)
    assert len(built) == 4  # two legs per run, two runs
    assert [alive for _, alive in built] == [0, 0, 0, 0]


@contextmanager
def _collector_off() -> Iterator[None]:
    """The cyclic collector paused, and restored as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run_without_collections(monkeypatch, sc, **kw) -> list[tuple[weakref.ref, int]]:
    """simulate() with the cyclic collector off and gc.collect refused: whatever is freed
    is freed by reference counting."""
    built = _recording_machines(monkeypatch)

    def refuse() -> int:
        raise AssertionError("a full collection ran")

    monkeypatch.setattr(sim.gc, "collect", refuse)
    with _collector_off():
        sim.simulate(sc, workers=1, **kw)
    return built


@pytest.mark.parametrize(("name", "op", "detailed"), [
    ("dispatch_bs8_none", "dispatch_combine", False),  # two legs, AIV cores
    ("dispatch_bs8_none", "dispatch_combine", True),  # the link observer is the machine's
    ("mix_gemm", None, False),  # a MIX launch: each context is in its block's list
    ("frameworks/pypto_a3_w16_bs8", None, False),  # each context has a shmem view of its own
])
def test_reference_counting_frees_every_machine(monkeypatch, name, op, detailed) -> None:
    sc = api.load(name, set={"workload.op": op} if op else None)
    built = _run_without_collections(monkeypatch, sc, detailed_trace=detailed)
    assert built
    assert [ref() for ref, _ in built] == [None] * len(built)


def test_a_machine_left_in_a_cycle_is_still_collected_before_the_next_leg(monkeypatch) -> None:
    """run_op breaks the cycles of an op that finished; a machine whose cycles stay (here:
    its contexts', through their data caches, kept on purpose) is collected before the next
    leg is built."""
    monkeypatch.setattr(KernelContext, "release", lambda self: None)
    built = _recording_machines(monkeypatch)
    with _collector_off():
        sc = api.load("dispatch_bs8_none", set={"workload.op": "dispatch_combine"})
        sim.simulate(sc, workers=1)
    assert [alive for _, alive in built] == [0, 0]
