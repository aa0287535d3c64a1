"""The registry of kernel families: a name (or a user's file or module) -> its Family.

Built-in families are packages under npusim/kernels/ listed in BUILTIN and imported on
first use; each package exports FAMILY. A scenario may also name a family of its own:

- `path/to/f.py` (relative to the scenario): the file is imported as a module and its
  `FAMILY` is the family;
- `package.module:attr`: an importable module and the attribute holding the family.

Every failure is a FamilyError with one line (missing file, an import error with the file
and line, an incomplete declaration); the scenario loader reports it on workload.kernel.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from npusim.errors import InputError, NpusimError, excerpt
from npusim.kernels.exchange import Chain, ExchangeFamily
from npusim.kernels.family import Family, Option, Variant
from npusim.kernels.kernel import Kernel, Phase, TensorSpec
from npusim.paths import resolved, user_path
from npusim.runtime import userguard
from npusim.runtime.fault import exc_text
from npusim.suggest import did_you_mean
from npusim.workload.shape import ShapeLimits

BUILTIN: dict[str, str] = {"cann_sample": "npusim.kernels.cann_sample",
                           "mc2": "npusim.kernels.mc2",
                           "cann_gelu": "npusim.kernels.cann_gelu",
                           "rms_norm_quant": "npusim.kernels.rms_norm_quant",
                           "mega_moe": "npusim.kernels.mega_moe",
                           "mega_moe_unfused": "npusim.kernels.mega_moe.unfused",
                           "moe_layer": "npusim.kernels.moe_layer",
                           "shmem_classic": "npusim.kernels.shmem_classic",
                           "shmem_doubleplane": "npusim.kernels.shmem_doubleplane",
                           "tilelang_shmem": "npusim.kernels.tilelang_shmem",
                           "pypto_shmem": "npusim.kernels.pypto_shmem",
                           "shmem_host": "npusim.kernels.shmem_host",
                           "hixl": "npusim.kernels.hixl",
                           "kv_offload": "npusim.kernels.kv_offload",
                           "deepep": "npusim.kernels.deepep"}
DEFAULT = "cann_sample"
_MODULE_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_loaded: dict[str, Family] = {}


class FamilyError(Exception):
    """A kernel family that cannot be used; the message is one line."""


def names() -> list[str]:
    return sorted(BUILTIN)


def is_file_ref(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref or "\\" in ref


def is_module_ref(ref: str) -> bool:
    return bool(_MODULE_REF.match(ref))


def allowed_text() -> str:
    return f"{', '.join(names())}, a path to a .py file or module:attr"


def get(ref: str, base: Path | None = None) -> Family:
    """The family a scenario's workload.kernel names (base: the scenario's folder)."""
    if ref in BUILTIN:
        key = ref
        if key not in _loaded:
            _loaded[key] = _checked(importlib.import_module(BUILTIN[ref]).FAMILY, ref)
        return _loaded[key]
    if is_file_ref(ref):
        return from_file(resolve_file(ref, base))
    if is_module_ref(ref):
        return from_module(ref)
    raise FamilyError(f"unknown kernel family {ref!r}{did_you_mean(ref, names())}; "
                      f"allowed: {allowed_text()}")


def resolve_file(ref: str, base: Path | None) -> Path:
    p = user_path(ref)
    if not p.is_absolute() and base is not None:
        p = base / p
    if p.suffix != ".py":
        raise FamilyError(f"{ref}: a kernel file must be a .py file")
    try:
        real = resolved(p, ref, None)
    except InputError as exc:
        raise FamilyError(f"kernel file {exc.message}") from None
    if not real.is_file():
        raise FamilyError(f"kernel file {p} not found")
    return real


def from_file(path: Path) -> Family:
    key = str(path)
    if key in _loaded:
        return _loaded[key]
    name = "npusim_user_kernel_" + re.sub(r"\W", "_", path.stem) + f"_{len(_loaded)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FamilyError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        _loading(f"cannot import {path}", path, spec.loader.exec_module, module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    fam = _loading(f"{path}: FAMILY", path, getattr, module, "FAMILY", None)
    if fam is None:
        raise FamilyError(f"{path} defines no FAMILY (the kernel family object)")
    _loaded[key] = _checked(fam, str(path), path)
    return _loaded[key]


def from_module(ref: str) -> Family:
    if ref in _loaded:
        return _loaded[ref]
    mod_name, attr = ref.split(":")
    module = _loading(f"cannot import module {mod_name}", None, importlib.import_module,
                      mod_name)
    fam = _loading(f"{ref}", None, getattr, module, attr, None)
    if fam is None:
        raise FamilyError(f"module {mod_name} has no attribute {attr!r}")
    _loaded[ref] = _checked(fam, ref, None)
    return _loaded[ref]


def _loading(head: str, path: Path | None, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), user code run while a family loads (its import, constructor and
    declarations), under the guard: its fault is a FamilyError `head: exception (file,
    line)` (sys.exit() and every BaseException included: a kernel file cannot end
    npusim); the wall-clock limit and Ctrl-C stop it as they stop a run."""
    with userguard.session():
        try:
            with userguard.span():
                return fn(*args)
        except FamilyError:
            raise
        except BaseException as exc:  # noqa: BLE001 - user code: every kind is told apart
            if userguard.stopping(exc) is not None or isinstance(exc, (NpusimError,
                                                                       MemoryError)):
                raise userguard.fault(f"loading {path or head}", exc) from exc
            raise FamilyError(f"{head}: {_where(exc, path)}") from exc


