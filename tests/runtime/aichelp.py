"""Helpers for the AIC / MIX tests: a round-number machine whose AIC figures are round
too, so every expected time is hand arithmetic."""

from __future__ import annotations

from npusim.hw.cores import MIX_AIC_1_2
from npusim.hw.machine import Machine
from tests.conftest import round_hw

# 1 GHz (conftest), so cycles are ns; the preset's rates in B/cycle are GB/s
AIC_ROUND = {
    "aic__mte2_latency_ns": 100.0,
    "aic__mte1_issue_cycles": 10.0,
    "aic__cube_issue_cycles": 20.0,
    "aic__fixpipe_latency_ns": 100.0,
    "aic__flag_ns": 100.0,
}


def aic_hw(**extra: float):
    return round_hw(**{**AIC_ROUND, **extra})


def mix_machine(hw, world: int = 1) -> Machine:
    return Machine(hw, world, kinds=(MIX_AIC_1_2,))
