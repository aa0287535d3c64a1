"""Scenario YAML -> a validated, frozen Scenario.

A scenario is the whole description of one run: hardware preset (+ dotted overrides),
the workload, an optional CANN-sample case directory and run limits. Users edit these
files by hand, so every problem is an InputError naming the file, the dotted key and
what is allowed; nothing is silently defaulted or ignored.

- yaml: a file's bytes -> one mapping;
- schema: the value checks, and a declared Option checked by its kind;
- workload: the generic workload keys (declared as options, GENERIC) and the family's;
- checks: what spans sections (the family's fit, its core kinds, the topology);
- load: the top-level keys, the hardware, data and run sections, and the Scenario.

The shape limits are the family's own declaration (Family.shape_limits); docs/scenario.md
lists them all (npusim/scenario/docs.py writes its tables).
"""

from npusim.scenario.load import (
    DataSource,
    RunOptions,
    Scenario,
    load_scenario,
    scenario_from_doc,
)
from npusim.scenario.workload import GENERIC, Workload
from npusim.scenario.yaml import read_scenario_file

__all__ = ["GENERIC", "DataSource", "RunOptions", "Scenario", "Workload", "load_scenario",
           "read_scenario_file", "scenario_from_doc"]
