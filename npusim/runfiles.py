"""Where a run's files go, checked before the run: `npusim run` and the Python API's
`Run.write` refuse the same outputs, each naming its own spelling of the option
(`--harness-csv` on the command line, `harness_csv` in the API)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.outputs import output_file, output_folder, refuse_special

RUN_FILES = ("report.json", "report.md", "trace.json", "blocked.txt")
COMMAND_LINE = "command line"


@dataclass(frozen=True)
class RunFiles:
    """A run's checked output paths."""

    out: Path
    tensors: Path | None
    harness_csv: Path | None


def option(name: str, source: str) -> str:
    """An output's option as the caller spells it: --harness-csv, or harness_csv."""
    return f"--{name.replace('_', '-')}" if source == COMMAND_LINE else name


def run_files(scenario: Any, out: str | Path, tensors: str | Path | None,
              harness_csv: str | Path | None, source: str = COMMAND_LINE) -> RunFiles:
    """The run's output folder, tensors folder and harness CSV, each refused (one
    InputError naming its option) unless it can be written."""
    folder = output_folder(out, option("out", source), RUN_FILES, source)
    tensor_dir = (None if tensors is None
                  else output_folder(tensors, option("tensors", source), (), source))
    csv = None if harness_csv is None else _harness_csv(harness_csv, scenario, source)
    return RunFiles(folder, tensor_dir, csv)


def _harness_csv(arg: str | Path, scenario: Any, source: str) -> Path:
    """A file path whose folder exists, for a family that profiles its kernels' frames
    (Kernel.profiles)."""
    from npusim.report.harness_csv import csv_paths

    name = option("harness_csv", source)
    p = output_file(arg, name, source)
    if not p.parent.is_dir():
        raise InputError(source, name, f"folder {p.parent} does not exist")
    w = scenario.workload
    fam = w.family
    ops = [k.name for k in (fam.kernels_of(w.op) if fam is not None else ()) if k.profiles]
    if not ops:
        raise InputError(source, name, f"kernel family {w.kernel!r} records no harness "
                         "frames; allowed with shmem_classic (the SHMEM examples' --perf CSV)")
    for q in csv_paths(p, ops):
        refuse_special(q, source, name)
    return p
