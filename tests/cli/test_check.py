"""npusim check: the committed baselines (BS 8 subset in CI) and the check's logic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from npusim.check import expand, run_check
from npusim.cli import main
from npusim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
BASELINES = ROOT / "reports" / "baselines"
# the quick ones: BS 8 with at most 16 ranks (W=64 alone takes ~20 s)
CI_SUBSET = [str(p) for p in SHIPPED if "bs8" in p.stem and "w64" not in p.stem]


def test_every_shipped_scenario_has_a_baseline() -> None:
    names = [load_scenario(p).name for p in SHIPPED]
    assert len(set(names)) == len(names)
    missing = [n for n in names if not (BASELINES / f"{n}.json").is_file()]
    assert not missing, f"no baseline for {missing}: run `npusim check --update`"
    stale = sorted({p.stem for p in BASELINES.glob("*.json")} - set(names))
    assert not stale, f"baselines without a scenario: {stale}"


def test_bs8_scenarios_match_the_committed_baselines(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert len(CI_SUBSET) >= 5
    lines: list[str] = []
    code = run_check(CI_SUBSET, BASELINES, 0.02, emit=lines.append)
    assert code == 0, "\n".join(lines)
    assert len(lines) == len(CI_SUBSET) + 1
    assert all(ln.split()[0] == "ok" for ln in lines[:-1]), "\n".join(lines)


def tiny(tmp: Path, name: str = "tiny", **overrides: float) -> str:
    doc = {"name": name, "hardware": "ascend950",
           "workload": {"op": "dispatch_combine", "bs": 4, "h": 1024, "k": 2,
                        "ep_world_size": 2, "experts_per_rank": 2,
                        "dispatch_quant": "mxfp8", "combine_quant": "int8"}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def scale_baseline(path: Path, factor: float) -> None:
    doc = json.loads(path.read_text())
    for op in doc["ops"]:
        op["latency_us"] *= factor
        for ph in op["phases"].values():
            ph["start_us"] *= factor
            ph["end_us"] *= factor
    path.write_text(json.dumps(doc))


def test_missing_update_ok_regressed_faster(tmp_path: Path) -> None:
    scen, base = tiny(tmp_path), tmp_path / "base"
    out: list[str] = []
    assert run_check([scen], base, 0.02, emit=out.append) == 1
    assert out[0].startswith("missing baseline") and "--update" in out[0]
    out.clear()
    assert run_check([scen], base, 0.02, update=True, emit=out.append) == 0
    assert out[0].startswith("updated") and "was new" in out[0]
    saved = json.loads((base / "tiny.json").read_text())
    assert saved["schema"] == "npusim.baseline/1" and [o["op"] for o in saved["ops"]] == [
        "dispatch", "combine"]
    assert set(saved["ops"][0]) == {"op", "latency_us", "phases"}
    out.clear()
    assert run_check([scen], base, 0.02, emit=out.append) == 0
    assert out[0].startswith("ok ")
    # the baseline 10 % faster than this run: a regression beyond 2 %
    scale_baseline(base / "tiny.json", 0.9)
    out.clear()
    assert run_check([scen], base, 0.02, emit=out.append) == 1
    assert out[0].startswith("REGRESSED") and "worst" in out[0]
    # the baseline 10 % slower than this run: reported, fails only with --strict
    (base / "tiny.json").write_text(json.dumps(saved))
    scale_baseline(base / "tiny.json", 1.1)
    out.clear()
    assert run_check([scen], base, 0.02, emit=out.append) == 0
    assert out[0].startswith("changed (faster)")
    assert run_check([scen], base, 0.02, strict=True, emit=out.append) == 1
    assert run_check([scen], base, 0.2, strict=True, emit=out.append) == 0  # within 20 %


def test_a_changed_input_is_named(tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert run_check([tiny(tmp_path)], base, 0.02, update=True, emit=lambda _: None) == 0
    out: list[str] = []
    slow = tiny(tmp_path, **{"mte.put_latency_ns": 5000.0})  # same name, other hardware
    assert run_check([slow], base, 0.02, emit=out.append) == 1
    assert out[0].startswith("REGRESSED") and "hardware preset changed" in out[0]


def test_unusable_inputs_exit_2(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "tiny.json").write_text("{broken")
    out: list[str] = []
    assert run_check([tiny(tmp_path)], base, 0.02, emit=out.append) == 2
    assert out[0].startswith("unusable") and "tiny.json" in out[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nworkload: {op: dispatch, bs: 9999}\n")
    out.clear()
    assert run_check([str(bad)], base, 0.02, emit=out.append) == 2
    assert out[0].startswith("unusable") and "bad.yaml" in out[0]
    assert run_check([], base, 0.02, emit=out.append) == 2


def test_cli_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen, base = tiny(tmp_path), tmp_path / "b"
    args = ["check", "--baselines", str(base), "--scenarios", scen]
    assert main(args) == 2  # no baseline folder: one line before simulating anything
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"no baseline folder {base}" in err[0]
    assert main([*args, "--update"]) == 0  # --update makes the folder
    assert main([*args, "--tolerance", "0%"]) == 0
    assert main([*args, "--tolerance", "-1"]) == 2
    out = capsys.readouterr().out
    assert "1 scenario(s): 1 ok (tolerance 0%" in out
    assert expand([str(tmp_path / "*.yaml"), scen]) == [scen]
