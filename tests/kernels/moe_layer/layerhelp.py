"""Small moe_layer scenarios for tests, and the layer reference on their inputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from npusim import sim
from npusim.errors import InputError
from npusim.kernels.moe_layer import reference as ref
from npusim.kernels.moe_layer.inputs import weights_of
from npusim.result import RunResult
from npusim.scenario import Scenario, load_scenario


def layer_scenario(tmp: Path, name: str = "ml", hardware: str = "atlas_a3", **workload: Any
                   ) -> Scenario:
    """A small layer of 2 ranks (2 experts each, 4 tokens, top-2) on `hardware`; `workload`
    overrides its keys."""
    w = {"kernel": "moe_layer", "op": "moe_layer", "bs": 4, "h": 1024, "k": 2,
         "ep_world_size": 2, "experts_per_rank": 2, "dtype": "bfloat16",
         "intermediate": 256, "routing": {"kind": "uniform", "seed": 3}}
    w.update(workload)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "hardware": hardware, "workload": w}))
    return load_scenario(path)


def run_layer(tmp: Path, **workload: Any) -> tuple[Scenario, RunResult]:
    sc = layer_scenario(tmp, **workload)
    return sc, sim.simulate(sc)


def reference_of(sc: Scenario) -> ref.Layer:
    ins = sim.load_inputs(sc)
    return ref.reference_layer([a["x"] for a in ins], [a["topk_idx"] for a in ins],
                               [a["topk_weights"] for a in ins], [weights_of(a) for a in ins],
                               sc.workload.shape.L)


def assert_refused(make: Callable[[], Any], key: str, words: str) -> None:
    """Loading the scenario `make` builds fails with one line on `key` that says `words`."""
    with pytest.raises(InputError) as info:
        make()
    assert info.value.key == key
    assert words in info.value.message
    assert "\n" not in info.value.message
