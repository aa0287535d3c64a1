"""Sensitivity of an op's time to its preset's assumed values: the effect of a step by
hand arithmetic, the step rules, the shipped records current, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from npusim.cli import main
from npusim.errors import DeadlockError, KernelError
from npusim.fidelity.assumed import STEP, assumed_of, record_path, stepped
from npusim.hw.config import load_provenance
from npusim.hw.provenance import is_entry
from npusim.report.io import dumps_json
from npusim.sensitivity.perturb import _failure, _unprobed, rounded, sensitivity
from npusim.sensitivity.records import record_doc, references
from npusim.shipped import configs_dir, scenarios

LAUNCH = "kernel.launch_ns"
TINY = "shmem_classic/a3_int32_ep2"  # 2 ranks, BS 8, H 1024: well under a second a run


def _plain_but(raw: Any, keep: str, here: str = "") -> Any:
    """A preset document whose entries are plain values, but `keep`'s (a user's preset
    file: its plain numbers are its own, not assumptions)."""
    if is_entry(raw):
        return raw if here == keep else raw["value"]
    if isinstance(raw, dict):
        return {k: _plain_but(v, keep, f"{here}.{k}" if here else k) for k, v in raw.items()}
    return raw


def _tiny_doc(tmp_path: Path) -> dict[str, Any]:
    """The tiny shipped scenario on a copy of atlas_a3 whose only assumed value is the
    kernel launch."""
    preset = yaml.safe_load((configs_dir() / "atlas_a3.yaml").read_text(encoding="utf-8"))
    (tmp_path / "one_assumed.yaml").write_text(yaml.safe_dump(_plain_but(preset, LAUNCH)))
    doc = yaml.safe_load(scenarios()[TINY].read_text(encoding="utf-8"))
    doc["hardware"] = "one_assumed.yaml"
    return doc


def test_a_launch_step_adds_its_tenth_to_every_op(tmp_path: Path) -> None:
    """Every op is one kernel launched once, before anything of it runs: raising the
    launch by 10% adds 0.1 x launch_ns to each op's time, and the range's ends add
    (end - value); the effect is that over the op's time."""
    doc = _tiny_doc(tmp_path)
    _, unit, prov = load_provenance(str(tmp_path / "one_assumed.yaml"))[LAUNCH]
    value = load_provenance("atlas_a3")[LAUNCH][0]
    lo, hi = prov.fields["range"]
    sens = sensitivity(doc, "tiny", tmp_path, tmp_path / "runs")
    assert sens.probed == (LAUNCH,)
    assert set(sens.ranked) == {"dispatch", "combine"}
    for op, ranked in sens.ranked.items():
        t0_ns = sens.base[op] * 1000.0
        (a,) = ranked
        assert (a.key, a.value, a.unit, a.lo, a.hi) == (LAUNCH, value, unit, lo, hi)
        assert a.effect == pytest.approx(STEP * value / t0_ns, rel=1e-5)
        assert a.span == pytest.approx(((lo - value) / t0_ns, (hi - value) / t0_ns), rel=1e-5)
        assert a.at == doc["name"]


def test_a_rerun_resumes_from_the_run_folders(tmp_path: Path) -> None:
    doc = _tiny_doc(tmp_path)
    first = sensitivity(doc, "tiny", tmp_path, tmp_path / "runs")
    marks = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("report.json")}
    assert sensitivity(doc, "tiny", tmp_path, tmp_path / "runs") == first
    assert {p: p.stat().st_mtime_ns for p in marks} == marks


def test_step_rules() -> None:
    assert stepped(1000.0) == pytest.approx(1100.0)
    assert (stepped(2), stepped(40), stepped(9708)) == (3, 44, 9708 + 971)
    assert _unprobed("a.b", 0.0, 0.0, 0.0, ()) == "zero: no relative step"
    assert _unprobed("a.b", 1, 1, 1, ()) == "its range is one value"
    assert _unprobed("a.b", True, 0, 1, ()) == "not a number"
    assert _unprobed("a.b", 5.0, 1.0, 9.0, ("a.b",)) == "the scenario overrides it"
    assert _unprobed("a.b", 5.0, 1.0, 9.0, ()) == ""
    assert rounded(1 / 3) == 0.333333


def test_a_run_failing_in_the_model_is_a_reason_anything_else_is_raised() -> None:
    assert _failure(KernelError("L0A overflow", rank=1, core=6)) == "rank 1, core 6: L0A overflow"
    assert _failure(DeadlockError("2 cores wait\n  for a flag", ["r0 c0"])) == (
        "2 cores wait for a flag")
    assert _failure(ValueError("a bug")) is None