def _where(exc: BaseException, path: Path | None) -> str:
    """The exception in one line with the file and line it comes from."""
    text = exc_text(exc)
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{text} ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        own = [f for f in frames if Path(f.filename) == path]
        frames = own or frames
    if frames:
        f = frames[-1]
        return f"{text} ({f.filename}, line {f.lineno})"
    return text


_HOOKS = ("tiling", "window", "make_inputs")
OPTION_KINDS = ("choice", "bool", "int", "float", "ints")
# A declared capability and the methods it promises (Family / Kernel class attributes)
FAMILY_DECLARES = (("references", ("reference_outputs",)), ("chains", ("next_reads",)),
                   ("case_format", ("case_misfit", "read_case", "write_case")),
                   ("sized_by_routing", ("size_by_routing",)))


def _undeclared(obj: Any, base: type, declares: tuple[tuple[str, tuple[str, ...]], ...]
                ) -> str | None:
    """Where obj's declarations and the methods its class implements disagree (one
    clause), or None: a declared capability needs every method it promises, and a
    method implemented needs its declaration."""
    for attr, methods in declares:
        own = [m for m in methods if getattr(type(obj), m) is not getattr(base, m)]
        if getattr(obj, attr):
            lacking = [m for m in methods if m not in own]
            if lacking:
                return (f"declares {attr} = {getattr(obj, attr)!r} but implements no "
                        f"{', '.join(lacking)}")
        elif own:
            return f"implements {', '.join(own)} but does not declare {attr}"
    return None


def _exchange_undeclared(fam: ExchangeFamily) -> str | None:
    """`_undeclared` for an ExchangeFamily, whose template already implements the chain:
    references promise the family's reference_dispatch (or its own reference_outputs),
    chains a declared `chain` (or its own next_reads)."""
    def own(method: str) -> bool:
        return getattr(type(fam), method) is not getattr(ExchangeFamily, method)

    if fam.references and not (own("reference_dispatch") or own("reference_outputs")):
        return "declares references = True but implements no reference_dispatch"
    if not fam.references and own("reference_dispatch"):
        return "implements reference_dispatch but does not declare references"
    if fam.chains and fam.chain is None and not own("next_reads"):
        return "declares chains = True but declares no chain"
    return _undeclared(fam, Family, FAMILY_DECLARES[2:])


def _checked(obj: Any, ref: str, path: Path | None = None) -> Family:
    """The family object (FAMILY, or an instance of the class FAMILY names), or
    FamilyError saying what its declaration lacks; the constructor and the reading of its
    declarations run under the guard (user code may raise or loop in either)."""
    fam = obj
    if isinstance(obj, type) and issubclass(obj, Family):
        fam = _loading(f"{ref}: the kernel family's constructor", path, obj)
    if not isinstance(fam, Family):
        raise FamilyError(f"{ref}: FAMILY is a {type(obj).__name__}, not a "
                          "npusim.kernels.family.Family")
    return _loading(f"{ref}: reading the kernel family's declarations", path, _declared,
                    fam, ref)


def _typed(obj: Any, table: tuple[tuple[str, Callable[[Any], bool], str], ...]
           ) -> tuple[str, Any, str] | None:
    """The first declaration of obj whose value is of the wrong type: (name, value,
    allowed), or None."""
    for attr, ok, allowed in table:
        value = getattr(obj, attr, None)
        if not ok(value):
            return attr, value, allowed
    return None


def _seq_of(kind: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (tuple, list)) and all(isinstance(x, kind) for x in v)


def _str_map_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, Mapping) and all(
        isinstance(k, str) and ok(x) for k, x in v.items())


def _is(*kinds: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, kinds)


