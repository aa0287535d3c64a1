"""RmsNormQuant steps 0..6: tiling as the host code computes it, outputs against
gen_data.py's formula, and VF instruction counts by hand from the source."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.hw.config import load_hardware
from npusim.kernels.rms_norm_quant import reference as ref
from npusim.kernels.rms_norm_quant.tiling import make_tiling
from tests.conftest import round_hw
from tests.kernels.vechelp import rnq_inputs, run_rnq

STEPS = range(7)


def test_tiling_of_the_published_shape() -> None:
    cfg = load_hardware("ascend950")
    t2 = make_tiling(2, 4096, 8192, cfg.chip.aiv_cores, cfg.ub.bytes)
    assert (t2.cores, t2.block_factor, t2.block_tail) == (64, 64, 64)
    # 256 KiB UB: (262144 - 8192 * 6 - 32) // (8192 * 6 + 4) = 4 rows per UB loop, so 16
    # loops: the README's step 5 counts 17 MTE2 (16 x + 1 gamma) and 16 MTE3 per core
    t5 = make_tiling(5, 4096, 8192, cfg.chip.aiv_cores, cfg.ub.bytes)
    assert (t5.ub_factor, t5.buf_num) == (4, 2)
    t6 = make_tiling(6, 4096, 8192, cfg.chip.aiv_cores, cfg.ub.bytes)
    assert (t6.binary_add_point, t6.fold_loops, t6.fold_tail_loops, t6.ub_factor) == (
        4096, 64, 0, 4)
    assert make_tiling(0, 4096, 8192, 64, 262144).cores == 1


@pytest.mark.parametrize("step", STEPS)
def test_int8_exact_against_the_formula(step: int) -> None:
    # integer x: every float32 sum of squares is exact, so the order of the kernel's
    # accumulation does not matter and the result must equal the formula bit for bit
    x, gamma, scale, offset = rnq_inputs(8, 1024, seed=step, integer=True)
    y, _, _ = run_rnq(round_hw(**{"chip.aiv_cores": 4}), step, x, gamma, scale, offset)
    np.testing.assert_array_equal(y, ref.reference(x, gamma, scale, offset, step))


@pytest.mark.parametrize("step", STEPS)
def test_within_one_of_gen_data_golden(step: int) -> None:
    # the sample's own acceptance: |y - golden| <= 1 on gen_data.py's distributions
    x, gamma, scale, offset = rnq_inputs(6, 2048, seed=10 + step)
    y, _, _ = run_rnq(round_hw(**{"chip.aiv_cores": 4}), step, x, gamma, scale, offset)
    diff = np.abs(y.astype(int) - ref.golden(x, gamma, scale, offset).astype(int))
    assert diff.max() <= 1
    assert (y == ref.golden(x, gamma, scale, offset)).mean() > 0.5


def test_vf_instruction_counts_by_hand() -> None:
    # step 3, one core, 2 rows of 8192 (128 registers): ComputeRmsVf per row 1 Duplicate +
    # 128 x (Cast, Mul, Add) + ReduceSum, Muls, Adds, Sqrt; ComputeNormQuantVf 128 x (Cast,
    # Div, Mul, Muls, Adds, Cast, Cast); the MemBase Cast of gamma once, 128 registers
    x, gamma, scale, offset = rnq_inputs(2, 8192, seed=1)
    _, res, _ = run_rnq(round_hw(**{"chip.aiv_cores": 1}), 3, x, gamma, scale, offset)
    c = res.contexts[0][0].counters
    assert c["RVECEX"] == 2 * (1 + 3 * 128 + 4 + 7 * 128) + 128
    assert c["RVECLD"] == 2 * (128 + 1 + 2 * 128) + 128  # x twice, rms once, gamma
    assert c["RVECST"] == 2 * (1 + 128) + 128


def test_double_buffering_overlaps_copies_with_vector_work() -> None:
    x, gamma, scale, offset = rnq_inputs(16, 4096, seed=2)
    hw = round_hw(**{"chip.aiv_cores": 1, "kernel.task_launch_ns": 0.0})
    _, r3, _ = run_rnq(hw, 3, x, gamma, scale, offset)
    _, r4, _ = run_rnq(hw, 4, x, gamma, scale, offset)
    c3, c4 = r3.contexts[0][0], r4.contexts[0][0]
    assert c3.counters == c4.counters  # the README: same instructions
    busy = c3.core.vector.busy_ns + c3.core.mte2.busy_union_ns
    assert r3.end_ns == pytest.approx(busy, rel=0.1)  # one slot: they alternate
    assert r4.end_ns < 0.8 * r3.end_ns  # two slots: they overlap
