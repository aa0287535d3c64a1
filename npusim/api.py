"""npusim from Python: the verbs of the command line as functions, for notebooks, sweeps
written by hand and other tools.

    import npusim.api as npu

    s = npu.load("dispatch_bs8_mxfp8", set={"workload.bs": 64})
    run = npu.run(s)
    run.latency_us("dispatch")           # one number
    run.report["ops"][0]["phases"]       # the report, as `npusim run` writes it
    npu.compare(run.report, npu.run(npu.load(s, set={"workload.bs": 128})).report)

A scenario is given as a shipped scenario's name, a file path, a mapping (the YAML
document as Python data) or an already loaded `Scenario`; `set` applies dotted keys on
top of it exactly as `--set` does, with the same validation. Bad input raises
`InputError` (its one-line text is what the command prints); a kernel's failure raises
`KernelError`. Nothing here prints or writes a file unless asked (`Run.write`).

Kernel authors import from here too: the family contract (`Family`, `Kernel`, `Option`,
`Phase`, `TensorSpec`, ...), `MoeShape`, the kernel context and its wait conditions
(docs/authoring.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npusim.errors import BlockedError, InputError, KernelError, NpusimError
from npusim.kernels.family import (
    Arrays,
    Family,
    Kernel,
    Misfit,
    Option,
    Phase,
    TensorSpec,
    Variant,
    const,
)
from npusim.kernels.shape import MoeShape
from npusim.result import RunResult
from npusim.runtime.conditions import AllEqual, AtLeast, SumEquals
from npusim.runtime.context import KernelContext, Strided
from npusim.scenario import Scenario
from npusim.workload.inputs import generate_inputs

__all__ = [
    # running scenarios
    "load", "run", "Run", "compare", "sweep", "presets", "scenarios", "Scenario",
    "InputError", "KernelError", "BlockedError", "NpusimError",
    # writing kernel families
    "Family", "Kernel", "Option", "Phase", "TensorSpec", "Misfit", "Arrays", "const", "Variant",
    "MoeShape", "KernelContext", "Strided", "AllEqual", "AtLeast", "SumEquals",
    "generate_inputs",
]

ScenarioLike = Scenario | str | Path | Mapping[str, Any]
_DICT_SOURCE = "<scenario mapping>"


def load(scenario: ScenarioLike, *, set: Mapping[str, Any] | None = None,
         case_dir: str | Path | None = None) -> Scenario:
    """A validated scenario from a shipped name, a file, a mapping or a Scenario.

    `set` maps dotted keys to values (`{"workload.bs": 64}`), applied to the document
    before validation as `--set` does; errors about them name the key. `case_dir` runs
    on a CANN-sample case directory's files (`--case-dir`). A mapping's relative paths
    resolve against the working directory."""
    from npusim.dotted import apply_sets
    from npusim.scenario import read_scenario_file
    from npusim.shipped import resolve

    if isinstance(scenario, Scenario):
        if not set and case_dir is None:
            return scenario
        doc, src, base = _document_of(scenario), scenario.source, Path.cwd()
        if scenario.source and Path(scenario.source).is_file():
            base = Path(scenario.source).resolve().parent
    elif isinstance(scenario, Mapping):
        doc, src, base = _plain(scenario), _DICT_SOURCE, Path.cwd()
    elif isinstance(scenario, (str, Path)):
        doc, src, base = read_scenario_file(resolve(str(scenario)))
    else:
        raise InputError("api", "scenario", f"{type(scenario).__name__}; allowed: a shipped "
                         "scenario's name, a file path, a mapping or a Scenario")
    sets = list((set or {}).items())
    return apply_sets(doc, src, base, sets, case_dir_override=case_dir, origin="set")


def _plain(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a mapping as plain dicts and lists (validation may not change
    the caller's data)."""
    def copy(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: copy(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [copy(x) for x in v]
        return v
    return copy(doc)


def _document_of(s: Scenario) -> dict[str, Any]:
    """A loaded scenario as the document that gives it again (every default filled)."""
    doc = _plain(s.to_dict())
    for derived in ("source", "hardware_name"):  # where it came from, what the ref names
        doc.pop(derived, None)
    doc["workload"].pop("num_experts", None)  # W * L, not a key of its own
    doc["workload"].get("routing", {}).pop("sha256", None)  # the routing file's, read again
    return doc


@dataclass
class Run:
    """One simulated scenario: the raw result, and the report built from it on demand."""

    scenario: Scenario
    result: RunResult
    _report: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def report(self) -> dict[str, Any]:
        """The report document (`npusim.report/1`), exactly what `npusim run` writes."""
        if self._report is None:
            from npusim.report.build import build_report

            self._report = build_report(self.result)
        return self._report

    @property
    def ops(self) -> list[str]:
        """The ops in kernel order (`dispatch`, `combine`, ...)."""
        return [o["op"] for o in self.report["ops"]]

    def latency_us(self, op: str | None = None) -> float:
        """One op's latency in microseconds; without `op`, the run's only op or the sum
        over its ops (a dispatch_combine run's two kernels back to back)."""
        ops = self.report["ops"]
        if op is None:
            return round(sum(o["latency_us"] for o in ops), 4)
        for o in ops:
            if o["op"] == op:
                return float(o["latency_us"])
        raise KeyError(f"no op {op!r} in this run; it has {', '.join(self.ops)}")

    def phases(self, op: str) -> dict[str, float]:
        """Each phase's duration (end - start, microseconds) for one op, in kernel order."""
        for o in self.report["ops"]:
            if o["op"] == op:
                return {n: round(p["end_us"] - p["start_us"], 4)  # the report's 0.1 ns
                        for n, p in o["phases"].items()}
        raise KeyError(f"no op {op!r} in this run; it has {', '.join(self.ops)}")

    def trace(self) -> dict[str, Any]:
        """The Perfetto / Chrome trace document (per-pipe detail only if the run was
        made with `trace=True`)."""
        from npusim.report.trace import build_trace

        return build_trace(self.result)

    def write(self, out: str | Path, *, trace: bool = False, tensors: str | Path | None = None,
              harness_csv: str | Path | None = None) -> list[tuple[str, Path, str]]:
        """Write what `npusim run` writes: report.json and report.md into `out`, with
        trace.json (`trace`), every op's GM tensors as .npy under `tensors` (the run must
        keep its inputs: `run(..., keep_inputs=True)`) and the SHMEM examples' perf CSV
        (`harness_csv`). They appear together or not at all (Ctrl-C included). Returns
        (what, path, note) per output."""
        from npusim.outputs import OutputSet, output_file, output_folder, refuse_shared
        from npusim.report.harness_csv import harness_files
        from npusim.report.io import RUN_FILES, run_claims, write_json_atomic, write_text_atomic
        from npusim.report.markdown import format_markdown

        folder = output_folder(out, "out", RUN_FILES, "api")
        tensor_dir = output_folder(tensors, "tensors", (), "api") if tensors is not None else None
        csv = output_file(harness_csv, "harness_csv", "api") if harness_csv is not None else None
        csv_files = harness_files(csv, self.report) if csv is not None else []
        ops = tuple(o.op for o in self.result.ops)
        refuse_shared(run_claims(folder, tensor_dir, [p for p, _ in csv_files], ops,
                                 ("out", "tensors", "harness_csv")), "api")
        written: list[tuple[str, Path, str]] = []
        with OutputSet() as outs:
            stage = outs.folder(folder, RUN_FILES)  # an earlier run's trace.json goes
            write_json_atomic(stage / "report.json", self.report, inline_leaves=True)
            write_text_atomic(stage / "report.md", format_markdown(self.report))
            written += [("report", folder / name, "") for name in ("report.json", "report.md")]
            if trace:
                from npusim.report.trace import dumps_trace

                write_text_atomic(stage / "trace.json", dumps_trace(self.trace()))
                written.append(("trace", folder / "trace.json",
                                "(open in https://ui.perfetto.dev or chrome://tracing)"))
            if tensor_dir is not None:
                from npusim.report.tensors import write_tensors

                files = write_tensors(outs.folder(tensor_dir, ops), self.result)  # per op
                written.append(("tensors", tensor_dir, f"({len(files)} .npy files: "
                                "<op>/rank_<r>/in|out/<name>.npy)"))
            for p, text in csv_files:
                write_text_atomic(outs.file(p), text)
                written.append(("harness csv", p, ""))
            outs.commit()
        return written


def run(scenario: ScenarioLike, *, set: Mapping[str, Any] | None = None,
        trace: bool = False, timing_only: bool | None = None, workers: int = 1,
        keep_inputs: bool = False, progress: Callable[[str], None] | None = None) -> Run:
    """Simulate a scenario (loaded first if it is not a Scenario yet).

    `trace=True` records every pipe's spans for `Run.trace()`; `timing_only` overrides
    `workload.timing_only` (no bytes move: faster, same timing); `workers=2` simulates a
    dispatch_combine run's combine in a second process (same result); `keep_inputs` keeps
    every op's input arrays (for `Run.write(tensors=...)`); `progress(op)` is called as
    each op starts."""
    from npusim.sim import simulate

    s = load(scenario, set=set)
    if timing_only is not None and timing_only != s.workload.timing_only:
        s = replace(s, workload=replace(s.workload, timing_only=bool(timing_only)))
    keep = {"keep_inputs": True} if keep_inputs else {}
    return Run(s, simulate(s, detailed_trace=trace, workers=workers, progress=progress, **keep))


def compare(a: Mapping[str, Any] | str | Path, b: Mapping[str, Any] | str | Path,
            tolerance: float = 0.05) -> Any:
    """B against A, op by op (reports as data, or report / baseline files), judged as
    `npusim compare --tolerance` judges: `.regressed`, `.rows`, and `str()` gives the
    table the command prints."""
    import math

    from npusim.report.compare import compare_profiles, load_profile, profile_of

    if not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) or tolerance < 0:
        raise InputError("api", "tolerance", f"{tolerance!r}; allowed: a finite number >= 0 "
                         "(0.05 is 5%)")

    def profile(x: Mapping[str, Any] | str | Path, name: str) -> Any:
        return profile_of(x, name) if isinstance(x, Mapping) else load_profile(x)

    return _Comparison(compare_profiles(profile(a, "A"), profile(b, "B"), float(tolerance)))


class _Comparison:
    """A comparison whose text is the command's table and verdict."""

    def __init__(self, cmp: Any) -> None:
        self._cmp = cmp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cmp, name)

    def __str__(self) -> str:
        from npusim.report.compare import format_comparison

        return format_comparison(self._cmp)


def sweep(path: str | Path, out: str | Path, *, workers: int | None = None,
          backend: str = "processes", quiet: bool = True) -> Path:
    """Run a sweep (a shipped sweep's name or a file) over the points not already done
    under `out` (resumable); returns out/results.csv."""
    from npusim.shipped import resolve
    from npusim.sweep import run_sweep

    return run_sweep(resolve(str(path), sweep=True), Path(out), workers=workers, backend=backend,
                     quiet=quiet)


def presets() -> list[str]:
    """The shipped hardware presets' names."""
    from npusim.shipped import configs_dir

    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def scenarios() -> list[str]:
    """The shipped scenarios' names (what `load` and `npusim run` accept by name)."""
    from npusim import shipped

    return list(shipped.scenarios())
