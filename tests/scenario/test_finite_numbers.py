"""An integer past float's range where a finite number belongs (a preset's provenance
range, a sweep axis's range) is one line and exit 2 naming the file and key, not an
OverflowError from math.isfinite."""

from __future__ import annotations

from pathlib import Path

import yaml

from npusim.cli import main

ROOT = Path(__file__).resolve().parents[2]
HUGE = 10**400
SMALL = {"op": "dispatch", "bs": 1, "h": 1024, "k": 1, "ep_world_size": 2,
         "experts_per_rank": 1, "timing_only": True}


def _lint(path: Path, capsys) -> tuple[int, str]:
    code = main(["lint", str(path)])
    return code, capsys.readouterr().err


def test_a_huge_integer_in_a_presets_range_is_one_line(tmp_path, capsys):
    text = (ROOT / "configs" / "ascend950.yaml").read_text()
    assert "range: [0.5, 4.0]" in text
    (tmp_path / "p.yaml").write_text(text.replace("range: [0.5, 4.0]", f"range: [0.5, {HUGE}]",
                                                  1))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "hardware": "p.yaml",
                                                     "workload": SMALL}))
    before = sorted(tmp_path.iterdir())
    code, err = _lint(tmp_path / "s.yaml", capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"npusim: error: {tmp_path / 'p.yaml'}: ")
    assert ".range: must be [low, high], two numbers, low <= high" in err
    assert sorted(tmp_path.iterdir()) == before


def test_a_huge_integer_in_a_sweep_range_is_one_line(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "workload": SMALL}))
    for spec in ({"start": 1, "stop": HUGE}, {"start": -HUGE, "stop": 2},
                 {"start": 1, "stop": 2, "step": HUGE}):
        (tmp_path / "w.yaml").write_text(yaml.safe_dump(
            {"name": "w", "base": "s.yaml", "axes": {"workload.bs": spec}}, width=10**4))
        code, err = _lint(tmp_path / "w.yaml", capsys)
        assert (code, err.count("\n")) == (2, 1), err
        assert err.startswith("npusim: error: ") and "w.yaml: axes.workload.bs: a range " \
            "needs finite numbers start <= stop and step > 0" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml", "w.yaml"]
