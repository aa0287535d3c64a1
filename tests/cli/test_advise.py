"""npusim advise: ranking, ties and crossovers by construction; each candidate's band
from its own ledger and the measurement that would break a tie; one-line refusals; and the
shipped compare pair's conclusion through advise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import npusim.api as npu
from npusim import advise, advise_rank
from npusim.advise import Candidate
from npusim.advise_rank import Band, Entry
from npusim.cli import main
from npusim.fidelity import DEFAULT_BAND, Ledger, TableFit
from npusim.fidelity import run as fidelity_run

ROOT = Path(__file__).resolve().parents[2]
UNCAL = Band(0.25, "uncalibrated, assumed ±25%", ("dispatch", "combine"))
WHERE = "p at BS 8, H 7168, K 8, EP 8"


def _entry(name: str, dispatch: float, combine: float, slow_phase: float = 0.0,
           band: Band = UNCAL) -> Entry:
    phases = {"dispatch": {"send": (0.0, dispatch / 2), "wait": (dispatch / 2, dispatch)},
              "combine": {"send": (0.0, combine - slow_phase), "sum": (combine - slow_phase,
                                                                       combine)}}
    return Entry(Candidate(name, "", "none", "none"), {"dispatch": dispatch, "combine": combine},
                 dispatch + combine, "combine.sum", phases, 0, band, "dispatch_combine", WHERE)


def _calibrated(worst: float) -> Band:
    return Band(worst, f"t table, worst row r ±{worst:.0%}")


def test_a_lead_outside_both_bands_is_a_win_and_why_names_the_op_and_phase():
    r = advise_rank.rank([_entry("slow", 50, 90, slow_phase=50), _entry("fast", 50, 40, 5)])
    assert [e.candidate.family for e in r.entries] == ["fast", "slow"]
    assert len(r.tied) == 1
    why = r.why()
    # 140 - 90 = 50 us, 50 / 90 = 55.6% > 25%; all of it in combine, whose sum phase is 5 vs
    # 50 us
    assert why.startswith("fast (none/none) wins by 50.0 us (55.6%) over slow (none/none), "
                          "outside both bands (±25%, ±25%)")
    assert "combine (+50.0 us)" in why and "sum 5.0 vs 50.0 us" in why


def _kernels(name: str, ops: dict[str, float]) -> Entry:
    """An entry of its own kernels, each one phase long."""
    return Entry(Candidate(name, "", "none", "none"), ops, sum(ops.values()),
                 f"{max(ops, key=ops.get)}.run", {op: {"run": (0.0, us)} for op, us in ops.items()},
                 0, UNCAL, "moe_layer", WHERE)


def test_a_win_over_other_kernels_lists_both_sides_kernels():
    # a fused kernel of 60 us against a chain of 30 + 50 + 20 = 100 us: no op in common,
    # 40 us (66.7% of 60) outside both 25% bands
    why = advise_rank.rank([_kernels("chain", {"a": 30.0, "b": 50.0, "c": 20.0}),
                            _kernels("fused", {"f": 60.0})]).why()
    assert why == ("fused (none/none) wins by 40.0 us (66.7%) over chain (none/none), outside "
                   "both bands (±25%, ±25%): f 60.0 us against b 50.0, a 30.0, c 20.0 us")


def test_a_win_mostly_in_a_kernel_the_winner_skips_names_it():
    # shared a (30 vs 32 us); the runner-up also runs b (50 us): 52 us more, b holds +50
    why = advise_rank.rank([_kernels("one", {"a": 30.0}),
                            _kernels("two", {"a": 32.0, "b": 50.0})]).why()
    assert why.endswith("most of it in b (+50.0 us), which the winner does not run")


def test_the_larger_band_of_the_two_decides_a_tie():
    # 100 vs 110 us: 10% apart; bands 5% and 25%: within the larger -> a tie
    a, b = _entry("a", 50, 50, band=_calibrated(0.05)), _entry("b", 55, 55)
    assert advise_rank.ties(a, b) and advise_rank.ties(b, a)
    # 100 vs 140 with 25% (and 5%): 40% apart, outside both -> not a tie
    c = _entry("c", 70, 70)
    assert not advise_rank.ties(a, c) and not advise_rank.ties(_entry("d", 50, 50), c)
    # both calibrated at 5%: 100 vs 110 is no tie any more
    assert not advise_rank.ties(a, _entry("e", 55, 55, band=_calibrated(0.05)))
    r = advise_rank.rank([b, c, a])
    assert [e.candidate.family for e in r.tied] == ["a", "b"]
    assert r.places() == [(1, True), (1, True), (3, False)]
    why = r.why()
    assert why.startswith("tie: a (none/none), b (none/none) are 10.0 us (10%) apart, within "
                          "±25% (b (none/none)'s band, the larger: uncalibrated")
    # only b is uncalibrated: measuring it (its two ops, i.e. the shape's op) breaks the tie
    assert why.endswith(f"; a measured b dispatch_combine on {WHERE} would break it")
    for word in ("wins", "beats", "fastest"):
        assert word not in why


def test_a_tie_of_calibrated_candidates_says_only_closer_measurements_break_it():
    r = advise_rank.rank([_entry("a", 50, 50, band=_calibrated(0.05)),
                          _entry("b", 51, 51, band=_calibrated(0.03))])
    assert r.why().endswith("every one is calibrated here: only measurements closer than "
                            "±5% would break it")


def test_groups_after_the_first_are_read_from_their_head():
    # 100, 120 (tie with 100 at 25%), 130 (30% from 100: a new head), 160 (23% from 130)
    r = advise_rank.rank([_entry(n, t / 2, t / 2) for n, t in
                          (("a", 100), ("b", 120), ("c", 130), ("d", 160))])
    assert [[e.candidate.family for e in g] for g in r.groups] == [["a", "b"], ["c", "d"]]
    assert r.places() == [(1, True), (1, True), (3, True), (3, True)]
    # three that all tie and all lack the same measurement are not named twice
    three = advise_rank.rank([_entry(n, t / 2, t / 2) for n, t in
                              (("a", 100), ("b", 110), ("c", 120))])
    assert three.why().endswith(f"; a measured dispatch_combine of each on {WHERE} would "
                                "break it")


def test_a_candidates_band_is_its_worst_op_and_names_its_source():
    fit = TableFit("atlas_a3", rows=4, simulated=4, mape=0.03, worst=0.07,
                   worst_row="ep8_bs128", inside=True)
    outside = TableFit("atlas_a3", rows=4, simulated=4, mape=0.03, worst=0.07,
                       worst_row="ep8_bs128", inside=False, outside_why="bs 8 is below 128")
    dispatch = Ledger("fam", "atlas_a3", "dispatch", (fit,))
    combine = Ledger("fam", "atlas_a3", "combine", (outside,))
    both = advise_rank.band_of([dispatch, dispatch], 0.10)
    assert both.value == 0.07 and not both.unvouched
    assert both.source == "atlas_a3 table, worst row ep8_bs128 ±7%"
    mixed = advise_rank.band_of([dispatch, combine], 0.10)
    assert mixed.value == 0.10 and mixed.unvouched == ("combine",)
    assert mixed.source == "uncalibrated (bs 8 is below 128), assumed ±10%"
    # a calibrated op whose worst row is beyond the assumed band keeps its own
    assert advise_rank.band_of([dispatch, combine], 0.05).value == 0.07
    assert _entry("fam", 50, 50, band=mixed).unmeasured() == "combine"
    assert _entry("fam", 50, 50).unmeasured() == "dispatch_combine"  # all of its ops


def test_a_tie_names_each_uncalibrated_candidate_by_what_it_lacks():
    """Quantised candidates by their quantisation too; one with a vouched op by the rest."""
    fit = TableFit("t", 1, 1, 0.01, 0.02, "r", True)
    half = advise_rank.band_of([Ledger("b", "p", "dispatch", (fit,)),
                                Ledger("b", "p", "combine")], 0.25)
    a = Entry(Candidate("a", "v", "int8", "none"), {"dispatch": 50.0, "combine": 50.0}, 100.0,
              "combine.sum", {}, 0, UNCAL, "dispatch_combine", WHERE)
    b = _entry("b", 52, 52, band=half)
    why = advise_rank.rank([a, b]).why()
    assert why.endswith(f"; a measured a/v (int8/none) dispatch_combine and b (none/none) "
                        f"combine on {WHERE} would break it")


@pytest.mark.parametrize("text, want", [("25%", 0.25), ("0.25", 0.25), (" 5% ", 0.05),
                                        ("0.999", 0.999)])
def test_the_band_option_reads_a_fraction_or_a_percent(text, want):
    assert advise.band(text) == pytest.approx(want)
    assert DEFAULT_BAND == 0.25


def test_the_crossover_is_where_the_first_place_changes():
    # A: 10 + 1 us per token; B: 40 + 0.5 us per token, both calibrated at 1%
    def at(bs: int) -> advise_rank.Ranking:
        return advise_rank.rank([_entry("A", 5 + bs / 2, 5 + bs / 2, band=_calibrated(0.01)),
                                 _entry("B", 20 + bs / 4, 20 + bs / 4,
                                        band=_calibrated(0.01))])

    ranked = [(bs, at(bs)) for bs in (8, 32, 64, 128)]
    assert [w for _, w in advise_rank.winners(ranked)] == (["A (none/none)"] * 2
                                                           + ["B (none/none)"] * 2)
    assert advise_rank.crossovers(ranked, "workload.bs", "p") == [
        "from BS 64, B (none/none) beats A (none/none), outside both bands, on p"]


def test_every_moe_family_is_a_candidate_with_its_declared_quantisations():
    cands, missing = advise.candidates(("none",), ("none",))
    fams = {c.family for c in cands}
    assert {"cann_sample", "mc2", "shmem_classic", "shmem_doubleplane", "deepep",
            "tilelang_shmem", "pypto_shmem"} <= fams
    assert {c.variant for c in cands if c.family == "mc2"} == {"fullmesh_v1", "fullmesh_v2"}
    assert {(c.options["mode"], c.options["context"]) for c in cands
            if c.family == "deepep"} == {(m, x) for m in ("normal", "low_latency")
                                         for x in ("hccl", "shmem")}
    # MegaMoE's tokens always travel MXFP8, moe_layer's INT8: no unquantised candidate,
    # but a probe to ask the shape first
    assert {m.family for m in missing} == {"mega_moe", "mega_moe_unfused", "moe_layer"}
    assert all(m.probe is not None for m in missing)
    cands, missing = advise.candidates(("int8",), ("none",))
    assert {c.options["quant"] for c in cands if c.family == "deepep"} == {"int8"}
    assert "tilelang_shmem" in {m.family for m in missing}  # the example moves bf16 rows
    cands, _ = advise.candidates(("none",), ("int8",))
    assert "deepep" not in {c.family for c in cands}  # its combine is BF16 (comm_quant 0)


def test_mega_moe_runs_only_a_shape_of_its_op_and_each_other_family_is_refused_once():
    """op mega_moe with MXFP8 dispatch: MegaMoE's two modes plan; every other MoE family
    is refused once with the loader's line on the op (DeepEP's four variants included)."""
    shape = advise.shape_doc({**advise.DEFAULT_SHAPE, "workload": {
        **advise.DEFAULT_SHAPE["workload"], "op": "mega_moe", "dtype": "bfloat16"}})
    cands, missing = advise.candidates(("mxfp8",), ("none",))
    p = advise.plan(shape, "advise", ROOT, cands, missing)
    assert sorted(p.candidate_of[pt.name].variant for pt in p.points
                  if p.candidate_of[pt.name].family == "mega_moe") == ["e4m3", "e5m2"]
    assert {p.candidate_of[pt.name].family for pt in p.points} == {"mega_moe"}
    fams = [fam for _, fam, _, _ in p.refused]
    assert len(fams) == len(set(fams))  # once each
    assert {"deepep", "mc2", "cann_sample", "tilelang_shmem", "pypto_shmem",
            "mega_moe_unfused"} <= set(fams)
    assert all("workload.op: unknown value 'mega_moe'" in why for *_, why in p.refused)
    # unquantised, MegaMoE has no candidate, and at a dispatch_combine shape it says so by
    # the shape's op first
    _, missing = advise.candidates(("none",), ("none",))
    p = advise.plan(advise.shape_doc(advise.DEFAULT_SHAPE), "advise", ROOT, [], missing)
    why = {fam: w for _, fam, _, w in p.refused}
    assert why["mega_moe"] == "workload.op: unknown value 'dispatch_combine'; allowed: mega_moe"


def test_a_refusal_is_printed_once_with_the_values_it_holds_at():
    from npusim.report.advice import format_advice

    refused = [{"family": f, "variant": None, "quant": None, "value": v, "reason": why}
               for f, v, why in (("a", 8, "no"), ("a", 64, "no"), ("b", 8, "too big"))]
    doc = {"preset": "p", "uncalibrated_band": 0.25, "shape": {"bs": 8}, "axis": "workload.bs",
           "points": [{"value": 8, "why": "-", "ranking": []},
                      {"value": 64, "why": "-", "ranking": []}],
           "crossovers": [], "refused": refused}
    text = format_advice(doc)
    assert text.endswith("cannot run this shape:\n  a: no\n  b at workload.bs = 8: too big\n")


def test_a_long_critical_phase_keeps_the_columns_in_line():
    from npusim.report.advice import format_ranking

    crit = "shmem_low_latency_dispatch.wait_for_every_rank_to_write"  # 55 characters
    rows = [{"place": i + 1, "tie": False, "family": "f", "variant": v,
             "dispatch_quant": "int8", "combine_quant": "none", "total_us": t,
             "band": 0.25, "band_source": "assumed", "critical": c,
             "wire_bytes": 1_000_000, "ops_us": {"dispatch": t}}
            for i, (v, t, c) in enumerate((("a", 10.0, "dispatch.send"), ("b", 20.0, crit)))]
    header, first, second = format_ranking(rows)[:3]
    # the wire column starts at the same place in the header and in both rows
    at = header.index("wire MB") + len("wire MB")
    assert first[at - 4:at] == "1.00" and second[at - 4:at] == "1.00"
    assert crit in second


FAMILY = '''
"""A family whose kernels spend BASE + PER_TOKEN * BS scalar cycles on one core."""
from dataclasses import dataclass

from npusim.author import ExchangeFamily, Kernel, MoeShape, Phase, Variant

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


class Fixed(ExchangeFamily):
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


def _two_families(tmp_path: Path, monkeypatch) -> None:
    for name, base, per in (("quick", 500, 10), ("steady", 1500, 2.5)):
        (tmp_path / f"{name}.py").write_text(FAMILY.format(name=name, base=base, per_token=per))
    (tmp_path / "shape.yaml").write_text(SHAPE)
    monkeypatch.chdir(tmp_path)


def _advise_two(capsys, *extra: str) -> dict:
    assert main(["advise", "shape.yaml", "--family", "quick.py", "--family", "steady.py",
                 *extra, "--json", "--quiet", "--workers", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_families_of_known_latency_rank_tie_and_cross(tmp_path, capsys, monkeypatch):
    """quick: 500 + 10 BS ns per op, steady: 1500 + 2.5 BS (1 cycle per scalar op at 1 GHz,
    no launch cost). They cross at BS 133; at BS 128 they are 3.56 vs 3.64 us, 2% apart,
    a tie within the assumed 25% (no table of the preset has a row of either family); at
    BS 8, 64 and 256 they are 162%, 46% and 43% apart: no tie."""
    _two_families(tmp_path, monkeypatch)
    doc = _advise_two(capsys, "--over", "bs=8,64,128,256")
    assert doc["schema"] == "npusim.advice/2" and doc["uncalibrated_band"] == 0.25
    expect = {"quick": lambda bs: 2 * (500 + 10 * bs) / 1000,
              "steady": lambda bs: 2 * (1500 + 2.5 * bs) / 1000}
    order = []
    for pt in doc["points"]:
        ranking = pt["ranking"]
        for r in ranking:
            assert r["total_us"] == pytest.approx(expect[r["family"]](pt["value"]), abs=1e-4)
            assert r["band"] == 0.25
            assert r["band_source"] == (f"uncalibrated (ascend950's tables have no "
                                        f"{r['family']} row), assumed ±25%")
        order.append([(r["family"], r["tie"]) for r in ranking])
    assert order == [[("quick", False), ("steady", False)], [("quick", False), ("steady", False)],
                     [("quick", True), ("steady", True)], [("steady", False), ("quick", False)]]
    assert doc["crossovers"] == [
        "from BS 128, tie: quick (none/none), steady (none/none) (before: quick (none/none)) "
        "on ascend950",
        "from BS 256, steady (none/none) (before: tie: quick (none/none), steady (none/none)) "
        "on ascend950"]


def test_the_advice_names_the_tie_and_the_measurement_that_would_break_it(tmp_path, capsys,
                                                                          monkeypatch):
    """At BS 128 (2.2% apart) the tie names both uncalibrated candidates at the shape; a
    1% band splits them, and no text calls the first a winner inside the band."""
    _two_families(tmp_path, monkeypatch)
    assert main(["advise", "shape.yaml", "--family", "quick.py", "--family", "steady.py",
                 "--set", "workload.bs=128", "--quiet", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].endswith("; uncalibrated band ±25%")
    (why,) = [line for line in text.splitlines() if line.startswith("why: ")]
    assert why.startswith("why: tie: quick (none/none), steady (none/none) are 0.1 us (2.2%) "
                          "apart, within ±25% (")
    assert "uncalibrated (ascend950's tables have no quick row)" in why
    assert why.endswith("; a measured quick, steady dispatch_combine on ascend950 at BS 128, "
                        "H 7168, K 8, EP 2 would break it")
    for word in ("wins", "beats", "fastest"):
        assert word not in text
    doc = _advise_two(capsys, "--set", "workload.bs=128", "--band", "1%")
    assert [r["tie"] for r in doc["points"][0]["ranking"]] == [False, False]
    assert doc["points"][0]["why"].startswith("quick (none/none) wins by 0.1 us (2.2%) over "
                                              "steady (none/none), outside both bands (±1%, ±1%)")


def test_each_candidate_carries_its_own_ledgers_band(tmp_path, capsys, monkeypatch):
    """A ledger that vouches for quick (worst row 3%) leaves steady at the assumed 25%: the
    larger band still makes BS 128 a tie, and only steady's measurement would break it."""
    asked = []

    def ledger_of(family, preset, workload, op, off_preset=""):
        asked.append((family, preset, op, off_preset))
        if family != "quick":
            return Ledger(family, preset, op, why="no table row of it")
        fit = TableFit("quick_table", 3, 3, 0.02, 0.03, "q_bs128", True)
        return Ledger(family, preset, op, (fit,))

    monkeypatch.setattr(fidelity_run, "ledger_of", ledger_of)
    _two_families(tmp_path, monkeypatch)
    doc = _advise_two(capsys, "--set", "workload.bs=128")
    assert sorted(asked) == sorted((f, "ascend950", op, "")
                                   for f in ("quick", "steady") for op in ("dispatch",
                                                                            "combine"))
    rows = {r["family"]: r for r in doc["points"][0]["ranking"]}
    assert rows["quick"]["band"] == 0.03 and rows["quick"]["uncalibrated_ops"] == []
    assert rows["quick"]["band_source"] == "quick_table table, worst row q_bs128 ±3%"
    assert rows["steady"]["band_source"] == "uncalibrated (no table row of it), assumed ±25%"
    why = doc["points"][0]["why"]
    assert "(steady (none/none)'s band, the larger: uncalibrated" in why
    assert why.endswith("; a measured steady dispatch_combine on ascend950 at BS 128, H 7168, "
                        "K 8, EP 2 would break it")


