"""A scenario document -> a validated, frozen Scenario: the top-level keys, the hardware
preset with its overrides, the data source and the run limits, then the checks across
sections (npusim.scenario.checks)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.hw.config import HardwareConfig, load_hardware, preset_names
from npusim.kernels.family import Misfit
from npusim.paths import LOOP, resolved, user_path
from npusim.runtime import userguard
from npusim.scenario.checks import check_cores, check_topology, launch_misfit, misfit
from npusim.scenario.schema import dotted, number, section, show, string
from npusim.scenario.workload import Workload, routing_file, workload_of
from npusim.scenario.yaml import read_scenario_file

RUN_DEFAULTS: dict[str, Any] = {"sim_time_limit_us": 100000.0,
                                "wall_time_limit_s": userguard.DEFAULT_LIMIT_S}
TOP_KEYS = ("name", "description", "hardware", "hardware_overrides", "workload", "data", "run")
DEFAULT_HARDWARE = "ascend950"
FITS = userguard.optional_of(Misfit, "a npusim.kernels.family.Misfit (key, message)")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class DataSource:
    case_dir: Path | None = None  # absolute, already checked to be a directory


@dataclass(frozen=True)
class RunOptions:
    sim_time_limit_us: float = RUN_DEFAULTS["sim_time_limit_us"]
    # a guard, not a model input: left out of to_dict, so reports and digests ignore it
    wall_time_limit_s: float = RUN_DEFAULTS["wall_time_limit_s"]


@dataclass(frozen=True)
class Scenario:
    """A validated scenario; `hardware` is the loaded preset with overrides applied."""

    name: str
    description: str
    source: str  # the scenario file as given
    hardware_ref: str  # preset name or YAML path as written in the scenario
    hardware_overrides: dict[str, Any]  # flattened dotted keys
    hardware: HardwareConfig
    workload: Workload
    data: DataSource
    run: RunOptions

    @cached_property
    def tiling(self) -> Any:
        """The family's tiling of this scenario (its own type), built on first use and
        then carried: the memory estimate and every kernel of the run read this one."""
        w = self.workload
        if w.family is None:
            raise ValueError("a scenario linted without its kernel family has no tiling")
        t = userguard.call(w.family, "tiling", w.shape, w.options, self.hardware,
                           timing_only=w.timing_only, check=userguard.tiling)
        if w.family.sized_by_routing:
            t = userguard.call(w.family, "size_by_routing", t, w.shape, w.options, w.routing,
                               check=userguard.tiling)
        return t

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved scenario (defaults filled) for reports."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "hardware": self.hardware_ref,
            "hardware_name": self.hardware.name,
            "hardware_overrides": dict(sorted(self.hardware_overrides.items())),
            "workload": self.workload.to_dict(),
            "data": {"case_dir": str(self.data.case_dir) if self.data.case_dir else None},
            "run": {"sim_time_limit_us": self.run.sim_time_limit_us},
        }


def _flatten_overrides(src: str, raw: Any, prefix: str = "") -> dict[str, Any]:
    """Accept dotted keys and nested mappings alike; return flat dotted keys."""
    here = f"hardware_overrides.{prefix}" if prefix else "hardware_overrides"
    if raw is None and not prefix:
        return {}
    if not isinstance(raw, dict):
        raise InputError(src, here, "must be a mapping of dotted hardware keys to values")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not k or any(not p for p in k.split(".")):
            raise InputError(src, dotted(here, k), "must be a dotted key like fabric.egress_gbps")
        full = f"{prefix}.{k}" if prefix else k  # the key itself; messages cut it short
        if isinstance(v, dict):
            out.update(_flatten_overrides(src, v, full))
        elif full in out:
            raise InputError(src, dotted("hardware_overrides", full), "given twice")
        else:
            out[full] = v
    return out


def _resolve_hardware_ref(ref: str, base: Path) -> str:
    """Paths are relative to the scenario's folder; bare names are presets."""
    p = user_path(ref)
    looks_like_path = p.suffix in (".yaml", ".yml") or "/" in ref or "\\" in ref
    if looks_like_path and not p.is_absolute():
        return str(base / p)
    return str(p) if looks_like_path else ref


def _hardware(src: str, ref: str, overrides: dict[str, Any], base: Path) -> HardwareConfig:
    resolved = _resolve_hardware_ref(ref, base)
    try:
        return load_hardware(resolved, overrides, override_source=src)
    except InputError as exc:
        if exc.source == "hardware":  # unknown preset name
            raise InputError(src, "hardware", exc.message) from None
        if exc.source == resolved and exc.key is None and exc.message == LOOP:
            raise InputError(src, "hardware", f"{resolved} {LOOP}") from None
        if exc.source == resolved and exc.key is None and "not found" in exc.message:
            raise InputError(
                src,
                "hardware",
                f"file {resolved} not found; allowed: "
                f"{', '.join(preset_names())} or a path to a hardware YAML file",
            ) from None
        if exc.key in overrides:  # a bad override value: point at the scenario's key
            raise InputError(src, f"hardware_overrides.{exc.key}", exc.message) from None
        if exc.source == resolved and exc.key is None:  # the file as a whole: not a preset
            raise InputError(src, "hardware", f"{resolved}: {exc.message}; allowed: "
                             f"{', '.join(preset_names())} or a hardware YAML file") from None
        raise
    except (OSError, ValueError) as exc:
        names = ", ".join(preset_names())
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise InputError(
            src, "hardware", f"cannot use {show(ref)} ({why}); allowed: {names} or a YAML path"
        ) from None


