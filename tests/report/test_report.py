"""Report building from hand-built spans: every number checked by hand arithmetic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from npusim.engine.trace import Span
from npusim.report.build import SCHEMA, build_report
from npusim.report.io import dumps_json, write_json_atomic, write_text_atomic
from npusim.report.summary import format_summary
from npusim.result import LinkStats, OpRun, RunResult


def P(rank: int, core: int, name: str, start: float, end: float) -> Span:  # noqa: N802
    return Span(rank, core, "phase", name, start, end)


def make_result() -> RunResult:
    # Op 1 (dispatch) starts at 1000 ns and ends at 21000 ns; three ranks, rank 2 idle.
    dispatch = OpRun(
        op="dispatch",
        start_ns=1000.0,
        end_ns=21000.0,
        ranks=3,
        cores_per_rank=2,
        spans=[
            P(0, 0, "send_data", 1000, 6000),
            P(0, 1, "send_data", 1500, 7000),
            P(1, 0, "send_data", 1200, 5000),
            P(0, 0, "wait_status", 6000, 9000),
            P(1, 1, "wait_status", 2000, 15500),
            P(0, 1, "local_copy", 9000, 12000),
            P(1, 0, "local_copy", 15500, 18000),
            P(1, 0, "local_copy", 3000, 4000.00004),  # same core twice: merged
            Span(1, 0, "mte3", "put", 1000, 20000, 4096),  # not a phase: ignored
        ],
        bytes_sent=[100, np.int64(200), 0],
        bytes_received=[150, 150, 0],
        links=[LinkStats("rank0.egress", "egress", 0, 1000.0, bytes=20000)],
    )
    # Op 2 (combine) has no spans at all: latency falls back to the op's duration.
    combine = OpRun(op="combine", start_ns=21000.0, end_ns=24500.0, ranks=2, cores_per_rank=2)
    return RunResult(
        scenario={"name": "hand", "workload": {"op": "dispatch_combine", "bs": 8}},
        hardware={"name": "ascend950", "chip": {"clock_ghz": 1.65, "aiv_cores": 2}},
        ops=[dispatch, combine],
        events=1234,
        wall_s=0.123456,
    )


def test_contract_top_level() -> None:
    rep = build_report(make_result())
    assert rep["schema"] == SCHEMA == "npusim.report/1"
    assert rep["scenario"]["name"] == "hand"
    assert rep["hardware"]["name"] == "ascend950"
    assert rep["sim"] == {"wall_s": 0.123, "events": 1234}
    assert [o["op"] for o in rep["ops"]] == ["dispatch", "combine"]


def test_phase_spans_and_latencies_by_hand() -> None:
    op = build_report(make_result())["ops"][0]
    r0, r1, r2 = op["ranks"]
    # rank 0: send_data over cores min 1000 max 7000 -> 0..6 us after op start (1000 ns)
    # busy = the busiest core's summed span time: send_data cores 0/1 ran 5.0/5.5 us
    assert r0["phases"] == {
        "send_data": {"start_us": 0.0, "end_us": 6.0, "busy_us": 5.5},
        "wait_status": {"start_us": 5.0, "end_us": 8.0, "busy_us": 3.0},
        "local_copy": {"start_us": 8.0, "end_us": 11.0, "busy_us": 3.0},
    }
    assert r0["latency_us"] == 11.0
    # core (1, 0) ran local_copy twice: 2500 + 1000.00004 ns busy, one span 2..17 us
    assert r1["phases"] == {
        "send_data": {"start_us": 0.2, "end_us": 4.0, "busy_us": 3.8},
        "wait_status": {"start_us": 1.0, "end_us": 14.5, "busy_us": 13.5},
        "local_copy": {"start_us": 2.0, "end_us": 17.0, "busy_us": 3.5},
    }
    assert r1["cores"][0]["phases"]["local_copy"] == {
        "start_us": 2.0, "end_us": 17.0, "busy_us": 3.5, "count": 2}
    assert r1["latency_us"] == 17.0
    # rank 2 recorded nothing: its latency is the op's duration
    assert r2["phases"] == {} and r2["latency_us"] == 20.0
    # op: min/max over ranks; latency = max over ranks (rank 2's fallback counts too)
    assert op["phases"] == {
        "send_data": {"start_us": 0.0, "end_us": 6.0, "busy_us": 5.5},
        "wait_status": {"start_us": 1.0, "end_us": 14.5, "busy_us": 13.5},
        "local_copy": {"start_us": 2.0, "end_us": 17.0, "busy_us": 3.5},
    }
    assert list(op["phases"]) == op["phase_order"] == ["send_data", "wait_status", "local_copy"]
    assert op["latency_us"] == 20.0
    assert op["duration_us"] == 20.0 and op["start_us"] == 1.0 and op["end_us"] == 21.0


def test_latency_is_max_over_ranks_with_spans() -> None:
    res = make_result()
    res.ops[0].ranks = 2  # drop the idle rank: latency is rank 1's last phase end
    op = build_report(res)["ops"][0]
    assert op["latency_us"] == 17.0
    assert op["critical"] == {"rank": 1, "core": 0, "phase": "local_copy"}


def test_per_core_bytes_and_links() -> None:
    op = build_report(make_result())["ops"][0]
    r0, r1, r2 = op["ranks"]
    assert [c["core"] for c in r0["cores"]] == [0, 1]
    assert r0["cores"][1]["phases"] == {
        "send_data": {"start_us": 0.5, "end_us": 6.0, "busy_us": 5.5, "count": 1},
        "local_copy": {"start_us": 8.0, "end_us": 11.0, "busy_us": 3.0, "count": 1},
    }
    assert (r0["bytes_sent"], r1["bytes_sent"], r0["bytes_received"]) == (100, 200, 150)
    assert type(r1["bytes_sent"]) is int
    assert op["bytes_sent_total"] == 300 and op["bytes_received_total"] == 300
    # 20000 B over the op's 20000 ns = 1 GB/s of a 1000 GB/s link
    assert op["links"] == [
        {
            "name": "rank0.egress",
            "kind": "egress",
            "rank": 0,
            "bandwidth_gbps": 1000.0,
            "bytes": 20000,
            "achieved_gbps": 1.0,
            "utilisation": 0.001,
        }
    ]


def test_op_without_spans() -> None:
    op = build_report(make_result())["ops"][1]
    assert op["latency_us"] == 3.5 and op["phases"] == {}
    assert [r["latency_us"] for r in op["ranks"]] == [3.5, 3.5]
    assert [r["bytes_sent"] for r in op["ranks"]] == [None, None]


def test_report_is_json_and_deterministic(tmp_path: Path) -> None:
    a = dumps_json(build_report(make_result()))
    b = dumps_json(build_report(make_result()))
    assert a == b and a.endswith("}\n")
    json.loads(a)  # strict JSON: no NaN, numpy types converted
    write_json_atomic(tmp_path / "r1.json", build_report(make_result()))
    write_json_atomic(tmp_path / "r2.json", build_report(make_result()))
    assert (tmp_path / "r1.json").read_bytes() == (tmp_path / "r2.json").read_bytes()


def test_summary_table() -> None:
    text = format_summary(build_report(make_result()))
    lines = text.splitlines()
    assert lines[0].startswith("scenario hand on ascend950")
    assert "dispatch: latency 20.000 us" in text
    assert "combine: latency 3.500 us" in text
    (row,) = [ln for ln in lines if ln.strip().startswith("wait_status")]
    # start min/max over ranks 1.0/5.0, end min/max 8.0/14.5, busiest core 13.5
    assert row.split()[1:] == ["1.000", "5.000", "8.000", "14.500", "13.500"]
    header = next(ln for ln in lines if "start min" in ln)
    assert len(row) == len(header) - len("   (us)")  # fixed width columns
    assert "1234 events" in text and "(no phase spans recorded)" in text


def test_atomic_writers(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "report.json"
    write_json_atomic(target, {"b": 1, "a": [1, 2]})
    assert target.read_text() == '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}\n'
    write_json_atomic(target, {"b": 1, "a": 2}, sort_keys=True)
    assert target.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    write_text_atomic(tmp_path / "x.txt", "hello\n")
    assert (tmp_path / "x.txt").read_text() == "hello\n"
    assert sorted(os.listdir(tmp_path / "sub")) == ["report.json"]  # no temp files left
    with pytest.raises(ValueError):
        write_json_atomic(target, {"x": float("nan")})
    assert target.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'  # old content intact
    assert sorted(os.listdir(tmp_path / "sub")) == ["report.json"]


def test_inline_leaves_keeps_small_records_on_one_line() -> None:
    doc = {"a": [1, 2], "b": {"x": 1.5, "y": None}, "c": [{"k": "v"}, [3, [4]]], "d": {}}
    text = dumps_json(doc, inline_leaves=True)
    assert text == ('{\n  "a": [1, 2],\n  "b": {"x": 1.5, "y": null},\n  "c": [\n'
                    '    {"k": "v"},\n    [\n      3,\n      [4]\n    ]\n  ],\n  "d": {}\n}\n')
    assert json.loads(text) == doc
    with pytest.raises(ValueError):
        dumps_json({"x": [float("inf")]}, inline_leaves=True)


def test_family_fields_pass_through_and_render_per_rank() -> None:
    """A family's own figures reach ops[].family_fields as JSON types (numpy converted), and
    report.md renders a per-rank list of lists as a table, anything else as a line."""
    from npusim.report.markdown import format_markdown

    res = make_result()
    res.ops[1].family_fields = {"waits_us": [np.array([0, 3]), [np.int64(7), 1]],
                                "mode": "fast"}
    rep = build_report(res)
    assert rep["ops"][0]["family_fields"] == {}
    got = rep["ops"][1]["family_fields"]
    assert got == {"waits_us": [[0, 3], [7, 1]], "mode": "fast"}
    assert type(got["waits_us"][1][0]) is int
    json.dumps(rep)  # plain JSON
    md = format_markdown(rep)
    assert "| rank | 0 | 1 |" in md and "| 0 | 0 | 3 |" in md and "| 1 | 7 | 1 |" in md
    assert "- mode: fast" in md


def test_a_family_without_the_moe_shape_reports_none_of_it():
    """rms_norm_quant reads no tokens, ranks or experts: its workload has no MoE shape,
    and the report presents no W, BS or H."""
    from npusim.report.markdown import format_markdown
    from npusim.scenario import scenario_from_doc

    sc = scenario_from_doc({"name": "rnq", "hardware": "ascend950",
                            "workload": {"kernel": "rms_norm_quant", "op": "rms_norm_quant",
                                         "step": 2}}, "test", Path.cwd())
    wl = sc.workload.to_dict()
    assert not {"bs", "h", "k", "ep_world_size", "experts_per_rank", "routing"} & set(wl)
    report = {"scenario": {"name": "rnq", "workload": wl}, "ops": []}
    head = format_summary(report).splitlines()[0]
    assert "W=" not in head and "BS=" not in head and "step 2" in head
    line = next(x for x in format_markdown(report).splitlines() if x.startswith("- workload"))
    assert "W=" not in line and "routing" not in line and "step 2" in line
