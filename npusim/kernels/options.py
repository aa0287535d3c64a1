"""A family's workload options as values: declared once (`Option`), read as one typed view.

A family declares each option once, with its kind and default (npusim.kernels.family
Option); its tiling reads them as attributes. Both follow from the declarations here, so
a family neither repeats its options as a dataclass nor copies them field by field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, make_dataclass
from typing import Any

from npusim.kernels.family import Option

KIND_TYPES: Mapping[str, type] = {"choice": str, "str": str, "bool": bool, "int": int,
                                  "float": float, "ints": tuple}
"""The Python type a validated option of each kind holds ("ints": a tuple of int)."""


def option_values(declared: Sequence[Option], options: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared option's value: the given one, else its declared default."""
    return {o.name: options.get(o.name, o.default) for o in declared}


def options_view(name: str, declared: Sequence[Option]) -> type:
    """A frozen dataclass `name` with one field per declared option, typed by its kind;
    `view(**option_values(declared, options))` is a family's options as one value."""
    return make_dataclass(name, [(o.name, KIND_TYPES[o.kind]) for o in declared], frozen=True)


def fields_of(cls: type, values: Any) -> dict[str, Any]:
    """The attributes of `values` (an options view) that dataclass `cls` has a field of:
    what a tiling takes of the options as they are."""
    return {f.name: getattr(values, f.name) for f in fields(cls)
            if f.init and hasattr(values, f.name)}