def _run(src: str, raw: Any) -> RunOptions:
    doc = section(src, "run", raw, tuple(RUN_DEFAULTS))
    limit = number(
        src,
        "run.sim_time_limit_us",
        doc.get("sim_time_limit_us", RUN_DEFAULTS["sim_time_limit_us"]),
        0.0,
        1e9,
        lo_open=True,
    )
    wall = number(src, "run.wall_time_limit_s",
                  doc.get("wall_time_limit_s", RUN_DEFAULTS["wall_time_limit_s"]), 0.0, 1e6,
                  lo_open=True)
    return RunOptions(sim_time_limit_us=limit, wall_time_limit_s=wall)


def _case_dir(
    src: str, raw: Any, base: Path, override: str | Path | None
) -> tuple[Path | None, str, str]:
    """Return (absolute dir or None, error source, error key)."""
    if override is not None:
        o = str(override)
        if not o or "\x00" in o:
            raise InputError("command line", "--case-dir", "must be a directory path")
        return resolved(user_path(o), "command line", "--case-dir"), "command line", "--case-dir"
    doc = section(src, "data", raw, ("case_dir",))
    value = doc.get("case_dir")
    if value is None:
        return None, src, "data.case_dir"
    value = string(src, "data.case_dir", value)
    p = user_path(value)
    return resolved(p if p.is_absolute() else base / p, src, "data.case_dir"), src, "data.case_dir"



def folder_name_ok(name: str) -> bool:
    """Whether `name` is a plain file name an output folder may take (scenario_name)."""
    return bool(_NAME_RE.match(name)) and len(name) <= 128


def scenario_name(src: str, key: str, raw: Any) -> str:
    """The scenario's name, which outputs use as a folder name (out/<name>, a sweep's or
    advice's points): a plain file name, never a path that leads elsewhere."""
    name = string(src, key, raw)
    if not folder_name_ok(name):
        raise InputError(
            src,
            key,
            f"{show(name)} is not usable as a folder name; allowed: letters, digits, "
            "'_', '-', '.' (not starting with '.' or '-'), at most 128 characters",
        )
    return name


def load_scenario(path: str | Path, case_dir_override: str | Path | None = None,
                  import_kernels: bool = True) -> Scenario:
    """Read and validate a scenario file; raises InputError naming file and dotted key.
    import_kernels=False (`npusim lint`) does not import a user's kernel file or module:
    its options and fit are then not checked."""
    return scenario_from_doc(*read_scenario_file(path), case_dir_override, import_kernels)



def scenario_from_doc(doc: dict[str, Any], src: str, base: Path,
                      case_dir_override: str | Path | None = None,
                      import_kernels: bool = True) -> Scenario:
    """Validate a scenario given as a mapping (from a file, a CSV row or a sweep point);
    `src` names it in errors and relative paths resolve against `base`. The user code it
    runs (a kernel file's import, its family's fit checks and tiling) is held to the
    scenario's run.wall_time_limit_s."""
    section(src, "", doc, TOP_KEYS, ("name", "workload"))
    run = _run(src, doc.get("run"))
    with userguard.session(run.wall_time_limit_s):
        return _validated(doc, src, base, run, case_dir_override, import_kernels)


def _validated(doc: dict[str, Any], src: str, base: Path, run: RunOptions,
               case_dir_override: str | Path | None, import_kernels: bool) -> Scenario:

    name = scenario_name(src, "name", doc["name"])
    description = doc.get("description")
    description = (
        "" if description is None else string(src, "description", description, empty_ok=True)
    )

    workload = workload_of(src, doc["workload"], base, import_kernels)
    fam = workload.family
    workload = routing_file(src, workload, base)
    case_dir, case_src, case_key = _case_dir(src, doc.get("data"), base, case_dir_override)
    if case_dir is not None and workload.routing.kind == "file":
        raise InputError(case_src, case_key, "the case directory's expert_ids and "
                         "workload.routing.path would both give the routing; allowed "
                         "only without routing.kind: file")
    if case_dir is not None and fam is not None:
        problem = userguard.call(fam, "case_misfit", case_dir, workload.shape,
                                 workload.options, workload.op, workload.timing_only,
                                 check=userguard.optional_of(str, "a one-line message"))
        if problem:
            raise InputError(case_src, case_key, problem)

    ref = doc.get("hardware", DEFAULT_HARDWARE)
    ref = string(src, "hardware", ref)
    overrides = _flatten_overrides(src, doc.get("hardware_overrides"))
    hardware = _hardware(src, ref, overrides, base)
    if fam is not None:
        check_cores(src, fam, workload.op, hardware)
        misfit(src, userguard.call(fam, "misfit", workload.shape, workload.options, hardware,
                                   workload.op, check=FITS), overrides)
    scenario = Scenario(name=name, description=description, source=src, hardware_ref=ref,
                        hardware_overrides=overrides, hardware=hardware, workload=workload,
                        data=DataSource(case_dir=case_dir), run=run)
    if fam is not None:  # the tiling is built here, once, and the run reuses it
        misfit(src, userguard.call(fam, "tiling_misfit", scenario.tiling, workload.shape,
                                   workload.options, hardware, workload.op, check=FITS),
               overrides)
        misfit(src, launch_misfit(fam, workload, scenario.tiling, hardware), overrides)
    check_topology(src, workload, hardware)
    return scenario
