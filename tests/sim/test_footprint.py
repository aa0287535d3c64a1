"""The memory estimate of a functional run and the stop before allocating."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.footprint import BASE_BYTES, CORE_BYTES, GIB, estimate, limit_bytes
from npusim.scenario import load_scenario


def scenario_file(tmp_path: Path, w: int, bs: int, timing_only: bool = False) -> Path:
    doc = {"name": f"mem_w{w}_bs{bs}", "hardware": "atlas_a3",
           "workload": {"op": "dispatch_combine", "bs": bs, "h": 7168, "k": 8,
                        "ep_world_size": w, "experts_per_rank": 1, "dtype": "bfloat16",
                        "dispatch_quant": "mxfp8", "combine_quant": "int8",
                        "timing_only": timing_only}}
    p = tmp_path / f"w{w}_bs{bs}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_the_estimate_counts_slots_rows_cores_by_hand(tmp_path):
    """W 8, BS 8, K 8 at H 7168: 512 token-expert pairs, each an 8192 B MXFP8 dispatch slot
    (16 blocks of 512), an expand_x row of 7168 B + 224 B scales + 12 B assist info, a
    14336 B combine slot (Align512(2H)) and a 14336 B combine input row; 8 x 48 cores.
    With 2 workers the forked combine holds the reference dispatch's rows too."""
    sc = load_scenario(scenario_file(tmp_path, 8, 8))
    fp = estimate(sc, workers=2)
    row = 7168 + 224 + 12
    assert fp.pairs == 512 * (8192 + row + row + 14336 + 14336) + 8 * 8 * 512
    assert fp.cores == 8 * 48 * CORE_BYTES and fp.base == BASE_BYTES
    assert fp.ranks == 8 * 3 * 8 * 7168 * 2  # x in, x out, the reference: BS rows of 2H
    one = estimate(sc, workers=1)  # combine's phase: kept rows + its slot + its input row
    assert one.pairs == 512 * (row + 14336 + 14336) + 8 * 8 * 512


def test_a_functional_run_beyond_the_limit_stops_in_one_line_before_allocating(tmp_path,
                                                                                  capsys):
    """W 768, BS 80: 491520 pairs of about 50 KiB (both machines) is over 24 GiB."""
    p = scenario_file(tmp_path, 768, 80)
    assert estimate(load_scenario(p)).total > 24 * GIB
    out = tmp_path / "out"
    assert main(["run", str(p), "--out", str(out), "--workers", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "W=768, BS=80" in err and "24 GiB (the default)" in err
    assert not out.exists()


def test_timing_only_runs_are_not_gated(tmp_path, capsys):
    p = scenario_file(tmp_path, 8, 8, timing_only=True)
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--memory", "0.01",
                 "--workers", "1"]) == 0


def test_the_limit_can_be_raised_or_taken_from_the_machine(tmp_path, capsys):
    p = scenario_file(tmp_path, 8, 8)
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--memory", "0.05"]) == 1
    assert "0.05 GiB (--memory)" in capsys.readouterr().err
    assert limit_bytes("48") == (48 * GIB, "48 GiB (--memory)")
    auto, how = limit_bytes("auto")
    assert auto > 0 and ("MemAvailable" in how)
    with pytest.raises(InputError, match="allowed: a number of GiB"):
        limit_bytes("lots")
