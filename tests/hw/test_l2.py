"""The die's write-back L2 (npusim.hw.l2): GM writes that fit in it cross no HBM during
the kernel; once the kernel's lines exceed it, writes cross the HBM (hand arithmetic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npusim.hw.config import load_hardware
from npusim.hw.l2 import L2
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch

ROOT = Path(__file__).resolve().parents[2]
ROW = 8192  # bytes each core writes
# four cores, free issue, a 100 GB/s MTE3 port (8192 B in 81.92 ns) and a 10 GB/s HBM
FLAT = {"chip.aiv_cores": 4, "scalar.cycles_per_op": 0.0, "scalar.loop_cycles": 0.0,
        "kernel.launch_ns": 0.0, "kernel.block_stagger_ns": 0.0,
        "mte.ub_to_gm_gbps": 100.0, "mte.ub_to_gm_latency_ns": 0.0,
        "hbm.bandwidth_gbps": 10.0}


def test_lines_allocated_by_reads_and_writes_share_the_room():
    l2 = L2(100)
    assert l2.write(60)  # 60 of 100
    l2.read(30)  # 90: a read miss fills lines too
    assert not l2.write(20)  # 110 > 100: crosses the HBM
    assert (l2.allocated, l2.absorbed) == (110, 60)
    assert not L2(0).write(1)  # no L2 modelled: every write crosses the HBM


def _write_rows(l2_bytes: int) -> tuple[list[float], int]:
    m = Machine(load_hardware("ascend950", {**FLAT, "l2.bytes": l2_bytes}), world=1)
    m.ranks[0].tensor("y", 4 * ROW)
    done: list[float] = []

    def program(ctx):
        buf = ctx.alloc("row", ROW)
        ctx.ub_write(buf, 0, np.ones(ROW // 4, np.float32), ops=0)
        op = ctx.copy_out(ctx.tensor("y"), ctx.core_id * ROW, buf, ROW)
        yield from ctx.wait(op)
        done.append(op.done_at)

    launch(m, program)
    return sorted(done), m.ranks[0].l2.absorbed


def test_writes_that_fit_cost_only_the_port():
    done, absorbed = _write_rows(1 << 20)
    assert done == pytest.approx([ROW / 100.0] * 4)  # 81.92 ns each, in parallel
    assert absorbed == 4 * ROW


def test_without_an_l2_the_writes_share_the_hbm():
    done, absorbed = _write_rows(0)
    assert done == pytest.approx([4 * ROW / 10.0] * 4)  # 32 KiB at 10 GB/s: 3276.8 ns
    assert absorbed == 0


def test_writes_past_the_room_cross_the_hbm():
    """Room for two rows: the first two writes stay in the L2 (81.92 ns), the other two
    share the 10 GB/s HBM (5 GB/s each: 1638.4 ns)."""
    done, absorbed = _write_rows(2 * ROW)
    assert done == pytest.approx([ROW / 100.0] * 2 + [ROW / 5.0] * 2)
    assert absorbed == 2 * ROW


def test_the_report_says_how_many_write_bytes_the_l2_held(tmp_path):
    """GeLU on one core writes 409600 fp32 results; with the 950's 128 MiB L2 every one is
    held, with no L2 none is, and the summary line goes."""
    import json

    from npusim.cli import main

    scenario = str(ROOT / "scenarios" / "examples" / "gelu_vf.yaml")
    for l2_bytes, held in ((None, 409600 * 4), (0, 0)):
        out = tmp_path / f"l2_{l2_bytes}"
        args = ["run", scenario, "--out", str(out), "--quiet"]
        if l2_bytes is not None:
            args += ["--set", f"hardware_overrides.l2.bytes={l2_bytes}"]
        assert main(args) == 0
        op = json.loads((out / "report.json").read_text())["ops"][0]
        assert op["l2_held_bytes_total"] == held
        assert [r["l2_held_bytes"] for r in op["ranks"]][0] == held
        assert ("held by the L2" in (out / "report.md").read_text()) == bool(held)
