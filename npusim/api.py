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

Kernel authors import from `npusim.author` instead (docs/authoring.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npusim import values
from npusim.errors import BlockedError, InputError, KernelError, NpusimError, excerpt
from npusim.fidelity.ledger import Ledger
from npusim.result import RunResult
from npusim.scenario import Scenario

__all__ = [
    # running scenarios
    "load", "run", "Run", "compare", "sweep", "presets", "scenarios", "Scenario",
    "InputError", "KernelError", "BlockedError", "NpusimError",
]

ScenarioLike = Scenario | str | Path | Mapping[str, Any]
SetsLike = Mapping[str, Any] | Sequence[str]
_DICT_SOURCE = "<scenario mapping>"


def load(scenario: ScenarioLike, *, set: SetsLike | None = None,
         case_dir: str | Path | None = None) -> Scenario:
    """A validated scenario from a shipped name, a file, a mapping or a Scenario.

    `set` maps dotted keys to values (`{"workload.bs": 64}`), or lists `KEY=VALUE`
    texts as `--set` takes them, applied to the document before validation; errors about
    them name the key. `case_dir` runs on a CANN-sample case directory's files
    (`--case-dir`). A mapping's relative paths resolve against the working directory."""
    from npusim.dotted import apply_sets
    from npusim.scenario import read_scenario_file
    from npusim.shipped import resolve

    sets = _sets(set)
    case = None if case_dir is None else values.path(case_dir, "case_dir")
    if isinstance(scenario, Scenario):
        if not sets and case is None:
            return scenario
        doc, src, base = _document_of(scenario), scenario.source, Path.cwd()
        if scenario.source and Path(scenario.source).is_file():
            base = Path(scenario.source).resolve().parent
    elif isinstance(scenario, Mapping):
        doc, src, base = values.plain(scenario, "scenario"), _DICT_SOURCE, Path.cwd()
    elif isinstance(scenario, (str, os.PathLike)):
        values.path(scenario, "scenario")
        doc, src, base = read_scenario_file(resolve(os.fspath(scenario)))
    else:
        raise InputError("api", "scenario", f"{type(scenario).__name__}; allowed: a shipped "
                         "scenario's name, a file path, a mapping or a Scenario")
    try:
        return apply_sets(doc, src, base, sets, case_dir_override=case, origin="api")
    except InputError as exc:  # the case directory's errors name the command's option
        if (exc.source, exc.key) == ("command line", "--case-dir"):
            raise InputError("api", "case_dir", exc.message) from None
        raise


def _sets(given: Any) -> list[tuple[str, Any]]:
    """`set` as (dotted key, value) pairs: a mapping's items (each value a plain copy), or
    `KEY=VALUE` texts parsed as `--set` parses them."""
    from npusim.dotted import parse_sets

    if given is None:
        return []
    if isinstance(given, Mapping):
        return [(key, values.plain(v, f"set {key}" if isinstance(key, str) else "set"))
                for key, v in given.items()]
    if isinstance(given, (list, tuple)):
        return parse_sets(given, origin="api")
    raise InputError("api", "set", f"{excerpt(given)}; allowed: a mapping of dotted keys to "
                     "values ({'workload.bs': 64}) or a list of 'KEY=VALUE' texts")


def _document_of(s: Scenario) -> dict[str, Any]:
    """A loaded scenario as the document that gives it again (every default filled)."""
    doc = values.plain(s.to_dict(), "scenario")
    for derived in ("source", "hardware_name"):  # where it came from, what the ref names
        doc.pop(derived, None)
    doc["workload"].pop("num_experts", None)  # W * L, not a key of its own
    doc["workload"].get("routing", {}).pop("sha256", None)  # the routing file's, read again
    return doc


class UnknownOp(InputError, KeyError):
    """An op the run does not have: bad input, and a failed lookup as a dict's is."""

    __str__ = InputError.__str__  # the one line, not KeyError's quoted repr


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
            from npusim.run_report import report_with_fidelity

            self._report = report_with_fidelity(self.result)
        return self._report

    @property
    def ledgers(self) -> dict[str, Ledger]:
        """Each op's fidelity ledger by op name (docs/fidelity.md): the tables that vouch
        for it, whether its shape is inside their rows, the assumed values it rests on."""
        from npusim.fidelity.run import op_fields, run_ledgers

        return run_ledgers(self.result.scenario, op_fields(self.result))

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
        return float(self._op(op)["latency_us"])

    def phases(self, op: str) -> dict[str, float]:
        """Each phase's duration (end - start, microseconds) for one op, in kernel order."""
        return {n: round(p["end_us"] - p["start_us"], 4)  # the report's 0.1 ns
                for n, p in self._op(op)["phases"].items()}

    def _op(self, op: Any) -> dict[str, Any]:
        """The report's entry for one op; UnknownOp if the run has none of that name."""
        for o in self.report["ops"]:
            if isinstance(op, str) and o["op"] == op:
                return o
        raise UnknownOp("api", "op", f"no op {excerpt(op)} in this run; allowed: "
                        f"{', '.join(self.ops)}")

    def trace(self) -> dict[str, Any]:
        """The Perfetto / Chrome trace document (per-pipe detail only if the run was
        made with `trace=True`)."""
        from npusim.report.trace import build_trace

        return build_trace(self.result)

    def _files(self, out: Any, tensors: Any, harness_csv: Any
               ) -> tuple[Path, Path | None, Path | None]:
        """The output paths, refused as `npusim run` refuses them (npusim.runfiles), and
        tensors only from a run that kept its inputs (else the dump would lack them)."""
        from npusim.runfiles import run_files

        if tensors is not None and not all(op.inputs for op in self.result.ops):
            raise InputError("api", "tensors", "this run kept no input tensors; allowed "
                             "with a run made by run(..., keep_inputs=True)")
        files = run_files(self.scenario, values.path(out, "out"),
                          None if tensors is None else values.path(tensors, "tensors"),
                          None if harness_csv is None else values.path(harness_csv,
                                                                       "harness_csv"),
                          source="api")
        return files.out, files.tensors, files.harness_csv

    def write(self, out: str | Path, *, trace: bool = False, tensors: str | Path | None = None,
              harness_csv: str | Path | None = None) -> list[tuple[str, Path, str]]:
        """Write what `npusim run` writes: report.json and report.md into `out`, with
        trace.json (`trace`), every op's GM tensors as .npy under `tensors` (the run must
        keep its inputs: `run(..., keep_inputs=True)`) and the SHMEM examples' perf CSV
        (`harness_csv`). They appear together or not at all (Ctrl-C included). Returns
        (what, path, note) per output."""
        from npusim.outputs import OutputSet
        from npusim.report.harness_csv import harness_files
        from npusim.report.io import RUN_FILES, write_json_atomic, write_text_atomic
        from npusim.report.markdown import format_markdown

        trace = values.flag(trace, "trace")
        folder, tensor_dir, csv = self._files(out, tensors, harness_csv)
        ops = tuple(o.op for o in self.result.ops)
        csv_files = [] if csv is None else harness_files(csv, self.report)
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


def run(scenario: ScenarioLike, *, set: SetsLike | None = None,
        trace: bool = False, timing_only: bool | None = None, workers: int = 1,
        keep_inputs: bool = False, progress: Callable[[str], None] | None = None) -> Run:
    """Simulate a scenario (loaded first if it is not a Scenario yet).

    `trace=True` records every pipe's spans for `Run.trace()`; `timing_only` overrides
    `workload.timing_only` (no bytes move: faster, same timing); `workers=2` simulates a
    dispatch_combine run's combine in a second process (same result); `keep_inputs` keeps
    every op's input arrays (for `Run.write(tensors=...)`); `progress(op)` is called as
    each op starts. The arguments are checked before anything is loaded or run."""
    from npusim.sim import simulate

    detailed = values.flag(trace, "trace")
    only = None if timing_only is None else values.flag(timing_only, "timing_only")
    n = values.whole(workers, "workers")
    keep = values.flag(keep_inputs, "keep_inputs")
    call = values.callback(progress, "progress")
    s = load(scenario, set=set)
    if only is not None and only != s.workload.timing_only:
        s = replace(s, workload=replace(s.workload, timing_only=only))
    kept = {"keep_inputs": True} if keep else {}
    return Run(s, simulate(s, detailed_trace=detailed, workers=n, progress=call, **kept))


def compare(a: Mapping[str, Any] | str | Path, b: Mapping[str, Any] | str | Path,
            tolerance: float = 0.05) -> Any:
    """B against A, op by op (reports as data, or report / baseline files), judged as
    `npusim compare --tolerance` judges: `.regressed`, `.rows`, and `str()` gives the
    table the command prints."""
    from npusim.report.compare import compare_profiles, load_profile, profile_of

    limit = values.finite(tolerance, "tolerance")

    def profile(x: Any, name: str) -> Any:
        if isinstance(x, Mapping):
            return profile_of(x, name.upper())
        if isinstance(x, (str, os.PathLike)):
            return load_profile(values.path(x, name))
        raise InputError("api", name, f"{type(x).__name__}; allowed: a report as data (a "
                         "mapping) or a report / baseline file's path")

    return _Comparison(compare_profiles(profile(a, "a"), profile(b, "b"), limit))


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
    from npusim.outputs import output_folder
    from npusim.shipped import resolve
    from npusim.sweep import BACKENDS, run_sweep

    values.path(path, "path")
    folder = output_folder(values.path(out, "out"), "out", ("results.csv",), "api")
    n = None if workers is None else values.whole(workers, "workers")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InputError("api", "backend", f"{excerpt(backend)}; allowed: "
                         f"{', '.join(BACKENDS)}")
    silent = values.flag(quiet, "quiet")
    return run_sweep(resolve(os.fspath(path), sweep=True), folder, workers=n, backend=backend,
                     quiet=silent)


def presets() -> list[str]:
    """The shipped hardware presets' names."""
    from npusim.shipped import configs_dir

    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def scenarios() -> list[str]:
    """The shipped scenarios' names (what `load` and `npusim run` accept by name)."""
    from npusim import shipped

    return list(shipped.scenarios())
