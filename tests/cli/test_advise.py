"""npusim advise: ranking, ties and crossovers by construction; the calibration status it
prints; one-line refusals; and the shipped compare pair's conclusion through advise."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import npusim.api as npu
from npusim import advise
from npusim.advise import Calibration, Candidate, Entry
from npusim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _entry(name: str, dispatch: float, combine: float, slow_phase: float = 0.0) -> Entry:
    phases = {"dispatch": {"send": (0.0, dispatch / 2), "wait": (dispatch / 2, dispatch)},
              "combine": {"send": (0.0, combine - slow_phase), "sum": (combine - slow_phase,
                                                                       combine)}}
    return Entry(Candidate(name, "", "none", "none"), {"dispatch": dispatch, "combine": combine},
                 dispatch + combine, "combine.sum", phases, 0, None)


CAL = Calibration("p", 0.05, {})


def test_the_fastest_wins_and_why_names_the_op_and_phase():
    r = advise.rank([_entry("slow", 50, 70, slow_phase=30), _entry("fast", 50, 40, 5)], CAL)
    assert [e.candidate.family for e in r.entries] == ["fast", "slow"]
    assert r.tied == 1
    why = r.why()
    # 120 - 90 = 30 us, 30 / 120 = 25%; all of it in combine, whose sum phase is 5 vs 30 us
    assert why.startswith("fast (none/none) wins by 30.0 us (25%) over slow (none/none)")
    assert "combine (+30.0 us)" in why and "sum 5.0 vs 30.0 us" in why


def test_a_difference_within_the_validation_error_is_a_tie():
    # 100 vs 104: 4% apart, under a 5% MAPE; 100 vs 106 is not
    r = advise.rank([_entry("a", 50, 50), _entry("b", 52, 52), _entry("c", 53, 53)], CAL)
    assert r.tied == 2
    assert r.why().startswith("tie: a (none/none), b (none/none) are within 5.0%")
    uncal = Calibration("p", None, {})
    assert uncal.tie == advise.UNCALIBRATED_TIE and uncal.status == "uncalibrated"
    assert advise.rank([_entry("a", 50, 50), _entry("c", 53, 53)], uncal).tied == 2


def test_the_crossover_is_where_the_winner_changes():
    # A: 10 + 1 us per token; B: 40 + 0.5 us per token: B wins from BS 60 on (BS 64 here)
    def at(bs: int) -> advise.Ranking:
        return advise.rank([_entry("A", 5 + bs / 2, 5 + bs / 2),
                            _entry("B", 20 + bs / 4, 20 + bs / 4)], Calibration("p", 0.0, {}))

    ranked = [(bs, at(bs)) for bs in (8, 32, 64, 128)]
    assert [w for _, w in advise.winners(ranked)] == ["A (none/none)"] * 2 + ["B (none/none)"] * 2
    assert advise.crossovers(ranked, "workload.bs", "p") == [
        "from BS 64, B (none/none) beats A (none/none) on p"]


def test_the_calibration_status_is_the_mape_given_and_the_tables_shapes():
    cal = advise.calibration_of("ascend950", mape=0.0321)
    assert cal.mape == 0.0321 and cal.status == "calibrated (MAPE 3.2%)"
    assert advise.calibration_of("ascend950").mape is None  # nothing computed: no claim
    assert not list((ROOT / "configs/targets").glob("*.yaml"))  # no figure copied to a file
    rows = list(csv.DictReader((ROOT / "configs/targets/ascend950.csv").open()))
    sample = [r for r in rows if not r["kernel"]]  # the table's default family
    bs = sorted(int(r["bs"]) for r in sample)
    assert cal.ranges["cann_sample"]["bs"] == (bs[0], bs[-1])
    assert cal.outside("cann_sample", {"bs": bs[-1] * 2, "ep_world_size": 8}) is not None
    assert cal.outside("cann_sample", {"bs": bs[0], "ep_world_size": 8, "h": 7168,
                                       "k": 8}) is None
    assert "no row" in cal.outside("mc2", {"bs": 8})
    assert advise.calibration_of("atlas_a2").mape is None


def test_every_family_with_variants_declares_its_quantisations():
    cands, missing = advise.candidates(("none",), ("none",))
    fams = {c.family for c in cands}
    assert {"cann_sample", "mc2", "shmem_classic", "shmem_doubleplane"} <= fams
    assert not missing
    assert {c.variant for c in cands if c.family == "mc2"} == {"fullmesh_v1", "fullmesh_v2"}
    cands, missing = advise.candidates(("mxfp8",), ("none",))
    assert "shmem_classic" in dict(missing)  # the examples move tokens unquantised


FAMILY = '''
"""A family whose kernels spend BASE + PER_TOKEN * BS scalar cycles on one core."""
from dataclasses import dataclass

from npusim.api import Family, Kernel, MoeShape, Phase, Variant

BASE, PER_TOKEN = {base}, {per_token}


@dataclass(frozen=True)
class Tiling:
    shape: MoeShape
    cores: int = 1

    @property
    def world(self):
        return self.shape.W


class Window:
    def regions(self):
        return {{"unused": (0, 64)}}


class Spend(Kernel):
    phases = (Phase("work", "core 0"),)

    def program(self, t):
        def program(ctx):
            with ctx.phase("work"):
                ctx.scalar(BASE + PER_TOKEN * t.shape.BS)
                yield from ctx.drain()
        return program


class Dispatch(Spend):
    name = "dispatch"


class Combine(Spend):
    name = "combine"


class Fixed(Family):
    name = "{name}"
    ops = (Dispatch(), Combine())
    runs = {{"dispatch_combine": ("dispatch", "combine")}}
    variants = (Variant(""),)
    dispatch_quants = {{"none": {{}}}}
    combine_quants = {{"none": {{}}}}

    def tiling(self, shape, options, hardware, timing_only=False):
        return Tiling(shape)

    def window(self, tiling):
        return Window()

    def make_inputs(self, shape, options, op, routing, payload):
        return [{{}} for _ in range(shape.W)]


FAMILY = Fixed()
'''
SHAPE = """name: fixed
hardware_overrides: {chip.clock_ghz: 1.0, scalar.cycles_per_op: 1.0, kernel.launch_ns: 0.0,
                     kernel.block_stagger_ns: 0.0}
