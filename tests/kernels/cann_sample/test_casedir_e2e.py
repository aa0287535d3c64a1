"""End to end through the command a user runs: a CANN-sample case directory in, the sample's
byte-for-byte golden check passing on what `npusim run --case-dir` writes.

The goldens come from generate_case (cann_sample.reference, the golden's arithmetic: combine INT8
divides by 127), the outputs from the simulated kernels (which multiply by fp32(1/127)); for
fp16 tokens every byte must still match. Broken case directories exit 2 with one line on
stderr naming the offending file, no traceback and nothing written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.kernels.cann_sample.casedir import chip_file, compare_with_golden, generate_case
from npusim.workload.shape import MoeShape

ROOT = Path(__file__).resolve().parents[3]
NPUSIM = Path(sys.executable).with_name("npusim")  # the console script of this environment

CONFIGS = [
    pytest.param(dict(W=2, BS=8, H=1024, K=4, L=4, dtype="float16", dispatch_quant="mxfp8",
                      combine_quant="int8", routing="balanced", seed=0),
                 id="w2-k4-mxfp8-cint8-fp16-balanced"),
    pytest.param(dict(W=4, BS=8, H=1024, K=8, L=4, dtype="float16", dispatch_quant="none",
                      combine_quant="none", routing="uniform", seed=5),
                 id="w4-k8-none-cnone-fp16-uniform5"),
    pytest.param(dict(W=4, BS=8, H=1024, K=4, L=4, dtype="bfloat16", dispatch_quant="int8",
                      combine_quant="int8", routing="balanced", seed=1),
                 id="w4-k4-int8-cint8-bf16-balanced"),
]


def _scenario(path: Path, c: dict, name: str = "case") -> Path:
    doc = {
        "name": name,
        "hardware": "ascend950",
        "workload": {
            "op": "dispatch_combine", "bs": c["BS"], "h": c["H"], "k": c["K"],
            "ep_world_size": c["W"], "experts_per_rank": c["L"], "dtype": c["dtype"],
            "dispatch_quant": c["dispatch_quant"], "combine_quant": c["combine_quant"],
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def _npusim(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NPUSIM), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _generate(case: Path, c: dict) -> None:
    generate_case(case, MoeShape(c["W"], c["BS"], c["H"], c["K"], c["L"], dtype=c["dtype"]),
                  dispatch_quant=c["dispatch_quant"], combine_quant=c["combine_quant"],
                  seed=c["seed"], routing=c["routing"])


@pytest.mark.parametrize("c", CONFIGS)
def test_cli_run_passes_the_sample_check(tmp_path: Path, c: dict) -> None:
    case, out = tmp_path / "case", tmp_path / "out"
    _generate(case, c)
    golden = sorted(p.relative_to(case / "golden") for p in (case / "golden").rglob("*.bin"))
    per_chip = 6 if c["dispatch_quant"] != "none" else 5  # no dynamic_scales unquantised
    assert len(golden) == c["W"] * per_chip
    assert len(compare_with_golden(case, c["W"])) == len(golden)  # nothing written yet
    scen = _scenario(tmp_path / "scenario.yaml", c)
    p = _npusim("run", scen, "--case-dir", case, "--out", out, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert (out / "report.json").is_file()
    assert compare_with_golden(case, c["W"]) == []
    for rel in golden:  # every golden file has an output of at least its length
        assert (case / "output" / rel).stat().st_size >= (case / "golden" / rel).stat().st_size


def _break_truncated_x(case: Path) -> str:
    p = chip_file(case, "input", 0, "x")
    p.write_bytes(p.read_bytes()[:-2])
    return "chip_0/x_0.bin"


def _break_missing_ids(case: Path) -> str:
    chip_file(case, "input", 1, "expert_ids").unlink()
    return "chip_1/expert_ids_1.bin"


def _break_id_out_of_range(case: Path) -> str:
    p = chip_file(case, "input", 1, "expert_ids")
    ids = np.fromfile(p, np.int32)
    ids[5] = 2 * 4  # E = W * L = 8: one past the last expert
    ids.tofile(p)
    return "chip_1/expert_ids_1.bin"


@pytest.mark.parametrize("breaker", [_break_truncated_x, _break_missing_ids,
                                     _break_id_out_of_range],
                         ids=["truncated-x", "missing-expert-ids", "expert-id-out-of-range"])
def test_broken_case_dir_exit_2_one_line(tmp_path: Path, breaker) -> None:
    c = dict(W=2, BS=8, H=1024, K=4, L=4, dtype="float16", dispatch_quant="mxfp8",
             combine_quant="int8", routing="balanced", seed=0)
    case, out = tmp_path / "case", tmp_path / "out"
    _generate(case, c)
    fname = breaker(case)
    scen = _scenario(tmp_path / "scenario.yaml", c)
    p = _npusim("run", scen, "--case-dir", case, "--out", out, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert fname in lines[0], lines[0]
    assert p.stdout == ""
    assert not out.exists() or not any(out.iterdir())
    assert not any(f.is_file() for f in (case / "output").rglob("*"))
