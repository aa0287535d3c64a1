"""Measurement tables, validate and calibrate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npusim.calibrate import (
    FreeParameter,
    Measurement,
    compare,
    fit,
    read_table,
    rewrite_preset,
    simulate_table,
    simulate_tables,
)
from npusim.cli import main
from npusim.errors import InputError
from npusim.hw.config import CONFIG_DIR, load_hardware

HEADER = "op,bs,h,k,ep_world_size,experts_per_rank,dtype,dispatch_quant,combine_quant,measured_us"
SMALL = "dispatch,8,1024,4,2,4,float16,mxfp8,none,{us}"


def write(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    p = tmp_path / "m.csv"
    p.write_text("\n".join([header, *rows]) + "\n")
    return p


def test_published_table_has_the_eight_rows_of_targets_md_and_the_nine_samples():
    rows = read_table(CONFIG_DIR / "targets" / "ascend950.csv")
    moe = [m for m in rows if m.workload.get("kernel", "cann_sample") == "cann_sample"]
    samples = {
        (m.op, str(m.workload.get("vf", m.workload.get("step")))): m.measured
        for m in rows
        if m not in moe
    }
    # vector_function README (task durations) and rms_norm_quant_story README (steps 0..6)
    assert samples == {
        ("gelu", "False"): 69.2,
        ("gelu", "True"): 25.3,
        **{
            ("rms_norm_quant", str(s)): us
            for s, us in enumerate((7693, 6790, 113.6, 84.1, 54.3, 49.0, 49.5))
        },
    }
    # the vector rows leave the MoE shape blank (their families do not read it)
    assert all("bs" not in m.workload for m in rows if m not in moe)
    got = {(m.op, m.workload["bs"], m.quant): m.measured for m in moe}
    assert got == {
        ("dispatch", 8, "none"): 17.1,
        ("dispatch", 8, "mxfp8"): 16.6,
        ("dispatch", 256, "none"): 170.0,
        ("dispatch", 256, "mxfp8"): 113.0,
        ("combine", 8, "none"): 19.4,
        ("combine", 8, "int8"): 18.8,
        ("combine", 256, "none"): 150.7,
        ("combine", 256, "int8"): 108.0,
    }


@pytest.mark.parametrize(
    "rows,header,key",
    [
        ((SMALL.format(us="fast"),), HEADER, "row 2.measured_us"),
        (("dispatch,eight,1024,4,2,4,float16,mxfp8,none,3",), HEADER, "row 2.bs"),
        (("gather,8,1024,4,2,4,float16,mxfp8,none,3",), HEADER, "row 2.op"),
        ((SMALL.format(us=3),), HEADER.replace(",measured_us", ""), None),
        ((SMALL.format(us="-1"),), HEADER, "row 2.measured_us"),
    ],
)
def test_bad_tables_name_file_row_and_column(tmp_path, rows, header, key):
    p = write(tmp_path, *rows, header=header)
    with pytest.raises(InputError) as info:
        read_table(p)
    assert str(p) in str(info.value)
    if key:
        assert info.value.key == key


def test_speedups_pair_each_quantised_row_with_its_twin():
    w = dict(
        op="combine",
        bs=8,
        h=1024,
        k=4,
        ep_world_size=2,
        experts_per_rank=4,
        dtype="float16",
        dispatch_quant="none",
    )
    rows = [
        Measurement({**w, "combine_quant": "none"}, 30.0),
        Measurement({**w, "combine_quant": "int8"}, 20.0),
    ]
    cmp = compare(rows, [40.0, 25.0])
    assert cmp.speedups == [
        {
            "op": "combine",
            "bs": 8,
            "quant": "int8",
            "label": "combine BS 8 int8",
            "measured": 1.5,
            "simulated": 1.6,
        }
    ]
    assert cmp.errors() == pytest.approx([1 / 3, 0.25])


def test_vector_rows_pair_by_their_names_and_rms_steps_do_not_pair():
    """GeLU's VF row against its MemBase twin, named by the rows' labels; the seven
    RmsNormQuant steps are separate programs, so no step is a speed-up of another."""
    g = dict(op="gelu", dtype="float16", kernel="cann_gelu")
    r = dict(op="rms_norm_quant", dtype="float16", kernel="rms_norm_quant")
    rows = [
        Measurement({**g, "vf": False}, 69.2, label="gelu_membase"),
        Measurement({**g, "vf": True}, 25.3, label="gelu_vf"),
        Measurement({**r, "step": 2}, 113.6, label="rnq2"),
        Measurement({**r, "step": 3}, 84.1, label="rnq3"),
    ]
    cmp = compare(rows, [70.0, 28.0, 120.0, 90.0])
    assert [sp["label"] for sp in cmp.speedups] == ["gelu_vf vs gelu_membase"]
    assert cmp.speedups[0]["measured"] == pytest.approx(69.2 / 25.3)
    assert cmp.speedups[0]["simulated"] == pytest.approx(2.5)


def test_vector_rows_may_leave_the_moe_columns_blank_moe_rows_may_not(tmp_path):
    header = HEADER + ",kernel,vf"
    ok = write(tmp_path, "gelu,,,,,,float16,,,25.3,cann_gelu,true", header=header)
    assert "bs" not in read_table(ok)[0].workload
    bad = write(tmp_path, "dispatch,,1024,4,2,4,float16,mxfp8,none,3,,", header=header)
    with pytest.raises(InputError) as info:
        read_table(bad)
    assert info.value.key == "row 2.bs"


def test_rewrite_preset_changes_only_the_fitted_values(tmp_path):
    """On a copy of the shipped preset: the fitted values and their provenance change,
    every other value keeps its value and its provenance."""
    from npusim.calibrate import fit_provenance
    from npusim.hw.config import load_provenance

    src = tmp_path / "start.yaml"
    src.write_text((CONFIG_DIR / "ascend950.yaml").read_text())
    params = [
        FreeParameter(("mte.put_gbps",), 4, 64),
        FreeParameter(("fabric.egress_gbps", "fabric.ingress_gbps"), 100, 2000),
    ]
    prov = fit_provenance(params, "t.csv", "reports/t.fit.json", "2026-12-01")
    out = tmp_path / "out.yaml"
    out.write_text(
        rewrite_preset(
            src.read_text(),
            {"mte.put_gbps": 12.5, "fabric.egress_gbps": 444.0, "fabric.ingress_gbps": 444.0},
            prov,
        )
    )
    before, after = load_provenance(str(src)), load_provenance(str(out))
    assert list(before) == list(after)
    fitted = {"mte.put_gbps", "fabric.egress_gbps", "fabric.ingress_gbps"}
    assert {k: before[k] for k in before if k not in fitted} == {
        k: after[k] for k in after if k not in fitted
    }
    assert after["mte.put_gbps"][0] == 12.5 and after["fabric.ingress_gbps"][0] == 444.0
    p = after["fabric.egress_gbps"][2]
    assert p.kind == "calibrated" and p.fields["fit"] == "reports/t.fit.json"
    assert p.fields["date"] == "2026-12-01"
    assert (
        p.fields["method"] == "npusim calibrate to t.csv, tied with ingress_gbps, bounds 100-2000"
    )
    # what the value means stays; where it came from is replaced
    assert p.fields["note"] == before["fabric.egress_gbps"][2].fields["note"]
    assert load_hardware(str(out)).mte.put_gbps == 12.5


def test_rewrite_preset_turns_a_plain_value_into_a_calibrated_entry(tmp_path):
    text = "name: x\nmte:\n  put_gbps: 24.94   # a comment\n  put_latency_ns: 67.5\n"
    prov = {"mte.put_gbps": {"fit": "f.json", "date": "2026-12-01", "method": "m"}}
    out = rewrite_preset(text, {"mte.put_gbps": 0.26543}, prov)
    import yaml

    assert yaml.safe_load(out) == {
        "name": "x",
        "mte": {
            "put_gbps": {
                "value": 0.2654,
                "calibrated": {"fit": "f.json", "date": "2026-12-01", "method": "m"},
            },
            "put_latency_ns": 67.5,
        },
    }


def test_validate_exit_codes_follow_the_tolerance(tmp_path):
    p = write(tmp_path, SMALL.format(us=10.0))
    assert main(["validate", "--table", str(p), "--tolerance", "100000%", "--workers", "1"]) == 0
    assert main(["validate", "--table", str(p), "--tolerance", "0%", "--workers", "1"]) == 1
    assert main(["validate", "--table", str(p), "--tolerance", "lots"]) == 2


def test_a_rows_own_tolerance_replaces_the_default(tmp_path, capsys):
    # one row measured 10 us; whatever it simulates to, its error e is fixed: a row
    # tolerance just above |e| passes it under a default of 0%, one just below fails it
    p = write(tmp_path, SMALL.format(us=10.0))
    main(["validate", "--table", str(p), "--workers", "1", "--json"])
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    pct = 100 * abs(row["error"])
    hdr = HEADER + ",tolerance_pct"
    above = write(tmp_path, SMALL.format(us=10.0) + f",{pct * 1.01 + 1e-3:.4f}", header=hdr)
    assert main(["validate", "--table", str(above), "--tolerance", "0%", "--workers", "1"]) == 0
    assert "where the table says so" in capsys.readouterr().out
    below = write(tmp_path, SMALL.format(us=10.0) + f",{pct * 0.99:.4f}", header=hdr)
    assert main(["validate", "--table", str(below), "--tolerance", "100%", "--workers", "1"]) == 1
    assert "<- outside" in capsys.readouterr().out


@pytest.mark.parametrize("cell", ["0", "-5", "101", "ten"])
def test_a_bad_row_tolerance_names_its_cell(tmp_path, cell):
    p = write(tmp_path, SMALL.format(us=10.0) + f",{cell}", header=HEADER + ",tolerance_pct")
    with pytest.raises(InputError) as info:
        read_table(p)
    assert info.value.key == "row 2.tolerance_pct" and "(0, 100]" in str(info.value)


def test_the_vector_rows_of_the_published_table_carry_issue_17s_ten_percent():
    rows = read_table(CONFIG_DIR / "targets" / "ascend950.csv")
    vector = {m.name: m.tolerance for m in rows if "bs" not in m.workload}
    assert len(vector) == 9 and set(vector.values()) == {0.10}
    assert all(m.tolerance is None for m in rows if "bs" in m.workload)


def test_validate_json_is_machine_readable(tmp_path, capsys):
    p = write(tmp_path, SMALL.format(us=10.0))
    main(["validate", "--table", str(p), "--tolerance", "0%", "--workers", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["tolerance"] == 0
    (row,) = doc["rows"]
    assert row["measured_us"] == 10.0
    assert row["error"] == pytest.approx((row["simulated_us"] - 10.0) / 10.0, abs=1e-5)


def test_calibrate_recovers_a_known_port_bandwidth(tmp_path):
    """'Measure' a dispatch on hardware whose put bandwidth we chose (6 GB/s), then fit
    put_gbps from a start of 20: the fit must find about 6 again. (Tokens of H 7168, 8 per
    sending core, so the puts are on the path past the cum-sum core's VF calls.)"""
    row = Measurement(
        dict(
            op="dispatch",
            bs=64,
            h=7168,
            k=4,
            ep_world_size=2,
            experts_per_rank=4,
            dtype="float16",
            dispatch_quant="none",
            combine_quant="none",
        ),
        1.0,
    )
    truth = simulate_table([row], "ascend950", {"mte.put_gbps": 6.0}, "t", workers=1)[0]
    measured = Measurement(row.workload, truth)
    param = FreeParameter(("mte.put_gbps",), 2.0, 64.0)
    result = fit(
        [measured],
        "ascend950",
        [param],
        {"mte.put_gbps": 20.0},
        "t",
        prior_weight=0.0,
        max_evals=20,
        workers=1,
    )
    assert result.values["mte.put_gbps"] == pytest.approx(6.0, rel=0.03)


def test_calibrate_command_writes_a_loadable_preset_and_report(tmp_path):
    p = write(tmp_path, SMALL.format(us=12.0))
    out = tmp_path / "fit.yaml"
    code = main(
        [
            "calibrate",
            "--table",
            str(p),
            "--param",
            "kernel.launch_ns=100:20000",
            "--max-evals",
            "3",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    hw = load_hardware(str(out))
    report = json.loads(out.with_suffix(".fit.json").read_text())
    (param,) = report["parameters"]
    assert param["fitted"] == pytest.approx(hw.kernel.launch_ns, rel=1e-3)
    assert 100 <= hw.kernel.launch_ns <= 20000
    # the fitted value names the report just written; nothing else changed
    from npusim.hw.config import load_provenance
    from npusim.hw.provenance import calibrated_problem

    before, after = load_provenance("ascend950"), load_provenance(str(out))
    value, _, prov = after["kernel.launch_ns"]
    assert prov.fields["fit"] == str(out.with_suffix(".fit.json"))
    assert calibrated_problem("kernel.launch_ns", value, prov, Path.cwd()) is None
    assert {k: v for k, v in before.items() if k != "kernel.launch_ns"} == {
        k: v for k, v in after.items() if k != "kernel.launch_ns"
    }


def two_rows_2us_apart(
    labels: tuple[str, str] = ("", ""),
) -> tuple[Measurement, Measurement, float, float]:
    """Two small dispatch rows and their 'measured' times, simulated on hardware whose
    kernel start differs by 2 us (3000 ns for the first, 5000 ns for the second)."""
    w = dict(
        op="dispatch",
        h=1024,
        k=4,
        ep_world_size=2,
        experts_per_rank=4,
        dtype="float16",
        dispatch_quant="none",
        combine_quant="none",
    )
    a = Measurement({**w, "bs": 8}, 1.0, label=labels[0])
    b = Measurement({**w, "bs": 16}, 1.0, label=labels[1])
    ta = simulate_table([a], "ascend950", {"kernel.launch_ns": 3000.0}, "t", workers=1)[0]
    tb = simulate_table([b], "ascend950", {"kernel.launch_ns": 5000.0}, "t", workers=1)[0]
    return a, b, ta, tb


def test_leave_one_out_predicts_each_row_from_a_fit_to_the_others(tmp_path, capsys):
    """Two 'measured' rows made on hardware with a kernel start 2 us apart. The start is a
    pure offset, so a fit to one row recovers that row's start, and the other row is
    predicted 2 us off, by hand: error = -2 / measured for the later one, +2 / measured
    for the earlier one."""
    a, b, ta, tb = two_rows_2us_apart()
    p = write(
        tmp_path,
        *(
            ",".join(str(m.workload[c]) for c in HEADER.split(",")[:-1]) + f",{us}"
            for m, us in ((a, ta), (b, tb))
        ),
    )
    out = tmp_path / "fit.yaml"
    assert (
        main(
            [
                "calibrate",
                "--table",
                str(p),
                "--param",
                "kernel.launch_ns=100:20000",
                "--max-evals",
                "20",
                "--workers",
                "1",
                "--loo",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    loo = json.loads(out.with_suffix(".fit.json").read_text())["leave_one_out"]
    assert [e["measured_us"] for e in loo] == pytest.approx([ta, tb])
    assert loo[0]["error"] == pytest.approx(2.0 / ta, abs=0.004)
    assert loo[1]["error"] == pytest.approx(-2.0 / tb, abs=0.004)
    assert loo[0]["fitted"]["kernel.launch_ns"] == pytest.approx(5000, rel=0.05)
    printed = capsys.readouterr().out
    assert "leave-one-out: 2 refits" in printed and printed.count("evaluations") >= 2


def test_linear_leave_one_out_takes_the_refits_first_step(tmp_path, capsys):
    """The same two rows, 2 us of kernel start apart. Held out, each row is predicted
    from one Gauss-Newton step towards the other row's start (hand arithmetic: the refit
    lands on it, 2 us away), at one simulation per row: the step is within a few percent
    of the refit and costs no new simulation of the table."""
    a, b, ta, tb = two_rows_2us_apart()
    p = write(
        tmp_path,
        *(
            ",".join(str(m.workload[c]) for c in HEADER.split(",")[:-1]) + f",{us}"
            for m, us in ((a, ta), (b, tb))
        ),
    )
    out = tmp_path / "fit.yaml"
    assert (
        main(
            [
                "calibrate",
                "--table",
                str(p),
                "--param",
                "kernel.launch_ns=100:20000",
                "--max-evals",
                "20",
                "--workers",
                "1",
                "--loo",
                "linear",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    loo = json.loads(out.with_suffix(".fit.json").read_text())["leave_one_out"]
    assert [e["evaluations"] for e in loo] == [1, 1]
    assert [e["method"] for e in loo] == ["linear", "linear"]
    assert loo[0]["error"] == pytest.approx(2.0 / ta, rel=0.15)
    assert loo[1]["error"] == pytest.approx(-2.0 / tb, rel=0.15)
    assert loo[0]["fitted"]["kernel.launch_ns"] == pytest.approx(5000, rel=0.05)
    assert loo[1]["fitted"]["kernel.launch_ns"] == pytest.approx(3000, rel=0.05)
    assert "first refit steps (linear" in capsys.readouterr().out


def test_held_out_rows_are_predicted_not_fitted(tmp_path, capsys):
    """Row b (kernel start 2 us later) held out: the fit recovers a's start, and b is
    predicted 2 us short (hand arithmetic: error -2 / measured); a pattern matching no
    row is a one-line input error naming the rows."""
    a, b, ta, tb = two_rows_2us_apart(("row_a", "row_b"))
    header = HEADER.split(",")[:-1]
    table = tmp_path / "t.csv"
    table.write_text(
        ",".join(header)
        + ",measured_us,label\n"
        + "".join(
            ",".join(str(m.workload[c]) for c in header) + f",{us},{m.label}\n"
            for m, us in ((a, ta), (b, tb))
        )
    )
    out = tmp_path / "fit.yaml"
    args = [
        "calibrate",
        "--table",
        str(table),
        "--param",
        "kernel.launch_ns=100:20000",
        "--max-evals",
        "20",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    assert main([*args, "--hold-out", "row_[b]"]) == 0
    report = json.loads(out.with_suffix(".fit.json").read_text())
    assert [r["row"] for r in report["rows"]] == ["row_a"]
    assert report["parameters"][0]["fitted"] == pytest.approx(3000, rel=0.02)
    (held,) = report["held_out"]
    assert held["row"] == "row_b" and held["measured_us"] == pytest.approx(tb)
    assert held["error"] == pytest.approx(-2.0 / tb, abs=0.004)
    assert "1 held out" in capsys.readouterr().out
    assert main([*args, "--hold-out", "row_c"]) == 2
    err = capsys.readouterr().err
    assert "--hold-out" in err and "row_a, row_b" in err and err.count("\n") == 1


def test_fit_report_says_which_rows_pin_each_parameter(tmp_path, capsys):
    """On a MemBase vector unit (the A3 preset) an unquantised dispatch runs no vector
    function, so the VF cost can only be pinned by the MXFP8 row (all of its share),
    while the kernel start is a fixed offset that both rows feel, each in proportion to
    launch / latency. (At BS 32, H 4096, from a VF cost of 2 cycles per instruction, it
    moves the MXFP8 row by several % per 100%, above the 'held by the prior' line.) On the
    950 every MemBase call is a VF."""
    p = write(
        tmp_path,
        "dispatch,32,4096,4,2,4,float16,none,none,18.0",
        "dispatch,32,4096,4,2,4,float16,mxfp8,none,16.0",
    )
    out = tmp_path / "fit.yaml"
    start = tmp_path / "a3_start.yaml"
    text = (CONFIG_DIR / "atlas_a3.yaml").read_text()
    start.write_text(
        text.replace(
            "  vf_cycles_per_instr:\n    value: 0.6545", "  vf_cycles_per_instr:\n    value: 2.0", 1
        )
    )
    assert "value: 2.0" in start.read_text()
    assert (
        main(
            [
                "calibrate",
                "--hardware",
                str(start),
                "--table",
                str(p),
                "--param",
                "kernel.launch_ns=100:20000",
                "--param",
                "vector.vf_cycles_per_instr=0.5:4",
                "--max-evals",
                "2",
                "--workers",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.with_suffix(".fit.json").read_text())
    pinned = {e["parameter"]: e for e in report["pinned_by"]}
    vf = pinned["vector.vf_cycles_per_instr"]
    assert vf["top_row"] == "dispatch_bs32_mxfp8" and vf["top_share"] == pytest.approx(1.0)
    assert vf["shares"]["dispatch_bs32_none"] == 0.0
    launch = pinned["kernel.launch_ns"]
    sim = {r["row"]: r["simulated_us"] for r in report["rows"]}
    ratio = launch["shares"]["dispatch_bs32_none"] / launch["shares"]["dispatch_bs32_mxfp8"]
    # d log(t)/d log(launch) = launch / t per row (finite differences: a few % off)
    assert ratio == pytest.approx(sim["dispatch_bs32_mxfp8"] / sim["dispatch_bs32_none"], rel=0.05)
    printed = capsys.readouterr().out
    vf_line = printed[printed.index("which rows pin") :].splitlines()[2]
    assert "dispatch_bs32_mxfp8 100%" in vf_line and "one row alone" in vf_line


def test_pinned_by_shares_each_parameters_effect_over_the_rows():
    import numpy as np

    from npusim.calibrate import pinned_by

    params = [FreeParameter(("a",), 1, 2), FreeParameter(("b",), 1, 2), FreeParameter(("c",), 1, 2)]
    elasticity = np.array([[0.5, 0.0, 0.0], [1.5, 0.3, 0.0]])
    a, b, c = pinned_by(params, ["r1", "r2"], elasticity)
    assert a["shares"] == pytest.approx({"r1": 0.25, "r2": 0.75}) and a["top_row"] == "r2"
    assert b["top_share"] == 1.0 and b["total_elasticity"] == pytest.approx(0.3)
    assert c["shares"] == {} and c["top_row"] is None and c["total_elasticity"] == 0.0


def test_fit_steps_every_parameter_by_two_percent(monkeypatch):
    """The finite-difference steps are 2% of each value whatever its size: scipy's own
    relative step would move a value of 1 (log 0) by ~1e-12 and one of 9000 by ~20%.
    A synthetic table (latency = a * b / 3000, measured 3.0) keeps it fast; the fit must
    reach a * b = 9000 from a = 1 (its lower bound) and b = 3000."""
    import math

    import npusim.calibrate.fitting as cal

    seen: list[dict[str, float]] = []

    def tables(rows, hardware, points, source, workers=None):
        seen.extend(dict(p) for p in points)
        return [[p["a"] * p["b"] / 3000.0 for _ in rows] for p in points]

    monkeypatch.setattr(cal, "simulate_tables", tables)
    row = Measurement(
        dict(
            op="dispatch",
            bs=8,
            h=1024,
            k=4,
            ep_world_size=2,
            experts_per_rank=4,
            dtype="float16",
            dispatch_quant="none",
            combine_quant="none",
        ),
        3.0,
    )
    params = [FreeParameter(("a",), 1.0, 4.0), FreeParameter(("b",), 100.0, 20000.0)]
    result = fit(
        [row],
        "ascend950",
        params,
        {"a": 1.0, "b": 3000.0},
        "t",
        prior_weight=0.0,
        max_evals=20,
        workers=1,
    )
    first = seen[0]
    steps = {
        k: abs(math.log(s[k] / first[k]))
        for s in seen[1:3]
        for k in "ab"
        if abs(math.log(s[k] / first[k])) > 1e-9
    }
    assert steps == {"a": pytest.approx(0.02, rel=1e-6), "b": pytest.approx(0.02, rel=1e-6)}
    assert result.values["a"] * result.values["b"] == pytest.approx(9000.0, rel=1e-3)


def test_a_jacobians_points_are_simulated_in_one_pool(monkeypatch):
    """Each fit step's finite-difference points go to the workers together (the longest
    run of one point no longer idles the others): a batch of more than one point is the
    Jacobian's, one point per parameter beside the step's own, each point simulated once."""
    import npusim.calibrate.fitting as cal

    batches: list[list[tuple[float, float]]] = []

    def tables(rows, hardware, points, source, workers=None):
        batches.append([(p["a"], p["b"]) for p in points])
        return [[p["a"] * p["b"] / 3000.0 for _ in rows] for p in points]

    monkeypatch.setattr(cal, "simulate_tables", tables)
    row = Measurement(dict(op="dispatch", bs=8, h=1024, k=4, ep_world_size=2,
                           experts_per_rank=4, dtype="float16"), 3.0)
    params = [FreeParameter(("a",), 1.0, 4.0), FreeParameter(("b",), 100.0, 20000.0)]
    result = fit([row], "ascend950", params, {"a": 1.0, "b": 3000.0}, "t",
                 prior_weight=0.0, max_evals=20, workers=2)
    jacobians = [b for b in batches if len(b) > 1]
    assert jacobians and all(len(b) == 2 for b in jacobians)
    points = [p for b in batches for p in b]
    assert len(points) == len(set(points)) == result.evaluations


def test_tables_at_many_points_match_one_table_at_a_time():
    """Several points' tables from one pool of two workers are the tables each point gives
    alone in this process; a slower put gives a slower dispatch."""
    row = Measurement(dict(op="dispatch", bs=16, h=7168, k=4, ep_world_size=2,
                           experts_per_rank=4, dtype="float16", dispatch_quant="none",
                           combine_quant="none"), 1.0)
    points = [{"mte.put_gbps": 6.0}, {"mte.put_gbps": 24.0}, {"mte.put_gbps": 6.0}]
    many = simulate_tables([row, row], "ascend950", points, "t", workers=2)
    alone = [simulate_table([row, row], "ascend950", p, "t", workers=1) for p in points]
    assert many == alone
    assert many[0][0] > many[1][0]


@pytest.mark.parametrize(("extra", "names", "says"), [
    (["--param", "kernel.launch_ns=100:20000", "--max-evals", "0"], "--max-evals",
     "allowed: a whole number >= 1"),
    (["--param", "kernel.launch_ns=100:20000", "--max-evals", "-5"], "--max-evals",
     "allowed: a whole number >= 1"),
    (["--param", "kernel.launch_ns=100:inf", "--max-evals", "1"], "--param",
     "allowed: finite bounds 0 < LOW < HIGH"),
    (["--param", "kernel.launch_ns=nan:100", "--max-evals", "1"], "--param",
     "allowed: finite bounds 0 < LOW < HIGH"),
    (["--param", "kernel.launch_ns=100:200", "--param", "kernel.launch_ns=300:400"],
     "--param kernel.launch_ns", "given twice"),
    (["--param", "mte.put_gbps,kernel.launch_ns=1:50", "--param", "mte.put_gbps=1:9"],
     "--param mte.put_gbps", "given twice"),
    (["--param", "chip.aiv_cores=8:64", "--max-evals", "1"], "--param chip.aiv_cores",
     "holds a whole number"),
    (["--param", "kernel.launch_ns=100:20000", "--param", "mte.nope=1:2"], "--param mte.nope",
     "unknown hardware key"),
], ids=["evals-0", "evals-negative", "inf", "nan", "twice", "twice-tied", "integer-key",
        "unknown-key"])
def test_calibrate_arguments_are_refused_before_the_fit(tmp_path, capsys, extra, names, says):
    """Each was a scipy traceback, a fit that ended in a traceback and an empty folder,
    or a failure mid-fit blamed on the table's row; now one line naming the option,
    before anything is simulated or written."""
    table = write(tmp_path, SMALL.format(us=12.0))
    out = tmp_path / "new" / "fit.yaml"
    code = main(["calibrate", "--table", str(table), *extra, "--workers", "1", "--quiet",
                 "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 2
    assert cap.err.count("\n") == 1, cap.err
    assert cap.err.startswith(f"npusim: error: command line: {names}: ") and says in cap.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]


def test_a_fitted_preset_that_does_not_load_is_not_written(tmp_path, capsys, monkeypatch):
    """The preset is loaded before it and its report are placed: a failure leaves
    neither, nor the folder made for them, and names --out, not a staging file."""
    import npusim.calibrate as cal

    monkeypatch.setattr(cal, "rewrite_preset", lambda text, values, prov: "name: broken\n")
    table = write(tmp_path, SMALL.format(us=12.0))
    out = tmp_path / "new" / "fit.yaml"
    assert main(["calibrate", "--table", str(table), "--param", "kernel.launch_ns=100:20000",
                 "--max-evals", "1", "--workers", "1", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"npusim: error: {out}: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]
