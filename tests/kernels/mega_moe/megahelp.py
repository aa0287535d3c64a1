"""Small mega_moe scenarios for tests, and the reference of their inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from npusim import sim
from npusim.kernels.mega_moe import reference as ref
from npusim.kernels.mega_moe.inputs import weights_of
from npusim.result import RunResult
from npusim.scenario import Scenario, load_scenario


def mega_scenario(tmp: Path, name: str = "mm", hardware: str = "ascend950",
                  **workload: Any) -> Scenario:
    w = {"kernel": "mega_moe", "op": "mega_moe", "bs": 8, "h": 1024, "k": 2,
         "ep_world_size": 2, "experts_per_rank": 2, "ffn_dim": 512, "mode": "e4m3",
         "inputs": "random", "routing": {"kind": "uniform", "seed": 3}}
    w.update(workload)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "hardware": hardware, "workload": w}))
    return load_scenario(path)


def run_mega(tmp: Path, **workload: Any) -> tuple[Scenario, RunResult]:
    sc = mega_scenario(tmp, **workload)
    return sc, sim.simulate(sc)


def reference_of(sc: Scenario) -> ref.Reference:
    """The numpy reference on the inputs the scenario generates (the family's inputs, the
    reference's own arithmetic)."""
    ins = sim.load_inputs(sc)
    return ref.reference_layer([a["x"] for a in ins], [a["expert_ids"] for a in ins],
                               [a["routing_weights"] for a in ins],
                               [weights_of(a) for a in ins], sc.workload.shape.L,
                               sc.workload.options["mode"])
