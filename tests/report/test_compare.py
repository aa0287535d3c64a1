"""npusim compare: deltas by hand, the verdict, unusable input, and a halved link."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from npusim.cli import main
from npusim.report.compare import (
    UnusableInput,
    baseline_of,
    compare_profiles,
    format_comparison,
    profile_of,
)

ROOT = Path(__file__).resolve().parents[2]


def report(latency: float, phases: dict[str, tuple[float, float]], op: str = "dispatch",
           name: str = "s") -> dict[str, Any]:
    return {
        "schema": "npusim.report/1",
        "scenario": {"name": name, "workload": {"op": op}},
        "hardware": {"name": "hw", "fabric": {"egress_gbps": 1000.0}},
        "ops": [{"op": op, "latency_us": latency,
                 "phases": {n: {"start_us": s, "end_us": e} for n, (s, e) in phases.items()}}],
    }


A = report(10.0, {"send_data": (0.0, 4.0), "wait_status": (4.0, 6.0)})
# latency +4 %, send_data lasts 4.3 (+7.5 %), wait_status 4.3..6.0 lasts 1.7 (-15 %)
B = report(10.4, {"send_data": (0.0, 4.3), "wait_status": (4.3, 6.0)})


def rows(cmp) -> dict[str, tuple[Any, ...]]:
    return {r.metric: (r.a, r.b, round(r.delta, 9), round(r.rel, 9), r.status)
            for r in cmp.rows}


def test_deltas_and_verdict_by_hand() -> None:
    cmp = compare_profiles(profile_of(A, "a"), profile_of(B, "b"), 0.05)
    assert rows(cmp) == {
        "latency": (10.0, 10.4, 0.4, 0.04, "ok"),
        "send_data end": (4.0, 4.3, 0.3, 0.075, "info"),
        "send_data duration": (4.0, 4.3, 0.3, 0.075, "slower"),
        "wait_status end": (6.0, 6.0, 0.0, 0.0, "info"),
        "wait_status duration": (2.0, 1.7, -0.3, -0.15, "faster"),
    }
    assert cmp.regressed and cmp.changed
    worst = cmp.worst()
    assert worst is not None and worst.metric == "send_data duration"
    text = format_comparison(cmp)
    assert "verdict: REGRESSED: 1 metric(s) of B slower than A by more than 5%" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("send_data duration"))
    assert line.split() == ["send_data", "duration", "4.000", "4.300", "+0.300", "+7.5%",
                            "slower"]
    # 10 % tolerance: nothing slower, wait_status still faster beyond it
    cmp = compare_profiles(profile_of(A, "a"), profile_of(B, "b"), 0.10)
    assert not cmp.regressed and cmp.changed and [r.metric for r in cmp.faster] == [
        "wait_status duration"]


def test_exactly_at_the_tolerance_is_within() -> None:
    b = report(10.5, {"send_data": (0.0, 4.2), "wait_status": (4.2, 6.3)})  # +5 % each
    cmp = compare_profiles(profile_of(A, "a"), profile_of(b, "b"), 0.05)
    assert not cmp.regressed and not cmp.changed


def test_a_phase_on_one_side_only_fails_and_keeps_the_columns(tmp_path, capsys) -> None:
    b = report(10.0, {"send_data": (0.0, 4.0), "extra": (4.0, 5.0)})
    cmp = compare_profiles(profile_of(A, "a"), profile_of(b, "b"), 0.05)
    statuses = {r.metric: r.status for r in cmp.rows}
    assert statuses["latency"] == "ok"
    assert statuses["wait_status duration"] == "only in A"
    assert statuses["extra duration"] == "only in B"
    assert cmp.regressed and cmp.changed  # a check never passes on a missing phase
    text = format_comparison(cmp)
    assert "phases on one side only: dispatch wait_status (only in A), dispatch extra " \
        "(only in B)" in text
    table = [ln for ln in text.splitlines() if ln.startswith("  ")]
    head = table[0]
    ends = [head.index(t) + len(t) for t in ("A us", "B us", "delta us")] + [len(head)]
    assert len(table) == 1 + 1 + 2 * 3  # latency, and end + duration of three phases
    for ln in table[1:]:  # each cell, '-' included, ends where its column's title ends
        for end in ends:
            assert ln[end - 1] != " " and ln[end:end + 1] in ("", " "), (ln, end)
    assert [ln[len(head):] for ln in table if "only" in ln] == [
        "  only in A", "  only in A", "  only in B", "  only in B"]
    assert main(["compare", write(tmp_path, "a.json", A), write(tmp_path, "b.json", b)]) == 1
    capsys.readouterr()


def test_nan_in_b_never_passes(tmp_path, capsys) -> None:
    b = report(float("nan"), {"send_data": (0.0, 4.0), "wait_status": (4.0, 6.0)})
    path = tmp_path / "b.json"
    path.write_text(json.dumps(b))  # json writes NaN, as a broken report might hold
    a = write(tmp_path, "a.json", A)
    for extra in ([], ["--strict"]):
        assert main(["compare", a, str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "ops[0].latency_us is nan" in err


def _without_phases() -> dict[str, Any]:
    doc = report(10.0, {})
    del doc["ops"][0]["phases"]
    return doc


@pytest.mark.parametrize("doc,message", [
    ({**A, "ops": []}, "has no ops; allowed: a non-empty list of ops"),
    (_without_phases(), "ops[0] has no phases object"),
], ids=["no-ops", "no-phases"])
def test_missing_ops_or_phases_never_pass(tmp_path, capsys, doc, message) -> None:
    """Two reports that both lack their ops (or an op its phases) compare as nothing:
    a check never passes on missing data."""
    a, b = write(tmp_path, "a.json", doc), write(tmp_path, "b.json", doc)
    assert main(["compare", a, b]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"npusim: error: {a}: {message}" + (
        " (a check never passes on missing data)\n" if "ops;" in message else "\n")


@pytest.mark.parametrize("tol", ["nan", "NaN%", "inf", "-1", "-5%", "1e999"])
def test_a_tolerance_that_is_not_a_finite_number_is_refused(tmp_path, capsys, tol) -> None:
    slow = report(280.0, {"send_data": (0.0, 4.0), "wait_status": (4.0, 6.0)})  # 28x
    a, b = write(tmp_path, "a.json", A), write(tmp_path, "b.json", slow)
    assert main(["compare", a, b, f"--tolerance={tol}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tolerance" in err and "finite number" in err


def test_baseline_compares_like_its_report() -> None:
    base = baseline_of(A)
    assert base["schema"] == "npusim.baseline/1" and base["scenario"] == "s"
    assert base["ops"] == [{"op": "dispatch", "latency_us": 10.0, "phases": {
        "send_data": {"start_us": 0.0, "end_us": 4.0},
        "wait_status": {"start_us": 4.0, "end_us": 6.0}}}]
    cmp = compare_profiles(profile_of(base, "base"), profile_of(B, "b"), 0.05)
    assert rows(cmp) == rows(compare_profiles(profile_of(A, "a"), profile_of(B, "b"), 0.05))


def write(tmp: Path, name: str, doc: Any) -> str:
    path = tmp / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write(tmp_path, "a.json", A), write(tmp_path, "b.json", B)
    assert main(["compare", a, b]) == 1
    out = capsys.readouterr().out
    assert "send_data duration" in out and "REGRESSED" in out
    assert main(["compare", a, b, "--tolerance", "10%"]) == 0
    assert main(["compare", a, b, "--tolerance", "0.1", "--strict"]) == 1  # faster counts
    assert main(["compare", a, a, "--strict"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(("doc", "message"), [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ({"schema": "other/1", "ops": []}, "not an npusim report"),
    ([1, 2], "not an npusim report"),
    ({"schema": "npusim.report/1", "ops": [{"op": "dispatch", "latency_us": "x"}]},
     "latency_us is not a number"),
    (report(1.0, {}, op="combine"), "not comparable"),
], ids=["missing", "not-json", "schema", "not-object", "bad-number", "other-ops"])
def test_unusable_input_exit_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, message: str
) -> None:
    a = write(tmp_path, "a.json", A)
    b = str(tmp_path / "b.json") if doc is None else write(tmp_path, "b.json", doc)
    assert main(["compare", a, b]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npusim: error: {b}: ") and message in err
    assert len(err.splitlines()) == 1


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path, capsys) -> None:
    """Reading a FIFO blocks until a writer comes: compare must not open one."""
    import os

    a = write(tmp_path, "a.json", A)
    fifo = tmp_path / "b.json"
    os.mkfifo(fifo)
    assert main(["compare", a, str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npusim: error: {fifo}: ") and "FIFO" in err
    assert len(err.splitlines()) == 1


def test_bad_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.json", A)
    assert main(["compare", a, a, "--tolerance", "five"]) == 2
    assert "--tolerance" in capsys.readouterr().err
    with pytest.raises(UnusableInput):
        compare_profiles(profile_of(A, "a"), profile_of(report(1.0, {}, op="combine"), "b"), 0)


def test_halved_egress_regresses_the_phase_that_moves_the_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user would: run two scenarios that differ only in fabric.egress_gbps (halved;
    fast put ports so the shared egress link is the bottleneck), compare them."""
    examples = ROOT / "scenarios" / "examples"
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(examples / "link_bound.yaml"), "--out", str(a)]) == 0
    assert main(["run", str(examples / "link_bound_half_egress.yaml"), "--out", str(b)]) == 0
    capsys.readouterr()
    ra = json.loads((a / "report.json").read_text())
    rb = json.loads((b / "report.json").read_text())
    egress = [rep["hardware"]["fabric"]["egress_gbps"] for rep in (ra, rb)]
    assert egress[1] == egress[0] / 2
    assert ra["scenario"]["workload"] == rb["scenario"]["workload"]
    for op in rb["ops"]:  # the halved link is what the diagnosis names
        assert op["diagnosis"]["kind"] == "bytes-bound", op["diagnosis"]
        assert op["diagnosis"]["resource"] == "egress"
        assert "die egress" in op["diagnosis"]["text"]
    assert main(["compare", str(a / "report.json"), str(b / "report.json")]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out
    cmp = compare_profiles(profile_of(ra, "a"), profile_of(rb, "b"), 0.05)
    slower = {(r.op, r.metric) for r in cmp.slower}
    assert {("dispatch", "send_data duration"), ("combine", "send_data duration"),
            ("dispatch", "latency"), ("combine", "latency")} <= slower
    # phases that move no bytes over the fabric keep their duration
    unchanged = {(r.op, r.metric) for r in cmp.rows if r.status == "ok"}
    assert ("dispatch", "send_status duration") in unchanged


NEG = report(10.0, {"send_data": (0.0, 4.0)})
NEG["ops"][0]["latency_us"] = -12.7
BACKWARDS = report(10.0, {"send_data": (4.0, 3.0)})
NO_PHASES = {**A, "ops": [{"op": "dispatch", "latency_us": 10.0}]}
LONG_INT = json.dumps(A).replace('"latency_us": 10.0', '"latency_us": ' + "9" * 400)
DEEP = '{"schema": "npusim.report/1", "ops": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize(("doc", "names"), [
    (NEG, "ops[0].latency_us is -12.7; allowed: a finite number >= 0"),
    (report(10.0, {"send_data": (-1.0, 4.0)}), "ops[0].phases.send_data.start_us is -1.0"),
    (BACKWARDS, "ops[0].phases.send_data ends at 3.0 us before it starts at 4.0 us"),
    (NO_PHASES, "ops[0] has no phases object"),
    (LONG_INT, "holds an integer of 400 digits; allowed: at most 30"),
    (DEEP, "nested deeper than Python can read"),
], ids=["negative-latency", "negative-start", "end-before-start", "no-phases", "400-digits",
        "100000-brackets"])