workload: {op: dispatch_combine, bs: 8, h: 7168, k: 8, ep_world_size: 2, experts_per_rank: 4}
"""


def test_two_families_of_known_latency_rank_tie_and_cross(tmp_path, capsys, monkeypatch):
    """quick: 500 + 10 BS ns per op, steady: 1500 + 2.5 BS (1 cycle per scalar op at 1 GHz,
    no launch cost). They cross at BS 133; at BS 128 they are 3.56 vs 3.64 us, 2% apart,
    a tie within the 10% of a preset whose values are overridden (uncalibrated)."""
    for name, base, per in (("quick", 500, 10), ("steady", 1500, 2.5)):
        (tmp_path / f"{name}.py").write_text(FAMILY.format(name=name, base=base, per_token=per))
    (tmp_path / "shape.yaml").write_text(SHAPE)
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "shape.yaml", "--family", "quick.py", "--family", "steady.py",
                 "--over", "bs=8,64,128,256", "--json", "--quiet", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["status"] == f"uncalibrated ({advise.OVERRIDDEN})"
    expect = {"quick": lambda bs: 2 * (500 + 10 * bs) / 1000,
              "steady": lambda bs: 2 * (1500 + 2.5 * bs) / 1000}
    order = []
    for pt in doc["points"]:
        ranking = pt["ranking"]
        for r in ranking:
            assert r["total_us"] == pytest.approx(expect[r["family"]](pt["value"]), abs=1e-4)
        order.append([(r["family"], r["tie"]) for r in ranking])
    assert order == [[("quick", False), ("steady", False)], [("quick", False), ("steady", False)],
                     [("quick", True), ("steady", True)], [("steady", False), ("quick", False)]]
    assert doc["crossovers"] == [
        "from BS 128, tie: quick (none/none), steady (none/none) (before: quick (none/none)) "
        "on ascend950",
        "from BS 256, steady (none/none) (before: tie: quick (none/none), steady (none/none)) "
        "on ascend950"]


@pytest.mark.parametrize("argv, key", [
    (["--set", "workload.bs=0"], "workload.bs"),
    (["--set", "workload.kernel=mc2"], "--set workload.kernel"),
    (["--dispatch-quant", "fp4"], "--dispatch-quant"),
    (["--over", "bs="], "--over"),
    (["--over", "bs=8,8"], "--over"),
    (["--family", "cann_gelu"], "--family"),
    (["--set", "hardware=nope"], "hardware"),
])
def test_bad_shapes_are_one_line_exit_2(argv, key, capsys, tmp_path):
    assert main(["advise", *argv, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
    assert not (tmp_path / "o").exists()


@pytest.fixture
def small_tables(tmp_path, monkeypatch) -> Path:
    """One-row calibration tables for both calibrated presets: an advice simulates its
    preset's table, and the shipped ones take minutes."""
    folder = tmp_path / "targets"
    folder.mkdir()
    for preset in ("ascend950", "atlas_a3"):
        (folder / f"{preset}.csv").write_text(f"{TABLE_HEADER}\n{TABLE_ROW}\n")
    monkeypatch.setattr("npusim.shipped.targets_dir", lambda: folder)
    return folder


