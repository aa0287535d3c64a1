"""Calibration rows that quote a bandwidth (measured_gbps), rows that are predictions only
(use predict) and rows with preset keys of their own (hw.<key>): reading, simulating and
scoring them, and DeepEP's buffer.dispatch figure they are held to."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from npusim.calibrate import compare, read_table
from npusim.calibrate.simulate import row_doc, simulate_table
from npusim.errors import InputError
from npusim.kernels.deepep.family import buffer_dispatch_fields

ROOT = Path(__file__).resolve().parents[2]
HEAD = ("op,bs,h,k,ep_world_size,experts_per_rank,dtype,measured_us,measured_gbps,kernel,mode,"
        "quant,label,use,hw.window.bytes,run.wall_time_limit_s\n")
SMALL = "16,1024,4,4,4,bfloat16"


def _table(tmp: Path, *rows: str, head: str = HEAD) -> Path:
    p = tmp / "t.csv"
    p.write_text(head + "".join(r + "\n" for r in rows))
    return p


def test_a_bandwidth_row_reads_with_its_unit_use_and_own_preset_keys(tmp_path):
    rows = read_table(_table(
        tmp_path,
        f"dispatch,{SMALL},,146,deepep,normal,int8,d,fit,2147483648,7200",
        f"combine,{SMALL},,81,deepep,normal,int8,c,predict,,",
        f"dispatch,{SMALL},132,,deepep,low_latency,int8,ll,,,",
    ))
    assert [(m.unit, m.measured, m.use) for m in rows] == [
        ("gbps", 146.0, "fit"), ("gbps", 81.0, "predict"), ("us", 132.0, "fit")]
    assert rows[0].hardware == {"window.bytes": 2**31} and rows[1].hardware == {}
    assert rows[0].run == {"wall_time_limit_s": 7200} and rows[1].run == {}
    # the row's own keys reach its scenario; a fitted value of the same key would win
    doc = row_doc(rows[0], "atlas_a3", {"mte.put_gbps": 20.0})
    assert doc["hardware_overrides"] == {"window.bytes": 2**31, "mte.put_gbps": 20.0}
    assert doc["run"] == {"wall_time_limit_s": 7200} and "run" not in row_doc(rows[1], "x", {})


@pytest.mark.parametrize("row, key", [
    (f"dispatch,{SMALL},10,146,deepep,normal,int8,d,,", "row 2.measured_us"),
    (f"dispatch,{SMALL},,,deepep,normal,int8,d,,", "row 2.measured_us"),
    (f"dispatch,{SMALL},,nan,deepep,normal,int8,d,,", "row 2.measured_gbps"),
    (f"dispatch,{SMALL},,-3,deepep,normal,int8,d,,", "row 2.measured_gbps"),
    (f"dispatch,{SMALL},,146,deepep,normal,int8,d,always,", "row 2.use"),
    (f"dispatch,{SMALL},,146,deepep,normal,int8,d,,inf", "row 2.hw.window.bytes"),
    (f"dispatch,{SMALL},,146,deepep,normal,int8,d,,,x", "row 2.run.wall_time_limit_s"),
    # the low-latency kernels are timed in us: no bandwidth figure to hold a GB/s row to
    (f"dispatch,{SMALL},,146,deepep,low_latency,int8,d,,", "row 2.measured_gbps"),
])
def test_a_bad_measured_use_or_preset_cell_is_refused_naming_it(tmp_path, row, key):
    with pytest.raises(InputError) as exc:
        read_table(_table(tmp_path, row))
    assert key in str(exc.value) and "\n" not in str(exc.value)


def test_a_table_needs_a_measured_column(tmp_path):
    head = HEAD.replace("measured_us,measured_gbps,", "")
    with pytest.raises(InputError, match="measured_us or measured_gbps"):
        read_table(_table(tmp_path, f"dispatch,{SMALL},deepep,normal,int8,d,,", head=head))


def test_a_bandwidth_row_is_scored_on_its_kernels_figure(tmp_path, monkeypatch):
    """The simulated value of a GB/s row is the op's bandwidth figure, of a us row its
    latency; a run that gives no figure scores NaN, which no tolerance passes."""
    import npusim.calibrate.simulate as cal

    rows = read_table(_table(
        tmp_path,
        f"dispatch,{SMALL},,100,deepep,normal,int8,d,,",
        f"combine,{SMALL},,80,deepep,normal,int8,c,,",
    ))

    def fake(job):
        op = job[0]["workload"]["op"]
        if op == "dispatch":  # dispatch_layout, notify_dispatch, dispatch
            return [(5.0, {}), (40.0, {}), (3000.0, {"bottleneck_bandwidth_gbps": 110.0})]
        return [(4000.0, {})]  # no figure

    monkeypatch.setattr(cal, "simulate_row", fake)
    got = simulate_table(rows, "atlas_a3", {}, "t", workers=1)
    assert got[0] == 110.0 and math.isnan(got[1])
    errs = compare(rows, got).errors()
    assert errs[0] == pytest.approx(0.10)  # (110 - 100) / 100: the bandwidth's error
    assert not abs(errs[1]) <= 0.5


def _run(op: str, start: float, end: float, fields: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(op=op, start_ns=start, end_ns=end, family_fields=dict(fields or {}))


def test_buffer_dispatch_adds_notify_dispatch_to_the_dispatch_kernel():
    """test_intranode's bandwidth: rank 0's recv_x bytes over buffer.dispatch, which is
    notify_dispatch and the dispatch kernel. Hand arithmetic: 1000 rows of H 7168 in BF16
    are 14,336,000 B; over 40 + 100 us that is 102.4 GB/s."""
    recv = [1000 * 7168 * 2, 999 * 7168 * 2]
    runs = [_run("dispatch_layout", 0, 5_000), _run("notify_dispatch", 5_000, 45_000),
            _run("dispatch", 45_000, 145_000, {"intranode_bytes": recv,
                                               "bottleneck_bandwidth_gbps": 143.36}),
            _run("combine", 145_000, 245_000)]
    out = buffer_dispatch_fields(runs)
    assert out[0] == out[1] == out[3] == {}
    assert out[2]["bottleneck_bandwidth_gbps"] == pytest.approx(102.4)
    assert out[2]["buffer_dispatch_us"] == pytest.approx(140.0)
    assert out[2]["kernel_bandwidth_gbps"] == 143.36  # the kernel's own, kept


def test_a_run_reports_the_buffer_dispatch_bandwidth(tmp_path):
    """End to end on a small normal-mode run: the dispatch's figure is rank 0's received
    (token, expert) selections x 2 H bytes (counted here from the routing with numpy) over
    notify_dispatch's and the dispatch's durations in the report."""
    from npusim.kernels.deepep.family import FAMILY
    from npusim.scenario import load_scenario
    from npusim.sim import simulate
    from tests.kernels.deepep.deepephelp import write_scenario

    base = {"bs": 16, "h": 1024, "k": 4, "ep_world_size": 4, "experts_per_rank": 4}
    sc = load_scenario(write_scenario(tmp_path, base, "atlas_a3", "d", 3, quant="int8"))
    res = simulate(sc)
    w = sc.workload
    inputs = FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 3},
                                True)
    ids = np.concatenate([a["topk_idx"].reshape(-1) for a in inputs])
    rank0_rows = int(np.count_nonzero((ids >= 0) & (ids < 4)))  # experts 0-3 live on rank 0
    ops = {op.op: op for op in res.ops}
    ns = sum(ops[k].end_ns - ops[k].start_ns for k in ("notify_dispatch", "dispatch"))
    fields = ops["dispatch"].family_fields
    assert fields["recv_x_rows"][0] == rank0_rows
    assert fields["bottleneck_bandwidth_gbps"] == pytest.approx(rank0_rows * 2 * 1024 / ns,
                                                                abs=0.01)


def test_validate_reports_a_gbps_table_and_fails_a_missing_figure(tmp_path):
    """`npusim validate` on a GB/s table: its unit in the text and the JSON, and a
    prediction row marked; exit 1 when a row is outside its tolerance."""
    table = _table(tmp_path, f"dispatch,{SMALL},,1e6,deepep,normal,int8,far,predict,")
    cmd = [sys.executable, "-m", "npusim", "validate", "--hardware", "atlas_a3", "--table",
           str(table), "--workers", "1"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    text = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert text.returncode == 1, text.stderr
    assert "GB/s" in text.stdout and "a prediction" in text.stdout
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env,
                        cwd=tmp_path)
    row = json.loads(js.stdout)["rows"][0]
    assert row["unit"] == "GB/s" and row["measured_gbps"] == 1e6 and row["use"] == "predict"
    assert row["simulated_gbps"] < 1e6 and not json.loads(js.stdout)["ok"]


def test_a_shipped_table_is_found_by_name(tmp_path):
    from npusim.cli.tables import _table_path

    assert _table_path("atlas_a3_normal").name == "atlas_a3_normal.csv"
    assert _table_path("atlas_a3_normal").is_file()
    # the shipped normal table: EP 8-32 to fit, EP 64 and 128 predictions only
    rows = read_table(_table_path("atlas_a3_normal"))
    assert {m.workload["ep_world_size"]: m.use for m in rows} == {
        8: "fit", 16: "fit", 32: "fit", 64: "predict", 128: "predict"}
    assert all(m.unit == "gbps" and m.hardware == {"window.bytes": 2**31} for m in rows)
    mine = tmp_path / "atlas_a3_normal"  # a file of that name in the folder comes first
    mine.write_text("x")
    import os
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert _table_path("atlas_a3_normal") == Path("atlas_a3_normal")
    finally:
        os.chdir(here)
