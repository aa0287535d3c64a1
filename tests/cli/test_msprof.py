"""msprof op_summary + mapping files as measurement tables, and the A3 target table."""

from __future__ import annotations

from pathlib import Path

import pytest

from npusim.calibrate import read_table, row_doc, timed_ops
from npusim.cli import main
from npusim.errors import InputError
from npusim.hw.config import CONFIG_DIR
from npusim.kernels import registry
from npusim.msprof import is_op_summary, read_mapping, read_measurements, read_op_summary
from npusim.scenario import scenario_from_doc

# A made-up op_summary: the columns msprof writes that matter here, and some it writes
# besides (Task ID, OP Type, Block Dim), in msprof's order. Durations are invented.
SUMMARY = """Model ID,Task ID,Stream ID,Op Name,OP Type,Task Type,Task Start Time(us),\
Task Duration(us),Task Wait Time(us),Block Dim,Input Shapes
4294967295,11,2,MoeDistributeDispatchV2,MoeDistributeDispatchV2,AI_VECTOR_CORE,100.0,\
30.0,0.0,48,"8,7168;8,8"
4294967295,12,2,MoeDistributeDispatchV2,MoeDistributeDispatchV2,AI_VECTOR_CORE,200.0,\
34.0,0.0,48,"8,7168;8,8"
4294967295,13,2,MoeDistributeCombineV2,MoeDistributeCombineV2,AI_VECTOR_CORE,300.0,\
40.5,0.0,48,"8,7168;8,8"
4294967295,14,2,MoeDistributeDispatchV2,MoeDistributeDispatchV2,AI_VECTOR_CORE,400.0,\
90.0,0.0,48,"256,7168;256,8"
4294967295,15,2,Cast,Cast,AI_VECTOR_CORE,500.0,2.0,0.0,8,"8,7168"
"""

MAPPING = """ops:
  - op_name: MoeDistributeDispatchV2
    input_shapes: "8,7168;8,8"
    scenario: dispatch_bs8_none
    label: my_dispatch
  - op_name: MoeDistributeCombineV2
    scenario: combine_bs8_none
    tolerance_pct: 15
"""


def files(tmp_path: Path, summary: str = SUMMARY, mapping: str = MAPPING) -> tuple[Path, Path]:
    s, m = tmp_path / "op_summary_0_1.csv", tmp_path / "ops.yaml"
    s.write_text(summary)
    m.write_text(mapping)
    return s, m


def test_op_summary_rows_are_the_mean_of_the_matching_launches(tmp_path):
    s, m = files(tmp_path)
    assert is_op_summary(s)
    assert not is_op_summary(CONFIG_DIR / "targets" / "ascend950.csv")
    rows = read_measurements(s, m)
    assert [r.name for r in rows] == ["my_dispatch", "combine_bs8_none"]
    # the two BS 8 dispatch launches (30 and 34 us); the BS 256 one has other shapes
    assert rows[0].measured == pytest.approx(32.0)
    assert rows[1].measured == pytest.approx(40.5)
    assert rows[0].tolerance is None and rows[1].tolerance == pytest.approx(0.15)
    assert rows[0].workload["bs"] == 8 and rows[1].op == "combine"
    for r in rows:  # the rows' scenarios build as validate simulates them
        scenario_from_doc(row_doc(r, "ascend950", {}), "t", tmp_path)


def test_an_op_of_a_fused_run_is_timed_inside_it(tmp_path):
    s, m = files(
        tmp_path,
        mapping="""ops:
  - {op_name: MoeDistributeCombineV2, scenario: mc2/a3_bs128_ep8, op: combine}
""",
    )
    (row,) = read_measurements(s, m)
    doc = row_doc(row, "atlas_a3", {})
    assert doc["workload"]["op"] == "dispatch_combine" and doc["workload"]["timing_only"]
    assert timed_ops(registry.get("mc2"))["combine"] == ("dispatch_combine", 1)


S = "Op Name,Task Duration(us)\n"


@pytest.mark.parametrize(
    "kind, text, key",
    [
        ("summary", S + "A,x\n", "row 2.Task Duration(us)"),
        ("summary", S + "A,nan\n", "row 2.Task Duration(us)"),
        ("summary", S + "A,-3\n", "row 2.Task Duration(us)"),
        ("summary", S + "A,3\n,4\n", "row 3.Op Name"),
        ("summary", S + "A,3,9\n", "row 2"),
        ("mapping", "ops: []\n", "ops"),
        ("mapping", "ops:\n  - 3\n", "ops[1]"),
        ("mapping", "ops:\n  - {op_name: A}\n", "ops[1].scenario"),
        ("mapping", "ops:\n  - {op_name: A, scenario: x, colour: red}\n", "ops[1].colour"),
        (
            "mapping",
            "ops:\n  - {op_name: A, scenario: x, tolerance_pct: 0}\n",
            "ops[1].tolerance_pct",
        ),
        ("mapping", "ops:\n  - {op_name: 5, scenario: x}\n", "ops[1].op_name"),
        ("mapping", "ops:\n  - {op_name: A, scenario: dispatch_bs8_none}\nextra: 1\n", "extra"),
    ],
)
def test_a_malformed_file_is_refused_in_one_line_naming_row_or_entry_and_key(
    tmp_path, kind, text, key
):
    s, m = files(tmp_path, **{kind: text})
    with pytest.raises(InputError) as info:
        read_op_summary(s) if kind == "summary" else read_mapping(m)
    assert info.value.key == key and "\n" not in str(info.value)


def test_an_op_summary_without_the_duration_column_is_refused(tmp_path):
    s, _ = files(tmp_path, summary="Op Name,Task Start Time(us)\nA,1\n")
    with pytest.raises(InputError, match="missing column.*Task Duration"):
        read_op_summary(s)