TABLE_HEADER = "op,bs,h,k,ep_world_size,experts_per_rank,dtype,dispatch_quant,measured_us"
TABLE_ROW = "dispatch,8,1024,4,2,4,float16,none,10.0"
ROW_SCENARIO = {"name": "row", "hardware": "ascend950",
                "workload": {"op": "dispatch", "bs": 8, "h": 1024, "k": 4,
                             "ep_world_size": 2, "experts_per_rank": 4, "dtype": "float16",
                             "dispatch_quant": "none", "timing_only": True}}


def test_the_shipped_compare_pairs_conclusion_comes_out_the_same(tmp_path, capsys,
                                                                 small_tables):
    direct = {}
    for fam in ("cann_sample", "mc2"):
        run = npu.run(f"mc2/compare_a3_ep8_{fam}", timing_only=True)
        direct[fam] = run.latency_us()
    faster = min(direct, key=direct.get)
    out = tmp_path / "advice.json"
    assert main(["advise", "mc2/compare_a3_ep8_mc2", "--dispatch-quant", "int8",
                 "--family", "cann_sample", "--family", "mc2", "--out", str(tmp_path / "runs"),
                 "--json", "--quiet", "--workers", "1"]) == 0
    out.write_text(capsys.readouterr().out)
    doc = json.loads(out.read_text())
    totals = {r["family"]: r["total_us"] for r in doc["points"][0]["ranking"]
              if r["variant"] in ("", "fullmesh_v1")}
    assert totals == pytest.approx(direct, abs=1e-3)
    assert min(totals, key=totals.get) == faster
    # resumed: a second call runs nothing and gives the same document
    assert main(["advise", "mc2/compare_a3_ep8_mc2", "--dispatch-quant", "int8",
                 "--family", "cann_sample", "--family", "mc2", "--out", str(tmp_path / "runs"),
                 "--json", "--quiet", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_the_table_the_plot_and_the_axis(tmp_path, capsys, small_tables):
    png = tmp_path / "over.png"
    assert main(["advise", "--family", "cann_sample", "--dispatch-quant", "none,mxfp8",
                 "--over", "bs=8,64", "--out", str(tmp_path / "runs"), "--quiet",
                 "--plot", str(png), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("advise: ascend950, calibrated (MAPE ")
    assert "%); W 8, BS 8" in text.splitlines()[0]
    assert "workload.bs = 8" in text and "workload.bs = 64" in text
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", ["ABS", "../../x", "a/b", ".hidden"])
def test_a_shape_name_that_is_not_a_plain_file_name_is_refused(name, tmp_path, capsys,
                                                                monkeypatch):
    """The name is the default out/advise/<name> folder: `run` and `sweep` refuse a path
    there, and so does advise, before anything runs or is written."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    monkeypatch.chdir(work)
    name = str(outside) if name == "ABS" else name
    assert main(["advise", "--set", f"name={name}", "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set name" in err[0] and "folder name" in err[0], err
    assert list(work.iterdir()) == [] and not outside.exists()


def test_a_shape_files_name_is_checked_too(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shape.yaml").write_text("name: ../esc\nworkload: {op: dispatch, bs: 8}\n")
    assert main(["advise", "shape.yaml", "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("npusim: error: shape.yaml: name: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shape.yaml"]


def _simulated_row_us(tmp_path: Path) -> float:
    """The table row's latency as `npusim run` gives it for the same scenario."""
    import yaml

    path = tmp_path / "row.yaml"
    path.write_text(yaml.safe_dump(ROW_SCENARIO))
    return npu.run(str(path), timing_only=True).latency_us("dispatch")


def test_the_mape_is_computed_from_the_table_by_the_advice(tmp_path, capsys, monkeypatch,
                                                           small_tables):
    """The preset's table rows run with the candidates; the MAPE shown is theirs now
    (|simulated - measured| / measured of the one row), not a figure read from a file."""
    (tmp_path / "quick.py").write_text(FAMILY.format(name="quick", base=500, per_token=10))
    (tmp_path / "shape.yaml").write_text(
        "name: fixed\nworkload: {op: dispatch_combine, bs: 8, h: 7168, k: 8, "
        "ep_world_size: 2, experts_per_rank: 4}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "shape.yaml", "--family", "quick.py", "--json", "--quiet",
                 "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = abs(_simulated_row_us(tmp_path) - 10.0) / 10.0
    assert doc["calibration"]["mape"] == pytest.approx(want, rel=1e-4)
    assert doc["calibration"]["status"] == f"calibrated (MAPE {want:.1%})"
    assert "1 rows of ascend950.csv" in doc["calibration"]["basis"]
    assert doc["points"][0]["ranking"][0]["calibration"] == f"calibrated (MAPE {want:.1%})"


def test_a_point_along_hardware_overrides_is_not_called_calibrated(tmp_path, capsys,
                                                                   monkeypatch, small_tables):
    """--over hardware_overrides.KEY changes the preset at every point: none of them is
    the validated preset, so none is "calibrated", and its table is not simulated."""
    (tmp_path / "quick.py").write_text(FAMILY.format(name="quick", base=500, per_token=10))
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "quick.py", "--over",
                 "hardware_overrides.chip.clock_ghz=1.0,2.0", "--out", "runs", "--quiet",
                 "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "calibrated (MAPE" not in text and "  calibrated" not in text
    assert text.startswith(f"advise: ascend950, uncalibrated ({advise.OVERRIDDEN}); ")
    assert text.count(f"uncalibrated ({advise.OVERRIDDEN})") == 1 + 2  # header, two rows
    assert not [p for p in (tmp_path / "runs" / "points").iterdir()
                if p.name.startswith("validate-")]


def test_a_preset_file_of_a_calibrated_name_is_not_called_calibrated(tmp_path, capsys,
                                                                     monkeypatch, small_tables):
    """A copy of the 950 preset, edited or not, is not the preset the table validates."""
    (tmp_path / "quick.py").write_text(FAMILY.format(name="quick", base=500, per_token=10))
    (tmp_path / "mine.yaml").write_text((ROOT / "configs/ascend950.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "quick.py", "--set", "hardware=mine.yaml",
                 "--out", "runs", "--quiet", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"advise: ascend950, uncalibrated ({advise.OWN_FILE}); ")
    assert not [p for p in (tmp_path / "runs" / "points").iterdir()
                if p.name.startswith("validate-")]


@pytest.mark.parametrize("value", ["mine.yaml", "sub dir/mine.yaml"])
def test_a_preset_file_along_over_hardware_runs_uncalibrated(value, tmp_path, capsys,
                                                             monkeypatch, small_tables):
    """--over hardware=PRESET,FILE: a point's name comes from the axis value, and a path is no
    plain file name; the file's point still runs, and is not called calibrated."""
    (tmp_path / "quick.py").write_text(FAMILY.format(name="quick", base=500, per_token=10))
    (tmp_path / value).parent.mkdir(exist_ok=True)
    (tmp_path / value).write_text((ROOT / "configs/ascend950.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "quick.py", "--over", f"hardware=ascend950,{value}",
                 "--out", "runs", "--json", "--quiet", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_value = {p["value"]: p for p in doc["points"]}
    own = by_value[value]
    assert [r["family"] for r in own["ranking"]] == ["quick"]
    assert own["calibration"]["status"] == f"uncalibrated ({advise.OWN_FILE})"
    assert own["ranking"][0]["calibration"] == f"uncalibrated ({advise.OWN_FILE})"
    assert by_value["ascend950"]["calibration"]["status"].startswith("calibrated (MAPE ")
    names = [p.name for p in (tmp_path / "runs" / "points").iterdir()]
    assert len(names) == 3 and all("/" not in n and " " not in n for n in names)


def test_a_value_no_candidate_can_run_is_not_called_calibrated(tmp_path, capsys, monkeypatch,
                                                               small_tables):
    """--over hardware=PRESET,MISSING: the missing file's value runs nothing, so no table
    vouches for it; it must not borrow the first preset's calibration."""
    (tmp_path / "quick.py").write_text(FAMILY.format(name="quick", base=500, per_token=10))
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "quick.py", "--over", "hardware=ascend950,missing.yaml",
                 "--out", "runs", "--json", "--quiet", "--workers", "1"]) == 0
    by_value = {p["value"]: p for p in json.loads(capsys.readouterr().out)["points"]}
    assert by_value["missing.yaml"]["ranking"] == []
    assert by_value["missing.yaml"]["calibration"]["status"] == (
        f"uncalibrated ({advise.NOTHING_RAN})")
    assert by_value["ascend950"]["calibration"]["status"].startswith("calibrated (MAPE ")


KV_SHAPE = {"name": "kv", "hardware": "atlas_a3",
            "workload": {"kernel": "kv_offload", "op": "gather", "batch": 1, "seq_len": 300,
                         "topk": 64, "block": 16, "c8": True, "memory": "swapped"}}


def _kv_advice(tmp_path, capsys, overrides=None) -> dict:
    shape = {**KV_SHAPE, **({"hardware_overrides": overrides} if overrides else {})}
    path = tmp_path / "kv.yaml"
    path.write_text(json.dumps(shape))
    assert main(["advise", str(path), "--out", str(tmp_path / "runs"), "--json", "--quiet",
                 "--workers", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_family_whose_options_are_its_shape_compares_its_variants(tmp_path, capsys,
                                                                   small_tables):
    """kv_offload's shape is its own options; its variants are the two host allocations.
    The full cache (304 rows x 656 B: 49 pages of 4 KiB, one of 2 MiB) fits the 2048
    translations a die keeps, so neither walks and they tie; no row of atlas_a3's table
    covers them, so the tie is the uncalibrated one, and the row says what it rests on."""
    doc = _kv_advice(tmp_path, capsys)
    assert doc["shape"]["batch"] == 1 and doc["shape"]["c8"] is True
    (pt,) = doc["points"]
    assert {r["variant"] for r in pt["ranking"]} == {"shmem_host", "swapped"}
    assert all(r["tie"] for r in pt["ranking"])
    assert pt["ranking"][0]["total_us"] == pt["ranking"][1]["total_us"]
    assert {r["outside_calibration"] for r in pt["ranking"]} == {
        "kv_offload has no row in atlas_a3's table"}
    assert "10.0%" in pt["why"] and "no row of its table" in pt["why"]
    rests = pt["ranking"][0]["rests_on"]
    assert "host.page_walk_ns 1000 ns (assumed, plausible 200-5000)" in rests
    assert any(r.startswith("host.latency_ns ") and "calibrated" in r for r in rests)
    assert not doc["refused"]  # the MoE families are not asked to run a kv_offload shape


def test_the_variants_differ_by_the_walks_of_the_swapped_pages(tmp_path, capsys,
                                                               small_tables):
    over = {"host.tlb_entries": 2, "host.walkers": 1, "host.page_walk_ns": 1000.0}
    doc = _kv_advice(tmp_path, capsys, over)
    got = {r["variant"]: r["total_us"] for r in doc["points"][0]["ranking"]}
    direct = {}
    for memory in got:
        shape = {**KV_SHAPE, "hardware_overrides": over}
        shape["workload"] = {**shape["workload"], "memory": memory, "timing_only": True}
        path = tmp_path / f"{memory}.yaml"
        path.write_text(json.dumps(shape))
        direct[memory] = npu.run(str(path)).latency_us()
    assert got == pytest.approx(direct, abs=1e-3)
    assert got["swapped"] > got["shmem_host"] * 1.1  # beyond the uncalibrated tie
    assert doc["points"][0]["ranking"][0]["variant"] == "shmem_host"
