"""Where a run's files go, checked before the run: `npusim run` and the Python API's
`Run.write` refuse the same outputs, each naming its own spelling of the option
(`--harness-csv` on the command line, `harness_csv` in the API)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.outputs import check_writable, output_file, output_folder, refuse_shared, refuse_special
from npusim.report.io import RUN_FILES, run_claims

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
    InputError naming its option) unless it can be written, and all refused where one
    would take another's path (a CSV onto the run's report, through a link or `..`)."""
    from npusim.report.harness_csv import csv_paths

    names = tuple(option(n, source) for n in ("out", "tensors", "harness_csv"))
    folder = output_folder(out, names[0], RUN_FILES, source)
    tensor_dir = None if tensors is None else output_folder(tensors, names[1], (), source)
    csv = None if harness_csv is None else _harness_csv(harness_csv, scenario, source)
    csvs = [] if csv is None else csv_paths(csv, _profiled_ops(scenario))
    refuse_shared(run_claims(folder, tensor_dir, csvs, tuple(scenario.workload.ops), names),
                  source)
    return RunFiles(folder, tensor_dir, csv)


def check_run_writable(files: RunFiles) -> None:
    """Before the run: OSError naming the first destination that cannot take its files,
    so an unwritable folder fails at once rather than after the simulation."""
    check_writable(files.out, folder=True)
    if files.tensors is not None:
        check_writable(files.tensors, folder=True)
    if files.harness_csv is not None:
        check_writable(files.harness_csv, folder=False)


def _profiled_ops(scenario: Any) -> list[str]:
    """The kernels of the scenario's op that record harness frames (Kernel.profiles)."""
    w = scenario.workload
    fam = w.family
    return [k.name for k in (fam.kernels_of(w.op) if fam is not None else ()) if k.profiles]


def _harness_csv(arg: str | Path, scenario: Any, source: str) -> Path:
    """A file path whose folder exists, for a family that profiles its kernels' frames
    (Kernel.profiles)."""
    from npusim.report.harness_csv import csv_paths

    name = option("harness_csv", source)
    p = output_file(arg, name, source)
    if not p.parent.is_dir():
        raise InputError(source, name, f"folder {p.parent} does not exist")
    ops = _profiled_ops(scenario)
    if not ops:
        kernel = scenario.workload.kernel
        raise InputError(source, name, f"kernel family {kernel!r} records no harness "
                         "frames; allowed with shmem_classic (the SHMEM examples' --perf CSV)")
    for q in csv_paths(p, ops):
        refuse_special(q, source, name)
    return p
