"""Scenario YAML -> a validated, frozen Scenario.

A scenario is the whole description of one run: hardware preset (+ dotted overrides),
the MoE workload, an optional CANN-sample case directory and run limits. Users edit
these files by hand, so every problem is an InputError naming the file, the dotted key
and what is allowed; nothing is silently defaulted or ignored. The shape limits are the
family's own declaration (Family.shape_limits); docs/scenario.md lists them all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npusim.errors import InputError, excerpt, key_text
from npusim.hw.config import HardwareConfig, load_hardware, preset_names
from npusim.hw.cores import config_value
from npusim.hw.cores import kind as core_kind
from npusim.kernels import registry
from npusim.kernels.family import Family, Misfit, Option
from npusim.kernels.shape import MoeShape, ShapeLimits
from npusim.paths import user_path
from npusim.suggest import did_you_mean
from npusim.useryaml import load_text
from npusim.workload.routing import LOGNORMAL_SIGMA, ZIPF_DEFAULT_S, Routing
from npusim.workload.routing import ROUTING_KINDS as DRAWN_KINDS
from npusim.workload.routing_file import read_routing_file

DTYPES = ("float16", "bfloat16")
ROUTING_KINDS = DRAWN_KINDS + ("file",)

SEED_RANGE = (0, 2**32 - 1)
# The shape bounds `npusim lint` holds a user family it does not import to: any shape the
# loader can represent; the family's own shape_limits are checked when it runs.
_ANY = 2**31 - 1
UNIMPORTED_LIMITS = ShapeLimits(bs=(1, _ANY), h=(1, _ANY), h_multiple=1, k=(1, _ANY),
                                ep_world_size=(2, _ANY), experts=_ANY, shared_experts=(0, _ANY),
                                source="the family's own, checked when it runs",
                                why="the loader's bound")
SIGMA_MAX = 10.0  # the hottest of 1024 experts outweighs the median by e^32: one expert

WORKLOAD_REQUIRED = ("op", "bs", "h", "k", "ep_world_size", "experts_per_rank")
# The shape a family that does not read the MoE keys runs with when they are left out
# (Family.uses_moe_shape False): the smallest valid one.
NEUTRAL_SHAPE: dict[str, int] = {"bs": 1, "h": 1024, "k": 1, "ep_world_size": 2,
                                 "experts_per_rank": 1}
# Generic keys every family reads; a family's own options come from its declaration.
WORKLOAD_DEFAULTS: dict[str, Any] = {
    "kernel": registry.DEFAULT,
    "dtype": "float16",
    "shared_experts": 0,
    "shared_expert_ranks": 0,
    "timing_only": False,
    "routing": {"kind": "balanced", "seed": 0},
}
ROUTING_DEFAULTS: dict[str, Any] = {"kind": "balanced", "seed": 0}
RUN_DEFAULTS: dict[str, Any] = {"sim_time_limit_us": 100000.0, "wall_time_limit_s": 3600.0}
TOP_KEYS = ("name", "description", "hardware", "hardware_overrides", "workload", "data", "run")
DEFAULT_HARDWARE = "ascend950"
MAX_REF_CHARS = 4096  # PATH_MAX: a longer kernel reference names no file
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Workload:
    """The generic MoE workload plus the kernel family and its validated options
    (readable as attributes too: ``w.dispatch_quant``)."""

    op: str
    bs: int
    h: int
    k: int
    ep_world_size: int
    experts_per_rank: int
    dtype: str = "float16"
    shared_experts: int = 0
    timing_only: bool = False
    routing: Routing = field(default_factory=Routing)
    shared_expert_ranks: int = 0
    kernel: str = registry.DEFAULT  # as written: a built-in name, a .py path or module:attr
    options: Mapping[str, Any] = field(default_factory=dict)
    # None only when `npusim lint` checked a user family without importing it
    family: Family | None = field(default=None, compare=False, repr=False)

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in options:
            return options[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def shape(self) -> MoeShape:
        return MoeShape(self.ep_world_size, self.bs, self.h, self.k, self.experts_per_rank,
                        self.shared_experts, self.shared_expert_ranks, self.dtype)

    @property
    def num_experts(self) -> int:
        """E = (W - S_r) * L MoE experts (W * L without shared experts)."""
        return (self.ep_world_size - self.shared_expert_ranks) * self.experts_per_rank

    @property
    def ops(self) -> tuple[str, ...]:
        """Kernel calls in run order."""
        return (tuple(self.family.runs_of(self.options)[self.op]) if self.family is not None
                else (self.op,))

    @property
    def max_recv_rows(self) -> int:
        """A = BS * W * min(K, L): the most rows one MoE rank can receive."""
        return self.bs * self.ep_world_size * min(self.k, self.experts_per_rank)

    def to_dict(self) -> dict[str, Any]:
        """Generic keys, then the family's options in declaration order. A family without
        the MoE shape (Family.uses_moe_shape False) gets none of its keys: the neutral
        values its scenario was filled with describe nothing it runs."""
        if self.family is not None and not self.family.uses_moe_shape:
            return {"kernel": self.kernel, "op": self.op, "dtype": self.dtype,
                    **self.options, "timing_only": self.timing_only}
        return {
            "kernel": self.kernel,
            "op": self.op,
            "bs": self.bs,
            "h": self.h,
            "k": self.k,
            "ep_world_size": self.ep_world_size,
            "experts_per_rank": self.experts_per_rank,
            "num_experts": self.num_experts,
            "dtype": self.dtype,
            **self.options,
            "shared_experts": self.shared_experts,
            "shared_expert_ranks": self.shared_expert_ranks,
            "timing_only": self.timing_only,
            "routing": self.routing.to_dict(),
        }


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


# ----------------------------------------------------------------------------- primitives


def _dotted(prefix: str, key: object) -> str:
    return f"{prefix}.{key_text(key)}" if prefix else key_text(key)


def _section(
    src: str, key: str, raw: Any, allowed: Iterable[str], required: Iterable[str] = ()
) -> dict[str, Any]:
    """Check a mapping's keys: unknown ones get a did-you-mean, missing required ones named."""
    allowed = list(allowed)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        where = key or None
        raise InputError(src, where, f"must be a mapping with keys: {', '.join(allowed)}")
    for k in raw:
        if not isinstance(k, str) or k not in allowed:
            hint = did_you_mean(str(k), allowed)
            raise InputError(
                src, _dotted(key, k), f"unknown key{hint}; allowed: {', '.join(allowed)}"
            )
    for r in required:
        if r not in raw:
            raise InputError(src, _dotted(key, r), "missing (required)")
    return raw


