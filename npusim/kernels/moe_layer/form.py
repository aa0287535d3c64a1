"""A form of the layer on one chip: the kernels `op: moe_layer` runs for a `workload.form`,
and the host's hooks family moe_layer hands to them.

A form is picked from the workload alone (a run's kernels are named before a preset is
read): by `form` and by the weights' dtype, since the two chips' kernels take different
weights (the A3's W8A8 INT8, the 950's MX FP8). The family then refuses a form whose
kernels are not built for the preset's chip, in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npusim.kernels.family import Misfit
from npusim.kernels.kernel import Arrays, Kernel
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape

MX_WEIGHTS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp4_e1m2")  # the 950's kernels'


@dataclass(frozen=True)
class Form:
    """One form's kernels (in run order) and hooks; `chip` is DeepEP's platform of the
    preset its kernels are built for ("a3", "a5"), `weights` the dtypes they take."""

    name: str
    chip: str
    weights: tuple[str, ...]
    kernels: tuple[Kernel, ...]
    tiling_type: type
    tiling: Callable[[MoeShape, Mapping[str, Any], Any, bool], Any]
    misfit: Callable[[MoeShape, Mapping[str, Any], Any], Misfit | None]
    tiling_misfit: Callable[[Any, Any], Misfit | None]
    window: Callable[[Any], Any]
    make_inputs: Callable[[MoeShape, Mapping[str, Any], str, Routing, bool], list[Arrays]]
    op_inputs: Callable[[str, Any, list[Arrays], list[Arrays] | None], list[Arrays]]
    source: str  # the kernels' build for `chip`: "<the op's host file:line>, AddConfig(...)"

    @property
    def run(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kernels)


def pick(forms: Sequence[Form], options: Mapping[str, Any] | None) -> Form:
    """The form the options name, with the chip its weights' dtype selects (options may be
    a workload as written: defaults left out)."""
    o = options or {}
    name, chip = o.get("form", "unfused"), "a5" if o.get("weight_dtype") in MX_WEIGHTS else "a3"
    named = [f for f in forms if f.name == name] or list(forms)
    return next((f for f in named if f.chip == chip), named[0])


def chip_misfit(forms: Sequence[Form], form: Form, options: Mapping[str, Any],
                chip: str | None, hardware_name: str) -> Misfit | None:
    """The preset's chip against the form's: a build of the form for this chip with other
    weights names the weights; no build names the presets that have one."""
    if chip == form.chip:
        return None
    other = next((f for f in forms if f.name == form.name and f.chip == chip), None)
    if other is not None:
        wd = options.get("weight_dtype", "int8")
        return Misfit("workload.weight_dtype", f"{wd}: {form.name} on {hardware_name} runs "
                      f"the kernels of {other.source}, whose weights are "
                      f"{' or '.join(other.weights)}; allowed: {', '.join(other.weights)}")
    chips = sorted({f.chip for f in forms if f.name == form.name})
    presets = ", ".join(PRESET_OF_CHIP[c] for c in chips)
    return Misfit("hardware", f"{hardware_name}: {form.name} is built for {presets} only "
                  f"({form.source}); allowed: {presets}")


PRESET_OF_CHIP = {"a3": "atlas_a3", "a5": "ascend950"}