_NAMES = _seq_of(str)
FAMILY_TYPES = (
    ("name", lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    ("help", _is(str), "a string"),
    ("ops", lambda v: _seq_of(Kernel)(v) and bool(v), "a tuple of Kernel objects"),
    ("runs", lambda v: _str_map_of(_NAMES)(v) and bool(v),
     "a dict {op name: (kernel name, ...)}"),
    ("options", _seq_of(Option), "a tuple of Option objects"),
    ("case_format", _is(str), "a string"),
    ("uses_moe_shape", _is(bool), "True or False"),
    ("variants", _seq_of(Variant), "a tuple of Variant objects"),
    ("references", _is(bool), "True or False"),
    ("chains", _is(bool), "True or False"),
    ("sized_by_routing", _is(bool), "True or False"),
)
# what an ExchangeFamily declares beyond them (npusim/kernels/exchange.py)
EXCHANGE_TYPES = (
    ("dispatch_quants", _str_map_of(_is(Mapping)), "a dict {quantisation: {option: value}}"),
    ("combine_quants", _str_map_of(_is(Mapping)), "a dict {quantisation: {option: value}}"),
    ("shape_limits", _is(ShapeLimits), "a npusim.workload.shape.ShapeLimits"),
    ("chain", _is(Chain, type(None)), "a npusim.kernels.exchange.Chain"),
)
KERNEL_TYPES = (
    ("name", lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    ("phases", _seq_of(Phase), "a tuple of Phase objects"),
    ("inputs", _seq_of(TensorSpec), "a tuple of TensorSpec objects"),
    ("outputs", _seq_of(TensorSpec), "a tuple of TensorSpec objects"),
    ("scratch", _seq_of(TensorSpec), "a tuple of TensorSpec objects"),
    ("core_kind", _is(str), "a core kind's name (aiv, aic, mix)"),
    ("engines", _NAMES, "a tuple of core kind names"),
    ("variant", _is(str, type(None)), "an option's name or None"),
    ("bandwidth", _is(str, type(None)), "a family_fields key or None"),
    ("profiles", _is(bool), "True or False"),
)


def _declared(fam: Family, ref: str) -> Family:
    """fam, once every declaration is there and of its type, and they agree."""
    missing = [a for a in ("name", "ops", "runs") if not getattr(fam, a, None)]
    for m in fam.modes.values():  # a family of modes: each mode runs, so holds the hooks
        _declared(m, ref)
    missing += [h for h in _HOOKS if not fam.modes and getattr(type(fam), h) is getattr(
        Family, h)]
    if missing:
        raise FamilyError(f"{ref}: incomplete kernel family: no {', '.join(missing)}")
    wrong = _typed(fam, FAMILY_TYPES) or (_typed(fam, EXCHANGE_TYPES)
                                          if isinstance(fam, ExchangeFamily) else None)
    if wrong:
        raise FamilyError(f"{ref}: kernel family declaration {wrong[0]} = "
                          f"{excerpt(wrong[1])}; allowed: {wrong[2]}")
    if fam.uses_moe_shape != isinstance(fam, ExchangeFamily):
        raise FamilyError(f"{ref}: kernel family declaration uses_moe_shape = "
                          f"{fam.uses_moe_shape}; allowed: {not fam.uses_moe_shape} (a family "
                          "reads the MoE shape when it is a npusim.kernels.exchange."
                          "ExchangeFamily)")
    for k in fam.ops:
        wrong = _typed(k, KERNEL_TYPES)
        if wrong:
            raise FamilyError(f"{ref}: kernel {type(k).__name__} declaration {wrong[0]} = "
                              f"{excerpt(wrong[1])}; allowed: {wrong[2]}")
    wrong = (None if fam.modes  # its modes implement what it declares, checked above
             else _exchange_undeclared(fam) if isinstance(fam, ExchangeFamily)
             else _undeclared(fam, Family, FAMILY_DECLARES))
    if wrong:
        raise FamilyError(f"{ref}: kernel family {fam.name!r} {wrong}")
    for o in fam.options:
        if not isinstance(o, Option) or o.kind not in OPTION_KINDS:
            raise FamilyError(f"{ref}: options must be Option objects of kind "
                              f"{', '.join(OPTION_KINDS)}, got {o!r}")
        if o.kind == "choice" and o.default not in o.choices:
            raise FamilyError(f"{ref}: option {o.name!r}: default {o.default!r} is not one of "
                              f"its choices {list(o.choices)}")
    for k in fam.ops:
        if not isinstance(k, Kernel) or not getattr(k, "name", None):
            raise FamilyError(f"{ref}: ops must be Kernel objects with a name, got {k!r}")
        if type(k).program is Kernel.program:
            raise FamilyError(f"{ref}: kernel {k.name!r} has no program")
        if k.profiles and type(k).fields is Kernel.fields:  # frames it would not read
            raise FamilyError(f"{ref}: kernel {k.name!r} of family {fam.name!r} declares "
                              "profiles = True but implements no fields")
    known = {k.name for k in fam.ops}
    for op, kernels in fam.runs.items():
        bad = [n for n in kernels if n not in known]
        if bad or not kernels:
            raise FamilyError(f"{ref}: runs[{op!r}] names unknown kernels {bad}; "
                              f"kernels: {', '.join(sorted(known))}")
    return fam


def options_owner(key: str) -> list[str]:
    """The built-in families that declare `key` as an option (for 'did you mean')."""
    return [n for n in names() if any(o.name == key for o in get(n).options)]