def _show(raw: Any) -> str:
    """A value as the user wrote it in YAML (true, null), not as Python prints it, and
    at most a short excerpt of it (errors.excerpt)."""
    return excerpt(raw)


def _int(src: str, key: str, raw: Any, lo: int, hi: int | None, why: str = "") -> int:
    span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    note = f" ({why})" if why else ""
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InputError(src, key, f"must be an integer {span}{note}, got {_show(raw)}")
    if raw < lo or (hi is not None and raw > hi):
        raise InputError(src, key, f"{_show(raw)} is out of range; allowed: {span}{note}")
    return raw


def _float(src: str, key: str, raw: Any, lo: float, hi: float, *, lo_open: bool) -> float:
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InputError(src, key, f"must be a number in {span}, got {_show(raw)}")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise InputError(src, key, f"{_show(raw)} is out of range, not a finite number; "
                         f"allowed: {span}")
    bad_lo = raw <= lo if lo_open else raw < lo  # int against float: exact, never overflows
    if bad_lo or raw > hi:
        raise InputError(src, key, f"{_show(raw)} is out of range; allowed: {span}")
    return float(raw)


def _bool(src: str, key: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise InputError(src, key, f"must be true or false, got {_show(raw)}")
    return raw


def _choice(src: str, key: str, raw: Any, choices: tuple[str, ...]) -> str:
    allowed = ", ".join(choices)
    if not isinstance(raw, str):
        raise InputError(src, key, f"must be one of: {allowed}; got {_show(raw)}")
    if raw not in choices:
        hint = did_you_mean(raw, choices)
        raise InputError(src, key, f"unknown value {_show(raw)}{hint}; allowed: {allowed}")
    return raw


def _str(src: str, key: str, raw: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(raw, str) or (not empty_ok and not raw.strip()):
        raise InputError(src, key, f"must be a {'' if empty_ok else 'non-empty '}string")
    if "\x00" in raw:
        raise InputError(src, key, "must not contain NUL characters")
    return raw


# ----------------------------------------------------------------------------- YAML


def _read_yaml(path: Path, src: str) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InputError(src, None, "is a directory, expected a scenario YAML file") from None
    except OSError as exc:
        raise InputError(src, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(src, None, f"not UTF-8 text (byte {exc.start})") from None
    doc = load_text(text, src)
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise InputError(src, None, f"must be a YAML mapping of scenario keys, got {kind}")
    return doc


# ----------------------------------------------------------------------------- sections


ROUTING_PARAMS = {"s": "zipf", "sigma": "lognormal", "path": "file"}  # key: its one kind


def _routing(src: str, raw: Any) -> Routing:
    key = "workload.routing"
    doc = _section(src, key, raw, ("kind", "seed", *ROUTING_PARAMS))
    kind = _choice(src, f"{key}.kind", doc.get("kind", ROUTING_DEFAULTS["kind"]), ROUTING_KINDS)
    seed = _int(src, f"{key}.seed", doc.get("seed", ROUTING_DEFAULTS["seed"]), *SEED_RANGE)
    for param, owner in ROUTING_PARAMS.items():
        if param in doc and kind != owner:
            raise InputError(src, f"{key}.{param}",
                             f"only used with kind: {owner} (kind is {kind!r})")
    s = sigma = path = None
    if kind == "zipf":
        s = _float(src, f"{key}.s", doc.get("s", ZIPF_DEFAULT_S), 0.0, 100.0, lo_open=True)
    elif kind == "lognormal":
        sigma = _float(src, f"{key}.sigma", doc.get("sigma", LOGNORMAL_SIGMA), 0.0, SIGMA_MAX,
                       lo_open=True)
    elif kind == "file":
        if "path" not in doc:
            raise InputError(src, f"{key}.path", "missing (required with kind: file); "
                             "allowed: a .npy file of [W, BS, K] int32 expert ids")
        path = _str(src, f"{key}.path", doc["path"])
    return Routing(kind=kind, seed=seed, s=s, sigma=sigma, path=path)


def _routing_file(src: str, w: Workload, base: Path) -> Workload:
    """kind file: read and check the ids now (so lint catches a bad file); the workload
    keeps them and the file's SHA-256, which the resolved scenario reports."""
    r = w.routing
    if r.kind != "file" or r.path is None:
        return w
    p = user_path(r.path)
    got = read_routing_file(p if p.is_absolute() else base / p, r.path, src,
                            "workload.routing.path", w.ep_world_size, w.bs, w.k, w.num_experts)
    return replace(w, routing=replace(r, sha256=got.sha256, ids=got.ids))


def _family(src: str, raw: Any, base: Path, import_kernels: bool) -> Family | None:
    """The family workload.kernel names; None for a user's file or module when lint
    checks the scenario without importing it (the file must still exist)."""
    ref = raw.get("kernel", registry.DEFAULT) if isinstance(raw, dict) else registry.DEFAULT
    ref = _str(src, "workload.kernel", ref)
    if len(ref) > MAX_REF_CHARS:
        raise InputError(src, "workload.kernel", f"{_show(ref)}: longer than {MAX_REF_CHARS} "
                         "characters; allowed: a family name, a .py file or module:attr")
    try:
        if not import_kernels and ref not in registry.BUILTIN:
            if registry.is_file_ref(ref):
                registry.resolve_file(ref, base)
            elif not registry.is_module_ref(ref):
                registry.get(ref)  # the unknown-family error
            return None
        return registry.get(ref, base)
    except registry.FamilyError as exc:
        raise InputError(src, "workload.kernel", str(exc)) from None


def _other_family_option(src: str, raw: Any, fam: Family | None, allowed: tuple[str, ...]
                         ) -> None:
    """A key that is an option of another family: say whose, and list the families."""
    if fam is None or not isinstance(raw, dict):
        return
    for name in raw:
        if isinstance(name, str) and name not in allowed:
            owners = [o for o in registry.options_owner(name) if o != fam.name]
            if owners:
                raise InputError(
                    src, f"workload.{name}",
                    f"an option of kernel family {', '.join(owners)}, not of {fam.name} "
                    f"(workload.kernel); did you mean workload.kernel: {owners[0]}? "
                    f"families: {', '.join(registry.names())}")


def _options(src: str, fam: Family | None, doc: dict[str, Any]) -> dict[str, Any]:
    """The family's options, each validated by its declared type and range."""
    if fam is None:  # lint without importing: kept as written, checked at run time
        return {k: v for k, v in doc.items()
                if k not in WORKLOAD_REQUIRED and k not in WORKLOAD_DEFAULTS}
    return {o.name: _option(src, o, doc.get(o.name, o.default)) for o in fam.options}


def _option(src: str, o: Option, raw: Any) -> Any:
    key = f"workload.{o.name}"
    if o.kind == "choice":
        return _choice(src, key, raw, o.choices)
    if o.kind == "bool":
        return _bool(src, key, raw)
    lo = o.lo if o.lo is not None else -math.inf
    if o.kind == "int":
        return _int(src, key, raw, int(o.lo or 0), None if o.hi is None else int(o.hi))
    if o.kind == "ints":  # a list of integers, e.g. one per rank ([] when not given)
        if not isinstance(raw, (list, tuple)):
            raise InputError(src, key, f"must be a list of integers, got {_show(raw)}")
        return tuple(_int(src, f"{key}[{i}]", v, int(o.lo or 0),
                          None if o.hi is None else int(o.hi)) for i, v in enumerate(raw))
    return _float(src, key, raw, lo, o.hi if o.hi is not None else math.inf, lo_open=False)


def _workload(src: str, raw: Any, base: Path, import_kernels: bool = True) -> Workload:
    key = "workload"
    fam = _family(src, raw, base, import_kernels)
    own = tuple(o.name for o in fam.options) if fam is not None else ()
    allowed = WORKLOAD_REQUIRED + tuple(WORKLOAD_DEFAULTS) + own
    _other_family_option(src, raw, fam, allowed)
    if fam is None and isinstance(raw, dict):  # a user family's options: unknown here
        allowed += tuple(k for k in raw if isinstance(k, str))
    neutral = fam is not None and not fam.uses_moe_shape
    doc = _section(src, key, raw, allowed, ("op",) if neutral else WORKLOAD_REQUIRED)
    if neutral:
        doc = {**NEUTRAL_SHAPE, **doc}

    def get(name: str) -> Any:
        return doc[name] if name in doc else WORKLOAD_DEFAULTS[name]

    def k_(name: str) -> str:
        return f"{key}.{name}"

    op = _choice(src, k_("op"), doc["op"], tuple(fam.runs) if fam is not None
                 else (doc["op"],) if isinstance(doc["op"], str) else ())
    lim: ShapeLimits = fam.shape_limits if fam is not None else UNIMPORTED_LIMITS
    max_e = lim.experts
    bs = _int(src, k_("bs"), doc["bs"], *lim.bs, why=lim.why)
    h = _int(src, k_("h"), doc["h"], *lim.h, why=lim.why)
    if h % lim.h_multiple:
        raise InputError(
            src,
            k_("h"),
            f"{h} is not a multiple of {lim.h_multiple}; allowed: multiples of "
            f"{lim.h_multiple} in {lim.h[0]}..{lim.h[1]} ({lim.why}: MX blocks, whole 32 B "
            "UB blocks)",
        )
    k = _int(src, k_("k"), doc["k"], *lim.k, why=lim.why)
    w = _int(src, k_("ep_world_size"), doc["ep_world_size"], *lim.ep_world_size, why=lim.why)
    shared, shared_ranks = _shared(src, k_, get("shared_experts"), get("shared_expert_ranks"), w,
                                   lim)
    moe_ranks = w - shared_ranks
    l_ = _int(
        src,
        k_("experts_per_rank"),
        doc["experts_per_rank"],
        1,
        max_e // 2,
        why=f"and ep_world_size * experts_per_rank <= {max_e}" if not shared_ranks
        else f"and (ep_world_size - shared_expert_ranks) * experts_per_rank <= {max_e}",
    )
    e = moe_ranks * l_
    if e > max_e:
        if shared_ranks:
            what = f"(ep_world_size - shared_expert_ranks) * experts_per_rank = {moe_ranks} * "
        else:
            what = f"ep_world_size * experts_per_rank = {w} * "
        raise InputError(
            src,
            k_("experts_per_rank"),
            f"{what}{l_} = {e} experts; allowed: at most "
            f"{max_e} ({lim.why}), so experts_per_rank <= {max_e // moe_ranks}",
        )
    if k > e:
        which = ("ep_world_size * experts_per_rank" if not shared_ranks
                 else "MoE experts, (ep_world_size - shared_expert_ranks) * experts_per_rank")
        raise InputError(
            src,
            k_("k"),
            f"top-k {k} exceeds the {e} experts ({which}); a token's K experts are distinct, "
            f"so allowed: k <= {e}",
        )
    return Workload(
        op=op,
        bs=bs,
        h=h,
        k=k,
        ep_world_size=w,
        experts_per_rank=l_,
        dtype=_choice(src, k_("dtype"), get("dtype"), DTYPES),
        shared_experts=shared,
        timing_only=_bool(src, k_("timing_only"), get("timing_only")),
        routing=_routing(src, doc.get("routing", WORKLOAD_DEFAULTS["routing"])),
        shared_expert_ranks=shared_ranks,
        kernel=get("kernel"),
        options=_options(src, fam, doc),
        family=fam,
    )


def _shared(src: str, k_: Any, raw_s: Any, raw_sr: Any, w: int, lim: ShapeLimits
            ) -> tuple[int, int]:
    """(S, S_r) under ops-transformer V2's rules: S in the family's range (V2: 0..4), S_r
    in 0..W-1, both zero or both nonzero, S_r a multiple of S (each shared expert on
    R = S_r / S ranks)."""
    shared = _int(src, k_("shared_experts"), raw_s, *lim.shared_experts, why=lim.why)
    ranks = _int(src, k_("shared_expert_ranks"), raw_sr, 0, w - 1,
                 why="ranks 0..S_r-1 hold the shared experts; at least one MoE rank remains")
    if shared and not ranks:
        raise InputError(
            src, k_("shared_expert_ranks"),
            f"0 with shared_experts: {shared}; allowed: a multiple of {shared} in "
            f"{shared}..{w - 1} (the shared experts need ranks of their own)")
    if ranks and not shared:
        raise InputError(
            src, k_("shared_experts"),
            f"0 with shared_expert_ranks: {ranks}; allowed: 1..{lim.shared_experts[1]} "
            f"dividing {ranks}, or set shared_expert_ranks: 0")
    if shared and ranks % shared:
        raise InputError(
            src, k_("shared_expert_ranks"),
            f"{ranks} is not a multiple of shared_experts ({shared}); allowed: multiples of "
            f"{shared} in {shared}..{w - 1} (each shared expert on S_r / S ranks)")
    return shared, ranks


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
            raise InputError(src, _dotted(here, k), "must be a dotted key like fabric.egress_gbps")
        full = f"{prefix}.{k}" if prefix else k  # the key itself; messages cut it short
        if isinstance(v, dict):
            out.update(_flatten_overrides(src, v, full))
        elif full in out:
            raise InputError(src, _dotted("hardware_overrides", full), "given twice")
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
            src, "hardware", f"cannot use {_show(ref)} ({why}); allowed: {names} or a YAML path"
        ) from None


def _run(src: str, raw: Any) -> RunOptions:
    doc = _section(src, "run", raw, tuple(RUN_DEFAULTS))
    limit = _float(
        src,
        "run.sim_time_limit_us",
        doc.get("sim_time_limit_us", RUN_DEFAULTS["sim_time_limit_us"]),
        0.0,
        1e9,
        lo_open=True,
    )
    wall = _float(src, "run.wall_time_limit_s",
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
        return user_path(o).resolve(), "command line", "--case-dir"
    doc = _section(src, "data", raw, ("case_dir",))
    value = doc.get("case_dir")
    if value is None:
        return None, src, "data.case_dir"
    value = _str(src, "data.case_dir", value)
    p = user_path(value)
    return (p if p.is_absolute() else base / p).resolve(), src, "data.case_dir"


def _misfit(src: str, m: Misfit | None, overrides: Mapping[str, Any]) -> None:
    """A family's misfit as an InputError: a hardware key is reported on its override if
    the scenario overrides it, else on `hardware`."""
    if m is None:
        return
    key = m.key
    if key.startswith("hardware."):
        hw_key = key[len("hardware."):]
        key = f"hardware_overrides.{hw_key}" if hw_key in overrides else "hardware"
    raise InputError(src, key, m.message)


def _check_cores(src: str, fam: Any, op: str, hw: HardwareConfig) -> None:
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


def _check_topology(src: str, w: Workload, hw: HardwareConfig) -> None:
    """Every rank must sit in the topology: W at most the outermost level's dies."""
    if not hw.fabric.levels:
        return
    outer = hw.fabric.levels[-1]
    if w.ep_world_size > outer.dies:
        raise InputError(
            src, "workload.ep_world_size",
            f"{w.ep_world_size} ranks do not fit {hw.name}'s topology: its outermost level, "
            f"{outer.name}, holds {outer.dies} dies; allowed: 2..{outer.dies}")


# ----------------------------------------------------------------------------- entry point


def load_scenario(path: str | Path, case_dir_override: str | Path | None = None,
                  import_kernels: bool = True) -> Scenario:
    """Read and validate a scenario file; raises InputError naming file and dotted key.
    import_kernels=False (`npusim lint`) does not import a user's kernel file or module:
    its options and fit are then not checked."""
    return scenario_from_doc(*read_scenario_file(path), case_dir_override, import_kernels)


def read_scenario_file(path: str | Path) -> tuple[dict[str, Any], str, Path]:
    """A scenario file's document, its name for errors and its folder (for relative paths)."""
    src = str(path)
    if not src or "\x00" in src:
        raise InputError(src or "<empty path>", None, "not a valid file path")
    p = user_path(src)
    return _read_yaml(p, src), src, p.resolve().parent


def scenario_from_doc(doc: dict[str, Any], src: str, base: Path,
                      case_dir_override: str | Path | None = None,
                      import_kernels: bool = True) -> Scenario:
    """Validate a scenario given as a mapping (from a file, a CSV row or a sweep point);
    `src` names it in errors and relative paths resolve against `base`."""
    _section(src, "", doc, TOP_KEYS, ("name", "workload"))

    name = _str(src, "name", doc["name"])
    if not _NAME_RE.match(name) or len(name) > 128:
        raise InputError(
            src,
            "name",
            f"{_show(name)} is not usable as a folder name; allowed: letters, digits, "
            "'_', '-', '.' (not starting with '.' or '-'), at most 128 characters",
        )
    description = doc.get("description")
    description = (
        "" if description is None else _str(src, "description", description, empty_ok=True)
    )

    workload = _workload(src, doc["workload"], base, import_kernels)
    fam = workload.family
    workload = _routing_file(src, workload, base)
    run = _run(src, doc.get("run"))
    case_dir, case_src, case_key = _case_dir(src, doc.get("data"), base, case_dir_override)
    if case_dir is not None and workload.routing.kind == "file":
        raise InputError(case_src, case_key, "the case directory's expert_ids and "
                         "workload.routing.path would both give the routing; allowed "
                         "only without routing.kind: file")
    if case_dir is not None and fam is not None:
        problem = fam.case_misfit(case_dir, workload.shape, workload.options, workload.op,
                                  workload.timing_only)
        if problem:
            raise InputError(case_src, case_key, problem)

    ref = doc.get("hardware", DEFAULT_HARDWARE)
    ref = _str(src, "hardware", ref)
    overrides = _flatten_overrides(src, doc.get("hardware_overrides"))
    hardware = _hardware(src, ref, overrides, base)
    if fam is not None:
        _check_cores(src, fam, workload.op, hardware)
        _misfit(src, fam.misfit(workload.shape, workload.options, hardware, workload.op),
                overrides)
    _check_topology(src, workload, hardware)

    return Scenario(
        name=name,
        description=description,
        source=src,
        hardware_ref=ref,
        hardware_overrides=overrides,
        hardware=hardware,
        workload=workload,
        data=DataSource(case_dir=case_dir),
        run=run,
    )
