"""The GeLU sample kernels: outputs against the tanh formula, timing by hand arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import KernelError
from npusim.kernels.cann_gelu.reference import gelu_reference
from tests.conftest import round_hw
from tests.kernels.vechelp import run_gelu

VF_KEYS = {"vector.vf_call_cycles": 100, "vector.vf_latency_cycles": 2,
           "kernel.task_launch_ns": 0.0}


@pytest.mark.parametrize("vf", [False, True], ids=["membase", "vf"])
def test_outputs_match_the_formula(vf: bool) -> None:
    x = np.random.default_rng(3).uniform(-10, 10, 2 * 8192 + 1000).astype(np.float32)
    y, _ = run_gelu(round_hw(**VF_KEYS), x, vf)
    np.testing.assert_allclose(y, gelu_reference(x), atol=1e-3)  # the sample's check


def test_vf_form_vector_time_by_hand() -> None:
    x = np.ones(2 * 8192 + 640, np.float32)
    _, res = run_gelu(round_hw(**VF_KEYS), x, vf=True)
    # per tile: call 100 + registers x 5 cycles (two Mul, two Muls paired, Add and Adds
    # paired across registers, Exp and Div alone) + one register's chain of 18 cycles
    expected = 2 * (100 + 128 * 5 + 18) + (100 + 10 * 5 + 18)
    assert res.contexts[0][0].core.vector.busy_ns == pytest.approx(expected)  # 1 GHz
    assert res.contexts[0][0].counters["RVECEX"] == 8 * (2 * 128 + 10)


def test_membase_form_vector_time_by_hand() -> None:
    x = np.ones(8192, np.float32)
    _, res = run_gelu(round_hw(**VF_KEYS), x, vf=False)
    # seven VFs (the source's barriers; Mul and Muls between two barriers fuse): per
    # register 1 + 2 + 2 + 1 + 1 + 1 + 2 cycles, each VF 100 + a load-op-store chain of 6
    assert res.contexts[0][0].core.vector.busy_ns == pytest.approx(7 * 106 + 128 * 10)


def test_a3_runs_membase_calls_as_instructions_and_refuses_vfs() -> None:
    hw = round_hw(**VF_KEYS, vector__model="membase", vector__issue_cycles=5.0)
    x = np.ones(8192, np.float32)
    _, res = run_gelu(hw, x, vf=False)
    # eight calls of 128 repeats each, 5 cycles to issue each
    assert res.contexts[0][0].core.vector.busy_ns == pytest.approx(8 * (5 + 128))
    with pytest.raises(KernelError, match="needs a RegBase vector unit"):
        run_gelu(hw, x, vf=True)
