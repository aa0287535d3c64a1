"""Checks across sections, once each is valid on its own: the family's fit (its misfit,
its core kinds on the preset) and the ranks within the preset's topology."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npusim.errors import InputError, excerpt
from npusim.hw.config import HardwareConfig
from npusim.hw.cores import config_value
from npusim.hw.cores import kind as core_kind
from npusim.kernels.family import Misfit
from npusim.runtime import userguard
from npusim.scenario.workload import Workload
from npusim.values import is_integer


def misfit(src: str, m: Misfit | None, overrides: Mapping[str, Any]) -> None:
    """A family's misfit as an InputError: a hardware key is reported on its override if
    the scenario overrides it, else on `hardware`."""
    if m is None:
        return
    key = m.key
    if key.startswith("hardware."):
        hw_key = key[len("hardware."):]
        key = f"hardware_overrides.{hw_key}" if hw_key in overrides else "hardware"
    raise InputError(src, key, m.message)


def check_cores(src: str, fam: Any, op: str, hw: HardwareConfig) -> None:
    """Every core kind the op's kernels run on must exist on the preset (the AIC cores of
    a MIX kernel need its `aic` section)."""
    for kernel in fam.kernels_of(op):
        try:
            kind = core_kind(kernel.core_kind)
        except KeyError as exc:
            raise InputError(src, "workload.kernel", f"{fam.name}'s {kernel.name}: "
                             f"{exc.args[0]}") from None
        for part in [p for p, _ in kind.parts] or [kind]:
            if config_value(hw, part.count_key) is None:
                raise InputError(src, "hardware", f"{hw.name} has no {part.name.upper()} "
                                 f"cores ({part.count_key} is not in the preset); "
                                 f"{fam.name}'s {kernel.name} runs on {kind.name}")


def launch_misfit(fam: Any, w: Workload, tiling: Any, hw: HardwareConfig) -> Misfit | None:
    """Every kernel of the op launches at least one core (a MIX kernel one block) and no
    more than a rank has of each kind: the least count that works is the block's need
    for a launch sized to fit, or the launch's own for one that asks more."""
    for kernel in fam.kernels_of(w.op, w.options):
        kind = core_kind(kernel.core_kind)
        n = userguard.call(kernel, "cores", tiling)  # a user kernel's hook
        if n is not None and not is_integer(n):
            return Misfit("workload.kernel", f"{fam.name}'s {kernel.name}: cores(tiling) "
                          f"returned {excerpt(n)}; allowed: a whole number >= 1, or None "
                          "(every core)")
        for part, per in kind.parts or ((kind, 1),):
            have = int(config_value(hw, part.count_key))
            need = per * (1 if n is None else max(n, 1))
            if have < need:
                return Misfit(f"hardware.{part.count_key}", f"{have}: {fam.name}'s "
                              f"{kernel.name} needs {need} {part.name.upper()} cores "
                              f"({_launched(n, kind)}); allowed: at least {need}")
        if n is not None and n < 1:
            return Misfit("workload.kernel", f"{fam.name}'s {kernel.name} launches "
                          f"{_launched(n, kind)}; allowed: at least 1")
    return None


def _launched(n: int | None, kind: Any) -> str:
    unit = "block" if kind.parts else f"{kind.name.upper()} core"
    count = "every" if n is None else str(n)
    return f"{count} {unit}{'' if n == 1 else 's'}" + (
        " of " + " + ".join(f"{per} {p.name.upper()}" for p, per in kind.parts)
        if kind.parts else "")


def check_topology(src: str, w: Workload, hw: HardwareConfig) -> None:
    """Every rank of a MoE shape must sit in the topology: W at most the outermost level's
    dies (a family without one places its dies by its own options and checks them)."""
    if not hw.fabric.levels or w.shape is None:
        return
    outer = hw.fabric.levels[-1]
    if w.shape.W > outer.dies:
        raise InputError(
            src, "workload.ep_world_size",
            f"{w.shape.W} ranks do not fit {hw.name}'s topology: its outermost level, "
            f"{outer.name}, holds {outer.dies} dies; allowed: 2..{outer.dies}")

