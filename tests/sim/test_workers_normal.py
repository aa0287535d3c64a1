"""workers = 2 with DeepEP's normal mode: the combine, the longest leg, is simulated in a
forked process on the reference dispatch while layout, notify and dispatch run, and the run
is that of workers = 1 byte for byte; a reference the simulated dispatch does not match
makes the combine run again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim import sim
from npusim.hw.memory import RowTable
from npusim.kernels.deepep.normal import NORMAL
from npusim.scenario import load_scenario
from npusim.sim import simulate
from tests.kernels.deepep.deepephelp import write_scenario
from tests.sim.test_workers import _everything

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

TINY = {"bs": 16, "h": 1024, "k": 4, "ep_world_size": 4, "experts_per_rank": 4}


def _scenario(tmp: Path, **workload: Any) -> Any:
    return load_scenario(write_scenario(tmp, TINY, "atlas_a3", "normal", 3, **workload))


@pytest.mark.parametrize("workload", [
    pytest.param({}, id="bf16"),
    pytest.param({"quant": "int8"}, id="int8"),
    pytest.param({"timing_only": True}, id="timing-only"),
    pytest.param({"timing_only": True, "quant": "int8"}, id="timing-only-int8"),
    pytest.param({"context": "shmem"}, id="shmem"),
    pytest.param({"context": "shmem", "timing_only": True, "quant": "int8"},
                 id="shmem-timing-only-int8"),
])
def test_normal_combine_ahead_is_kept_and_identical(tmp_path: Path, workload: dict) -> None:
    sc = _scenario(tmp_path, **workload)
    alone = simulate(sc, detailed_trace=True)
    seen: list[str] = []
    ahead = simulate(sc, detailed_trace=True, workers=2, progress=seen.append)
    combine = sc.workload.family.runs["dispatch_combine"][3]
    assert alone.combine_ahead == ""
    assert ahead.combine_ahead == "kept"
    assert seen[0].endswith(f"; {combine} simulated ahead in a second process")
    assert seen[3] == combine
    assert _everything(ahead) == _everything(alone)


def test_other_dispatch_rows_make_the_normal_combine_run_again(tmp_path: Path,
                                                               monkeypatch: Any) -> None:
    """The forked combine assumes a dispatch with one received byte changed: the run must
    not keep it."""
    sc = _scenario(tmp_path)
    alone = simulate(sc)
    true_reference = type(NORMAL)._reference_dispatch

    def off_by_one_byte(self: Any, t: Any, inputs: Any) -> Any:
        outs = true_reference(self, t, inputs)
        outs[1]["recv_x"].view(np.uint8)[0, 0] ^= 0x40
        return outs

    monkeypatch.setattr(type(NORMAL), "_reference_dispatch", off_by_one_byte)
    ahead = simulate(sc, workers=2)
    assert ahead.combine_ahead.startswith("redone: the simulated dispatch wrote")
    assert _everything(ahead) == _everything(alone)


def test_rows_past_the_received_count_do_not_redo_the_combine(tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    """The combine reads x up to ep_recv_count[E - 1] (selfSendCnt): a reference dispatch
    that differs only in a padding row past it keeps the forked combine."""
    sc = _scenario(tmp_path)
    alone = simulate(sc)
    true_reference = type(NORMAL)._reference_dispatch

    def padding_changed(self: Any, t: Any, inputs: Any) -> Any:
        outs = true_reference(self, t, inputs)
        outs[1]["recv_x"].view(np.uint8)[-1, 0] ^= 0x40  # the last allocated row
        return outs

    monkeypatch.setattr(type(NORMAL), "_reference_dispatch", padding_changed)
    ahead = simulate(sc, workers=2)
    assert ahead.combine_ahead == "kept"
    assert _everything(ahead) == _everything(alone)


def test_a_timing_only_int8_combine_reads_zero_rows_it_never_holds(tmp_path: Path) -> None:
    """Timing-only INT8: the combine's x (per_token_cast_back of zero rows) is a tensor of
    zero rows that takes no memory, whatever its allocated size."""
    sc = _scenario(tmp_path, timing_only=True, quant="int8")
    t, fam = sc.tiling, sc.workload.family
    inputs = sim.load_inputs(sc)
    combine = fam.runs["dispatch_combine"][3]
    got = fam.op_inputs(combine, t, inputs, fam.reference_outputs(
        fam.runs["dispatch_combine"][2], t, inputs))
    for arrays in got:
        x = arrays["x"]
        assert isinstance(x, RowTable) and x.pick.size == 0 and x.table.size == 0
        assert (x.rows, x.row_bytes) == (t.rows_capacity, 2 * t.H)  # bf16 rows
