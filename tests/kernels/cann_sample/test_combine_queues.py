"""The combine's two-slot queues (docs/kernels/cann_sample.md, "Combine"), checked on
the detailed trace of one receiving core: loads run ahead of the vector unit, and a slot
is refilled only after the vector unit has finished with it."""

from __future__ import annotations

from npusim.sim import simulate
from tests.kernels.cann_sample.samplehelp import scenario


def _receive_spans(tmp_path, combine_quant: str):
    sc = scenario(tmp_path, op="combine", bs=1, k=6, ep_world_size=2, experts_per_rank=4,
                  dispatch_quant="none", combine_quant=combine_quant)
    run = simulate(sc, detailed_trace=True).ops[0]
    on_core = [s for s in run.spans if s.rank == 0 and s.core == 0]
    loads = sorted((s for s in on_core if s.lane == "mte2" and s.name == "load_slot"),
                   key=lambda s: s.start_ns)
    adds = sorted((s for s in on_core if s.lane == "vector" and s.name == "weighted_add"),
                  key=lambda s: s.start_ns)
    return loads, adds


def test_receive_loads_run_ahead_and_wait_for_their_slot(tmp_path):
    for quant in ("none", "int8"):
        loads, adds = _receive_spans(tmp_path, quant)
        assert len(loads) == len(adds) == 6, quant
        # the second row is fetched while the first is still in flight (no scalar wait)
        assert loads[1].start_ns < loads[0].delivered_ns, quant
        for j in range(2, 6):
            # row j reuses the slot of row j-2: only once the vector unit is done with it
            assert loads[j].start_ns >= adds[j - 2].end_ns - 1e-9, (quant, j)
            # ... and its load is already under way before row j-1 is summed
            assert loads[j].start_ns < adds[j - 1].end_ns, (quant, j)
        # every sum starts only after its row has landed
        for j in range(6):
            assert adds[j].start_ns >= loads[j].delivered_ns - 1e-9, (quant, j)