def _records() -> list[Path]:
    return sorted((configs_dir() / "sensitivity").glob("*/*.json"))


def test_every_record_names_its_presets_assumed_values_as_they_are() -> None:
    """Cheap currency: each key a record ranks is still assumed in its preset, with the
    same value and range, and each op's reference is the one the rule picks."""
    assert _records()
    for path in _records():
        rec = json.loads(path.read_text(encoding="utf-8"))
        preset, family = path.parent.name, path.stem
        assert (rec["preset"], rec["family"]) == (preset, family)
        assert {op: e["at"] for op, e in rec["ops"].items()} == references(preset)[family]
        prov = load_provenance(preset)
        for entry in rec["ops"].values():
            for d in entry["assumed"]:
                value, unit, p = prov[d["key"]]
                assert p is not None and p.kind == "assumed", (path, d["key"])
                assert (d["value"], d["unit"], d["range"]) == (value, unit, p.fields["range"])


def test_every_family_preset_pair_with_a_shipped_scenario_has_a_record() -> None:
    have = {(p.parent.name, p.stem) for p in _records()}
    want = {(preset, fam) for preset in ("ascend950", "atlas_a2", "atlas_a3")
            for fam in references(preset)}
    assert have == want


def test_a_cheap_record_recomputes_to_its_bytes(tmp_path: Path) -> None:
    path = record_path("shmem_classic", "atlas_a3")
    doc = record_doc("shmem_classic", "atlas_a3", 1, tmp_path)
    assert dumps_json(doc, sort_keys=True, inline_leaves=True) == path.read_text(
        encoding="utf-8")


def test_assumed_of_reads_the_record() -> None:
    rec = json.loads(record_path("shmem_classic", "atlas_a3").read_text(encoding="utf-8"))
    got = assumed_of("shmem_classic", "atlas_a3", "combine")
    assert [a.key for a in got] == [d["key"] for d in rec["ops"]["combine"]["assumed"]]
    assert all(a.at == rec["ops"]["combine"]["at"] for a in got)
    assert [abs(a.effect) for a in got] == sorted((abs(a.effect) for a in got), reverse=True)
    assert assumed_of("shmem_classic", "atlas_a3", "no_such_op") == ()
    assert assumed_of("no_such_family", "atlas_a3", "combine") == ()


@pytest.mark.parametrize("argv, where", [
    (["presets", "--sensitivity", "atlas_a9"], "--sensitivity"),
    (["presets", "--sensitivity", "atlas_a3", "--family", "nothing"], "--family"),
    (["presets", "--sensitivity", "atlas_a2", "--family", "mega_moe"], "--family"),
    (["presets", "--family", "mc2"], "--family"),
    (["presets", "--sensitivity", "atlas_a3", "--explain", "atlas_a3"], "--explain"),
    (["presets", "--sensitivity", "atlas_a3", "--workers", "0"], "--workers"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], where: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and where in out.err


def test_run_sensitivity_prints_and_writes_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _tiny_doc(tmp_path)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "tiny.yaml"), "--sensitivity", "--workers", "1",
                 "--quiet", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    written = json.loads((out / "sensitivity.json").read_text(encoding="utf-8"))
    assert set(written["ops"]) == {"dispatch", "combine"}
    assert written["probed"] == [LAUNCH]
    table = [line for line in printed.splitlines()  # the summary's ledger lines aside
             if not line.lstrip().startswith(("rests most on", "fidelity:"))]
    assert sum(LAUNCH in line for line in table) == 2
    assert main(["run", str(tmp_path / "tiny.yaml"), "--workers", "1", "--quiet", "--out",
                 str(out)]) == 0
    assert not (out / "sensitivity.json").exists()  # stale beside the new report


def test_a_value_the_scenario_sets_is_its_own_not_perturbed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _tiny_doc(tmp_path)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "tiny.yaml"), "--sensitivity", "--workers", "1",
                 "--quiet", "--out", str(out), "--set",
                 f"hardware_overrides.{LAUNCH}=5000"]) == 0
    written = json.loads((out / "sensitivity.json").read_text(encoding="utf-8"))
    assert written["probed"] == []
    assert written["skipped"] == [{"key": LAUNCH, "why": "the scenario overrides it"}]
    assert "no assumed value moves its time" in capsys.readouterr().out