@pytest.mark.parametrize("argv, key", [
    (["--set", "workload.bs=0"], "workload.bs"),
    (["--set", "workload.kernel=mc2"], "--set workload.kernel"),
    (["--dispatch-quant", "fp4"], "--dispatch-quant"),
    (["--over", "bs="], "--over"),
    (["--over", "bs=8,8"], "--over"),
    (["--family", "cann_gelu"], "--family"),
    (["--family", "hixl"], "--family"),
    (["--family", "nonesuch"], "--family"),
    (["--set", "hardware=nope"], "hardware"),
    (["--band", "0"], "--band"),
    (["--band", "-5%"], "--band"),
    (["--band", "nan"], "--band"),
    (["--band", "inf"], "--band"),
    (["--band", "100%"], "--band"),
    (["--band", "1"], "--band"),
    (["--band", "25"], "--band"),
    (["--band", "a lot"], "--band"),
    (["--set", "workload.op=mega_moe", "--family", "tilelang_shmem"], "workload.op"),
    (["--set", "workload.op=nonesuch"], "no kernel family runs this shape"),
])
def test_bad_input_is_one_line_exit_2(argv, key, capsys, tmp_path):
    assert main(["advise", *argv, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
    assert not (tmp_path / "o").exists()


def test_the_shipped_compare_pairs_conclusion_comes_out_the_same(tmp_path, capsys):
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


def test_the_table_the_plot_and_the_axis(tmp_path, capsys):
    png = tmp_path / "over.png"
    assert main(["advise", "--family", "cann_sample", "--dispatch-quant", "none,mxfp8",
                 "--over", "bs=8,64", "--out", str(tmp_path / "runs"), "--quiet",
                 "--plot", str(png), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("advise: ascend950; W 8, BS 8")
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


def _bands(doc: dict, value=None) -> set[str]:
    pts = [p for p in doc["points"] if value is None or p["value"] == value]
    return {r["band_source"] for p in pts for r in p["ranking"]}


def test_a_point_along_hardware_overrides_is_not_vouched_for(tmp_path, capsys, monkeypatch):
    """--over hardware_overrides.KEY changes the preset at every point: none of them is
    the shipped preset the 950's table measured, so cann_sample, which that table vouches
    for at the shipped preset, is uncalibrated at both, and the ledger says why."""
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "cann_sample", "--over",
                 "hardware_overrides.chip.clock_ghz=1.0,2.0", "--out", "runs", "--json",
                 "--quiet", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert _bands(doc) == {"uncalibrated (hardware_overrides (chip.clock_ghz): not the "
                           "shipped preset), assumed ±25%"}


@pytest.mark.parametrize("value", ["mine.yaml", "sub dir/mine.yaml"])
def test_a_preset_file_along_over_hardware_is_not_the_shipped_preset(value, tmp_path, capsys,
                                                                     monkeypatch):
    """--over hardware=PRESET,FILE: a point's name comes from the axis value, and a path is no
    plain file name; the file's point still runs, uncalibrated as a file's, while the
    shipped preset's point is held against the 950's table."""
    (tmp_path / value).parent.mkdir(exist_ok=True)
    (tmp_path / value).write_text((ROOT / "configs/ascend950.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "cann_sample", "--over", f"hardware=ascend950,{value}",
                 "--out", "runs", "--json", "--quiet", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["family"] for p in doc["points"] if p["value"] == value
            for r in p["ranking"]] == ["cann_sample"]
    (file_band,) = _bands(doc, value)
    assert file_band.startswith("uncalibrated (a preset file (") and "ascend950" in file_band
    assert not any(b.startswith("uncalibrated") for b in _bands(doc, "ascend950"))
    names = [p.name for p in (tmp_path / "runs" / "points").iterdir()]
    assert len(names) == 2 and all("/" not in n and " " not in n for n in names)


def test_a_value_no_candidate_can_run_ranks_nothing(tmp_path, capsys, monkeypatch):
    (tmp_path / "quick.py").write_text(FAMILY.format(name="quick", base=500, per_token=10))
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--family", "quick.py", "--over", "hardware=ascend950,missing.yaml",
                 "--out", "runs", "--json", "--quiet", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_value = {p["value"]: p for p in doc["points"]}
    assert by_value["missing.yaml"]["ranking"] == []
    assert by_value["missing.yaml"]["why"] == "nothing could run this shape"
    assert [r["value"] for r in doc["refused"]] == ["missing.yaml"]


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


def test_a_family_whose_options_are_its_shape_compares_its_variants(tmp_path, capsys):
    """kv_offload's shape is its own options; its variants are the two host allocations.
    The full cache (304 rows x 656 B: 49 pages of 4 KiB, one of 2 MiB) fits the 2048
    translations a die keeps, so neither walks and they tie (within any band), the tie
    names the measurement at the shape, and the row says what it rests on."""
    doc = _kv_advice(tmp_path, capsys)
    assert doc["shape"]["batch"] == 1 and doc["shape"]["c8"] is True
    (pt,) = doc["points"]
    assert {r["variant"] for r in pt["ranking"]} == {"shmem_host", "swapped"}
    assert all(r["tie"] for r in pt["ranking"])
    assert pt["ranking"][0]["total_us"] == pt["ranking"][1]["total_us"]
    assert pt["why"].startswith("tie: kv_offload/shmem_host (none/none), kv_offload/swapped "
                                "(none/none) are 0.0 us (0%) apart")
    assert pt["why"].endswith("; a measured kv_offload/shmem_host, kv_offload/swapped gather "
                              "on atlas_a3 at batch 1, seq_len 300, topk 64, block 16, c8 True "
                              "would break it")
    rests = pt["ranking"][0]["rests_on"]
    assert "host.page_walk_ns 1000 ns (assumed, plausible 200-5000)" in rests
    assert any(r.startswith("host.latency_ns ") and "calibrated" in r for r in rests)
    assert not doc["refused"]  # the MoE families are not asked to run a kv_offload shape


def test_the_variants_differ_by_the_walks_of_the_swapped_pages(tmp_path, capsys):
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
    assert got["swapped"] > got["shmem_host"]
    assert doc["points"][0]["ranking"][0]["variant"] == "shmem_host"
    # both uncalibrated (overridden preset): a tie exactly when within 25% of the faster
    tie = got["swapped"] - got["shmem_host"] <= 0.25 * got["shmem_host"]
    assert [r["tie"] for r in doc["points"][0]["ranking"]] == [tie, tie]
