"""A leg's machine is a reference cycle: it must be gone before the next leg is built (so the
peak holds one machine), whether the next leg runs in the same run or in a later one."""

from __future__ import annotations

import weakref

import npusim.sim as sim
from npusim import api


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
