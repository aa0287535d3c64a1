"""The shipped sensitivity records: configs/sensitivity/<preset>/<family>.json.

One record per (family, shipped preset) with a shipped scenario (scenarios/**, not
sweeps) that runs the family on the preset as the preset is (no hardware_overrides).
Its reference scenario is the smallest of them by ep_world_size x bs x h (a key the
family has not counts 1), the first by name among equals: the record stands for the
family on the preset at the cost of its cheapest shipped run. The record holds, per op
of that run, the TOP ranked assumed values (npusim.fidelity.sensitivity) and the
reference's name; its bytes depend on nothing but the model (sorted keys, no dates).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.fidelity.sensitivity import record_path, sensitivity

TOP = 8  # ranked keys kept per op
_SIZE_KEYS = ("ep_world_size", "bs", "h")


def _named_family(kernel: Any) -> bool:
    """A shipped family's name (not a user kernel's file or module path)."""
    return isinstance(kernel, str) and kernel.isidentifier()


def _size(workload: dict[str, Any]) -> int:
    size = 1
    for k in _SIZE_KEYS:
        v = workload.get(k)
        size *= v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1
    return size


def references(preset: str) -> dict[str, str]:
    """family -> its reference scenario's shipped name, for every family with a shipped
    scenario on `preset` as the preset is."""
    from npusim import shipped
    from npusim.scenario import read_scenario_file
    from npusim.scenario.load import DEFAULT_HARDWARE

    best: dict[str, tuple[int, str]] = {}
    for name, path in shipped.scenarios().items():
        doc, _, _ = read_scenario_file(path)
        w = doc.get("workload") or {}
        family = w.get("kernel", "cann_sample")
        if (doc.get("hardware", DEFAULT_HARDWARE) != preset or doc.get("hardware_overrides")
                or not _named_family(family)):
            continue
        here = (_size(w), name)
        if family not in best or here < best[family]:
            best[family] = here
    return {f: best[f][1] for f in sorted(best)}


def record_doc(family: str, preset: str, workers: int | None, out: Path,
               quiet: bool = True) -> dict[str, Any]:
    """The record of `family` on `preset`, computed now (resumable under `out`)."""
    from npusim import shipped
    from npusim.scenario import read_scenario_file

    at = references(preset).get(family)
    if at is None:
        raise InputError("command line", "--family", f"{family!r} has no shipped scenario on "
                         f"{preset} as the preset is; allowed: "
                         f"{', '.join(references(preset)) or 'none'}")
    doc, src, base = read_scenario_file(shipped.scenarios()[at])
    sens = sensitivity(doc, src, base, out, workers, quiet, title="presets --sensitivity")
    rec = sens.as_doc(top=TOP)
    rec.update(at=at, family=family, preset=preset)
    return rec


def write_record(family: str, preset: str, workers: int | None, out: Path,
                 quiet: bool = True) -> Path:
    """Compute and write one record (whole or not at all)."""
    from npusim.report.io import write_json_atomic

    path = record_path(family, preset)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(path, record_doc(family, preset, workers, out, quiet),
                             sort_keys=True, inline_leaves=True)
