"""The shipped sensitivity records: configs/sensitivity/<preset>/<family>.json.

One record per (family, shipped preset) with a shipped scenario (scenarios/**, not
sweeps) that runs the family on the preset as the preset is (no hardware_overrides).
An op's reference scenario is the smallest of them that runs the op, by ep_world_size x
bs x h (a key the family has not counts 1), the first by name among equals: the record
stands for the family's op on the preset at the cost of its cheapest shipped run (a
family's modes and directions run different ops, so a record may have several
references). The record holds, per op, the TOP ranked assumed values
(npusim.sensitivity.perturb) and its reference's name; its bytes depend on nothing but
the model (sorted keys, no dates).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.fidelity.assumed import STEP, record_path
from npusim.sensitivity.perturb import sensitivity

TOP = 8  # ranked keys kept per op
_SIZE_KEYS = ("ep_world_size", "bs", "h")


def _named_family(kernel: Any) -> bool:
    """A registered family's name (not a user kernel's file or module path)."""
    from npusim.kernels import registry

    return isinstance(kernel, str) and kernel in registry.names()


def _size(workload: dict[str, Any]) -> int:
    size = 1
    for k in _SIZE_KEYS:
        v = workload.get(k)
        size *= v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1
    return size


@lru_cache(maxsize=8)
def _candidates(preset: str) -> tuple[tuple[int, str, str, tuple[str, ...]], ...]:
    """(size, shipped name, family, ops) of every shipped scenario on `preset` as the
    preset is, smallest first (validating them all takes seconds: kept per process)."""
    from npusim import shipped
    from npusim.kernels import registry
    from npusim.scenario import read_scenario_file, scenario_from_doc
    from npusim.scenario.load import DEFAULT_HARDWARE

    found = []
    for name, path in shipped.scenarios().items():
        doc, src, base = read_scenario_file(path)
        w = doc.get("workload") or {}
        family = w.get("kernel", registry.DEFAULT)
        if (doc.get("hardware", DEFAULT_HARDWARE) != preset or doc.get("hardware_overrides")
                or not _named_family(family)):
            continue
        ops = scenario_from_doc(doc, src, base).workload.ops
        found.append((_size(w), name, family, tuple(ops)))
    return tuple(sorted(found))


def references(preset: str) -> dict[str, dict[str, str]]:
    """family -> op -> its reference scenario's shipped name: the smallest scenario that
    runs the op, for every family with a shipped scenario on `preset` as it is."""
    refs: dict[str, dict[str, str]] = {}
    for _, name, family, ops in _candidates(preset):
        for op in ops:
            refs.setdefault(family, {}).setdefault(op, name)
    return {f: dict(sorted(refs[f].items())) for f in sorted(refs)}


def record_doc(family: str, preset: str, workers: int | None, out: Path,
               quiet: bool = True) -> dict[str, Any]:
    """The record of `family` on `preset`, computed now (each reference's runs resumable
    under out/<its name>)."""
    from npusim import shipped
    from npusim.scenario import read_scenario_file

    refs = references(preset)
    if family not in refs:
        raise InputError("command line", "--family", f"{family!r} has no shipped scenario on "
                         f"{preset} as the preset is; allowed: {', '.join(refs) or 'none'}")
    ops: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for at in sorted(set(refs[family].values())):
        doc, src, base = read_scenario_file(shipped.scenarios()[at])
        sens = sensitivity(doc, src, base, out / at, workers, quiet,
                           title="presets --sensitivity").as_doc(top=TOP)
        runs[at] = {k: sens[k] for k in ("base_us", "probed", "skipped")}
        ops.update({op: {"at": at, "assumed": sens["ops"][op]}
                    for op, ref in refs[family].items() if ref == at})
    return {"family": family, "preset": preset, "step": STEP, "top": TOP, "ops": ops,
            "references": runs}


def write_record(family: str, preset: str, workers: int | None, out: Path,
                 quiet: bool = True) -> Path:
    """Compute and write one record (whole or not at all)."""
    from npusim.report.io import write_json_atomic

    path = record_path(family, preset)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(path, record_doc(family, preset, workers, out, quiet),
                             sort_keys=True, inline_leaves=True)