def test_a_mapping_entry_matching_no_launch_or_a_wrong_op_is_refused(tmp_path):
    s, m = files(tmp_path, mapping="ops:\n  - {op_name: Nope, scenario: dispatch_bs8_none}\n")
    with pytest.raises(InputError) as info:
        read_measurements(s, m)
    assert info.value.key == "ops[1].op_name"
    s, m = files(
        tmp_path, mapping="ops:\n  - {op_name: Cast, scenario: dispatch_bs8_none, op: combine}\n"
    )
    with pytest.raises(InputError) as info:
        read_measurements(s, m)
    assert info.value.key == "ops[1].op"


def test_cli_refuses_an_op_summary_without_a_mapping_and_bad_files_in_one_line(tmp_path, capsys):
    s, m = files(tmp_path)
    assert main(["validate", "--table", str(s)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--map" in err and "\n" not in err
    s, m = files(tmp_path, summary="Op Name,Task Duration(us)\nA,fast\n")
    assert main(["validate", "--table", str(s), "--map", str(m)]) == 2
    err = capsys.readouterr().err.strip()
    assert "row 2.Task Duration(us)" in err and "\n" not in err


def test_the_a3_table_holds_the_published_rows_and_its_scenarios_build(tmp_path):
    rows = read_table(CONFIG_DIR / "targets" / "atlas_a3.csv")
    # sgl-kernel-npu README, "Low-Latency Kernels with Pure HCCS" (targets.md, Atlas A3)
    published = {
        ("dispatch", 8): 132,
        ("dispatch", 16): 139,
        ("dispatch", 32): 153,
        ("combine", 8): 126,
        ("combine", 16): 135,
        ("combine", 32): 151,
    }
    assert {(m.op, m.workload["ep_world_size"]): m.measured for m in rows} == published
    for m in rows:
        w = m.workload
        # the kernels measured: DeepEP's MoeLowLatencyDispatchV2 / CombineV2
        assert (w["bs"], w["h"], w["k"], w["kernel"], w["mode"], w["quant"]) == (
            128,
            7168,
            8,
            "deepep",
            "low_latency",
            "int8",
        )
        assert w["ep_world_size"] * w["experts_per_rank"] == 256
        assert w["routing"]["kind"] == "uniform" and m.tolerance == pytest.approx(0.10)
        scenario_from_doc(row_doc(m, "atlas_a3", {}), "t", tmp_path)


def test_rows_of_one_run_share_its_simulation_and_read_their_own_op(monkeypatch, tmp_path):
    import npusim.calibrate.simulate as cal

    table = tmp_path / "t.csv"
    row = "8,1024,4,4,2,bfloat16,int8,none,{us},mc2,{label}\n"
    table.write_text(
        "op,bs,h,k,ep_world_size,experts_per_rank,dtype,dispatch_quant,"
        "combine_quant,measured_us,kernel,label\n"
        + "dispatch,"
        + row.format(us=10, label="d")
        + "combine,"
        + row.format(us=20, label="c1")
        + "combine,"
        + row.format(us=21, label="c2")
    )
    runs = []

    def fake(job):
        runs.append(job[0]["workload"]["op"])
        us = [1.5, 2.5] if job[0]["workload"]["op"] == "dispatch_combine" else [1.0]
        return [(t, {}) for t in us]

    monkeypatch.setattr(cal, "simulate_row", fake)
    got = cal.simulate_table(read_table(table), "atlas_a3", {}, "t", workers=1)
    assert got == [1.0, 2.5, 2.5]  # dispatch alone; both combines: the fused run's 2nd op
    assert runs == ["dispatch", "dispatch_combine"]


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_a_scenarios_own_files_are_found_beside_it_as_run_finds_them(command, tmp_path,
                                                                      capsys, monkeypatch):
    """scenarios/examples/user_kernel.yaml names its kernel file relative to itself, and
    routing_file.yaml its routing file: a mapping row of each, read from another folder,
    was a FamilyError traceback. Each row now times what `run` of its scenario times."""
    import json

    import npusim.api as npu

    examples = ROOT / "scenarios" / "examples"
    summary = ("Op Name,Task Duration(us)\nToyDispatch,20.0\nFileDispatch,20.0\n")
    mapping = (f"ops:\n  - {{op_name: ToyDispatch, scenario: {examples / 'user_kernel.yaml'}, "
               f"op: dispatch}}\n  - {{op_name: FileDispatch, scenario: "
               f"{examples / 'routing_file.yaml'}, op: dispatch}}\n")
    s, m = files(tmp_path, summary, mapping)
    monkeypatch.chdir(tmp_path)
    if command == "calibrate":
        assert main(["calibrate", "--table", s.name, "--map", m.name, "--param",
                     "mte.put_gbps=1:64", "--max-evals", "1", "--out", "fit.yaml", "--quiet",
                     "--workers", "1"]) == 0
        report = json.loads((tmp_path / "fit.fit.json").read_text())
        assert [r["row"] for r in report["rows"]] == ["dispatch_bs8_-", "dispatch_bs8_mxfp8"]
        return
    code = main(["validate", "--table", s.name, "--map", m.name, "--json", "--workers", "1"])
    assert code in (0, 1)
    got = [r["simulated_us"] for r in json.loads(capsys.readouterr().out)["rows"]]
    want = [npu.run(str(examples / f), timing_only=True).latency_us("dispatch")
            for f in ("user_kernel.yaml", "routing_file.yaml")]
    assert got == pytest.approx(want, abs=1e-3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["op_summary_0_1.csv", "ops.yaml"]
