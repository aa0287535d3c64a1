"""Helpers to run small scenarios from tests without scenario files on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from npusim.result import RunResult
from npusim.scenario import Scenario, load_scenario
from npusim.sim import simulate


def scenario(tmp: Path, name: str = "t", hardware: str = "ascend950",
             overrides: dict[str, Any] | None = None, **workload: Any) -> Scenario:
    w = {"op": "dispatch", "bs": 8, "h": 1024, "k": 4, "ep_world_size": 4,
         "experts_per_rank": 2, "dtype": "float16", "dispatch_quant": "mxfp8"}
    routing = workload.pop("routing", None)
    w.update(workload)
    if routing is not None:
        w["routing"] = routing
    doc = {"name": name, "hardware": hardware, "workload": w}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def run(tmp: Path, **kw: Any) -> tuple[Scenario, RunResult]:
    sc = scenario(tmp, **kw)
    return sc, simulate(sc)