def test_a_figure_no_run_can_give_is_unusable_on_either_side(tmp_path, capsys, doc, names):
    """A negative latency once read as "-227% faster", exit 0; a 400-digit integer and deep
    nesting were OverflowError and RecursionError tracebacks."""
    good = write(tmp_path, "a.json", A)
    bad = write(tmp_path, "b.json", doc)
    before = sorted(tmp_path.iterdir())
    for argv in (["compare", good, bad], ["compare", bad, good]):
        assert main(argv) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err.count("\n") == 1, cap.err
        assert cap.err.startswith(f"npusim: error: {bad}: ") and names in cap.err
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("text", [LONG_INT, DEEP], ids=["400-digits", "100000-brackets"])
def test_plot_reads_a_report_as_compare_does(tmp_path, capsys, text):
    bad = write(tmp_path, "b.json", text)
    assert main(["plot", bad, "--out", str(tmp_path / "p.png")]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and cap.err.startswith(f"npusim: error: {bad}: "), cap.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


@pytest.mark.parametrize("value", [10**400, -(10**5000)], ids=["past-float", "past-str"])
def test_an_integer_past_float_range_in_a_document_is_unusable(value) -> None:
    """profile_of serves documents not read from a file too (the API, a sweep's points):
    an integer float() cannot hold was an OverflowError traceback."""
    doc = report(10.0, {"send_data": (0.0, 4.0)})
    doc["ops"][0]["latency_us"] = value
    with pytest.raises(UnusableInput, match=r"ops\[0\]\.latency_us is -?<an integer of about"):
        profile_of(doc, "doc")
