"""What the deepep tests share: a small scenario file, the one-line refusal check, the
reference's sizes of a scenario."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from npusim.errors import InputError
from npusim.kernels.deepep import reference as ref


def write_scenario(tmp: Path, base: dict[str, Any], hardware: str, name: str, seed: int,
                   overrides: dict[str, Any] | None = None, **workload: Any) -> Path:
    """A deepep dispatch_combine scenario file: `base` (shape, mode), then `workload`;
    `overrides`: its hardware_overrides."""
    w = {"kernel": "deepep", "op": "dispatch_combine", "dtype": "bfloat16",
         "routing": {"kind": "uniform", "seed": seed}, **base, **workload}
    path = tmp / f"{name}.yaml"
    doc = {"name": name, "hardware": hardware, "workload": w}
    if overrides:
        doc["hardware_overrides"] = overrides
    path.write_text(yaml.safe_dump(doc))
    return path


def refused(build: Callable[..., Any], tmp: Path, **workload: Any) -> str:
    """The InputError `build(tmp, **workload)` raises, checked to be one line."""
    with pytest.raises(InputError) as exc:
        build(tmp, **workload)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def sizes(sc: Any) -> ref.Sizes:
    s, o = sc.workload.shape, sc.workload.options
    return ref.Sizes(s.W, s.E, s.K, o["long_seq_round"], o["per_round_tokens"])


def bf16() -> np.dtype:
    from npusim.kernels.quant import token_dtype
    return token_dtype("bfloat16")


def inputs_of(sc: Any, seed: int) -> list[dict[str, np.ndarray]]:
    """The family's generated inputs of a scenario, with payload, uniform routing."""
    w = sc.workload
    return w.family.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": seed},
                                True)


def run_on(sc: Any, inputs: list[dict[str, np.ndarray]]) -> Any:
    """simulate(sc) on the given inputs instead of the generated ones."""
    from unittest import mock

    from npusim.sim import simulate

    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        return simulate(sc)
