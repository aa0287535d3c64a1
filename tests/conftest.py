"""Shared fixtures: small, round-number hardware so expected times are hand arithmetic."""

from __future__ import annotations

import pytest

from npusim.hw.config import HardwareConfig, load_hardware

ROUND = {
    "chip.clock_ghz": 1.0,
    "chip.aiv_cores": 4,
    "scalar.cycles_per_op": 0.0,
    "scalar.loop_cycles": 0.0,
    "vector.issue_cycles": 0.0,
    "vector.cycles_per_repeat": 1.0,
    "vector.vf_cycles_per_instr": 1.0,
    "mte.gm_to_ub_gbps": 10.0,
    "mte.ub_to_gm_gbps": 10.0,
    "mte.put_gbps": 10.0,
    "mte.gm_to_ub_latency_ns": 100.0,
    "mte.ub_to_gm_latency_ns": 100.0,
    "mte.put_latency_ns": 200.0,
    "hbm.bandwidth_gbps": 1000.0,
    "fabric.egress_gbps": 1000.0,
    "fabric.ingress_gbps": 1000.0,
    "fabric.link_latency_ns": 50.0,
    "sync.syncall_ns": 70.0,
    "sync.poll_cycles": 0.0,
    "kernel.launch_ns": 0.0,
    "kernel.block_stagger_ns": 0.0,
}


def round_hw(**extra: float) -> HardwareConfig:
    """ascend950 with round numbers (1 GHz, 10 GB/s ports, zero issue costs)."""
    overrides = dict(ROUND)
    overrides.update({k.replace("__", "."): v for k, v in extra.items()})
    return load_hardware("ascend950", overrides)


@pytest.fixture
def hw() -> HardwareConfig:
    return round_hw()
