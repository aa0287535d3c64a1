"""npusim's instruction counts for rms_norm_quant steps 0, 2 and 3 against the sample
README's (cannsim profiles of core 0, x[4096, 8192]). The counts come from executing the
steps' programs; the README's figures are only compared with.

What agrees: the compute instructions of the register-based step 3 (the VF source gives
them exactly), the MemBase step 2 within a fifth, and the direction and size of the step
2 -> 3 change the README draws its conclusion from (stores collapse). What does not: the
README counts 1.8x the loads and stores the step 3 source executes, and its step 0 counts
are those of far fewer rows than the 4096 the step runs; these are marked xfail with the
figures (docs/model.md, "Instruction counts")."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.hw.config import load_hardware
from tests.kernels.vechelp import run_rnq

README = {  # RVECEX, RVECLD, RVECST, SCALAR of the README's tables
    0: (147_968, 123_392, 131_648, 14_507),
    2: (124_744, 95_560, 102_913, 11_558),
    3: (88_264, 44_146, 14_905, 5_709),
}
KEYS = ("RVECEX", "RVECLD", "RVECST", "SCALAR")


def core0_counts(step: int, rows: int) -> dict[str, float]:
    """Core 0's counts: from step 2 on every core runs the same program on its 64 rows
    (4096 / 64), so one core given 64 rows counts what core 0 of the full run counts."""
    cfg = load_hardware("ascend950", {"chip.aiv_cores": 1})
    x = np.ones((rows, 8192), np.float16)
    g = np.ones(8192, np.float16)
    _, res, t = run_rnq(cfg, step, x, g, np.ones(1, np.float16), np.ones(1, np.int8))
    assert (t.cores, t.block_factor) == (1, rows)
    return res.contexts[0][0].counters


@pytest.fixture(scope="module")
def counts() -> dict[int, dict[str, float]]:
    return {2: core0_counts(2, 64), 3: core0_counts(3, 64)}


def test_compute_instructions_of_steps_2_and_3(counts: dict[int, dict[str, float]]) -> None:
    assert counts[3]["RVECEX"] == pytest.approx(README[3][0], rel=0.10)
    assert counts[2]["RVECEX"] == pytest.approx(README[2][0], rel=0.20)


def test_step_3_stores_collapse_as_the_readme_says(counts: dict[int, dict[str, float]]
                                                   ) -> None:
    # README: RVECST -85.5%, RVECLD -53.8%, RVECEX -29.3% from step 2 to step 3
    drop = {k: 1 - counts[3][k] / counts[2][k] for k in KEYS[:3]}
    assert drop["RVECST"] == pytest.approx(0.855, abs=0.05)
    assert drop["RVECST"] > drop["RVECLD"] > 0
    assert drop["RVECEX"] > 0.1
    # loads to stores in step 3, a ratio independent of how many rows were profiled
    ratio = counts[3]["RVECLD"] / counts[3]["RVECST"]
    assert ratio == pytest.approx(README[3][1] / README[3][2], rel=0.05)


@pytest.mark.xfail(strict=True, reason="README counts 1.8x the loads and stores of the step 3 "
                   "VF source and ~2.6x those of the fused MemBase step 2 (docs/model.md)")
def test_loads_and_stores_of_steps_2_and_3(counts: dict[int, dict[str, float]]) -> None:
    for step in (2, 3):
        assert counts[step]["RVECLD"] == pytest.approx(README[step][1], rel=0.2)
        assert counts[step]["RVECST"] == pytest.approx(README[step][2], rel=0.2)


@pytest.mark.xfail(strict=True, reason="npusim charges one scalar slot per issued "
                   "instruction; the README's SCALAR counts ~10x more (docs/model.md)")
def test_scalar_instructions(counts: dict[int, dict[str, float]]) -> None:
    assert counts[3]["SCALAR"] == pytest.approx(README[3][3], rel=0.2)


@pytest.mark.xfail(strict=True, reason="the README's step 0 counts are those of ~90-170 rows, "
                   "not the 4096 the step runs on its one core (docs/model.md)")
def test_step_0() -> None:
    c = core0_counts(0, 256)
    per_row = {k: c[k] / 256 for k in KEYS}
    for k, v in zip(KEYS, README[0], strict=True):
        assert per_row[k] * 4096 == pytest.approx(v, rel=0.2)
