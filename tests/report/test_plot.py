"""npusim plot: figures from a sweep CSV and from a report (matplotlib, Agg backend)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from npusim.cli import main
from npusim.errors import InputError

pytest.importorskip("matplotlib")

from npusim.report.plot import _phase_durations, plot_sweep  # noqa: E402

CSV = ("point,workload.bs,op,latency_us,send_data_start_us,send_data_end_us,"
       "local_copy_start_us,local_copy_end_us\n"
       "p-0,1,dispatch,10.0,1.0,6.0,2.0,10.0\n"
       "p-1,8,dispatch,20.0,1.0,15.0,2.0,20.0\n")


def test_stacked_phase_shares_add_up_to_the_latency():
    row = {"send_data_end_us": "6.0", "local_copy_end_us": "10.0"}
    assert _phase_durations(row, ["send_data", "local_copy"]) == [6.0, 4.0]


def test_sweep_figure_is_a_png(tmp_path):
    src = tmp_path / "results.csv"
    src.write_text(CSV)
    out = plot_sweep(src, "workload.bs", tmp_path / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_axis_is_an_input_error(tmp_path):
    src = tmp_path / "results.csv"
    src.write_text(CSV)
    with pytest.raises(InputError) as info:
        plot_sweep(src, "workload.h", tmp_path / "f.png")
    assert info.value.key == "--axis" and "workload.bs" in str(info.value)


def test_report_figure_from_the_cli(tmp_path):
    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\nworkload: {op: dispatch, bs: 4, h: 1024, k: 2, ep_world_size: 2,"
                    " experts_per_rank: 2, timing_only: true}\n")
    assert main(["run", str(scen), "--out", str(tmp_path / "r")]) == 0
    assert main(["plot", str(tmp_path / "r" / "report.json"), "--out",
                 str(tmp_path / "r.png")]) == 0
    assert Path(tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(tmp_path / "missing.json")]) == 2


def test_published_points_overlay_a_tables_rows_by_op_and_quant(tmp_path):
    """`npusim plot --published TABLE`: the command reads the table's measured rows (the
    report layer reads no table) and overlays each (op, quant) at its BS."""
    from npusim.cli.sweeps import _published_points

    table = tmp_path / "t.csv"
    table.write_text("op,bs,h,k,ep_world_size,experts_per_rank,dtype,dispatch_quant,"
                     "combine_quant,measured_us,source\n"
                     "dispatch,8,7168,8,8,4,float16,none,none,17.1,paper\n"
                     "dispatch,256,7168,8,8,4,float16,none,none,170,paper\n"
                     "combine,8,7168,8,8,4,float16,none,int8,18.8,paper\n")
    marks = _published_points(table)
    assert marks[("dispatch", "none")] == [(8.0, 17.1), (256.0, 170.0)]
    assert marks[("combine", "int8")] == [(8.0, 18.8)]
    src = tmp_path / "results.csv"
    src.write_text(CSV)
    assert main(["plot", str(src), "--published", str(table), "--out",
                 str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_panels_keep_the_sweeps_order_and_wrap_into_rows(tmp_path):
    """Ten series (more than a row holds) in the order the sweep gives them, not sorted;
    `--logx` draws sizes that double on a log2 axis."""
    from npusim.report.plot import MAX_COLUMNS, _panels

    names = [f"s{9 - i}" for i in range(10)]
    lines = ["point,table,workload.block_bytes,op,latency_us,put_start_us,put_end_us"]
    for i, name in enumerate(names):
        for j, block in enumerate((16384, 2097152)):
            lines.append(f"p-{2 * i + j},{name},{block},put,{100 - j},1.0,{100 - j}")
    src = tmp_path / "results.csv"
    src.write_text("\n".join(lines) + "\n")
    rows = list(csv.DictReader(src.open()))
    assert [g for _, g in _panels(rows, "table")] == names
    assert len(names) > MAX_COLUMNS
    assert main(["plot", str(src), "--axis", "workload.block_bytes", "--group", "table",
                 "--logx", "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
