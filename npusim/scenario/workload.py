"""The `workload` section: the generic keys every family reads, declared once as options
(GENERIC: the loader, so `npusim lint`, and docs/scenario.md's table read this one
declaration), then the family `workload.kernel` names with its own declared options and
shape limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npusim.errors import InputError
from npusim.kernels import registry
from npusim.kernels.family import Family, Option
from npusim.paths import user_path
from npusim.scenario.schema import (
    choice,
    integer,
    option_value,
    section,
    show,
    string,
)
from npusim.workload.routing import LOGNORMAL_SIGMA, ZIPF_DEFAULT_S, Routing
from npusim.workload.routing import ROUTING_KINDS as DRAWN_KINDS
from npusim.workload.routing_file import read_routing_file
from npusim.workload.shape import MoeShape, ShapeLimits

DTYPES = ("float16", "bfloat16")
ROUTING_KINDS = DRAWN_KINDS + ("file",)
SIGMA_MAX = 10.0  # the hottest of 1024 experts outweighs the median by e^32: one expert
_LIMITS = "the family's shape limits"

GENERIC: tuple[Option, ...] = (
    Option("kernel", "str", registry.DEFAULT,
           "the kernel family whose kernels run; its own options are further keys of "
           "`workload` (below, \"Kernel families\")",
           allowed=f"a built-in family (`{registry.DEFAULT}`), a path to a `.py` file "
           "(relative to the scenario) or `module:attr`"),
    Option("op", "choice", None, "which kernel call(s); `dispatch_combine` runs dispatch "
           "then combine", required=True,
           allowed="the family's ops; `cann_sample`: `dispatch`, `combine`, `dispatch_combine`"),
    Option("bs", "int", None, "tokens per rank (BS)", required=True,
           allowed=f"{_LIMITS} (below; `cann_sample` and `mc2`: 1..512)"),
    Option("h", "int", None, "hidden size (H)", required=True,
           allowed=f"{_LIMITS} (`cann_sample`: 1024..8192, multiple of 32)"),
    Option("k", "int", None, "top-k experts per token (distinct)", required=True,
           allowed=f"{_LIMITS} (`cann_sample`: 1..16) and k <= E"),
    Option("ep_world_size", "int", None, "ranks W (one rank is one die)", required=True,
           allowed=f"{_LIMITS} (`cann_sample`: 2..768)"),
    Option("experts_per_rank", "int", None, "L, MoE experts on each MoE rank (shared-expert "
           "ranks hold none)", required=True,
           allowed=f"E within {_LIMITS} (`cann_sample`: E <= 1024)"),
    Option("dtype", "choice", "float16", "token dtype", choices=DTYPES),
    Option("shared_experts", "int", 0,
           "S shared experts (ops-transformer V2): every token goes to each of them in "
           "dispatch, and combine adds their results with weight 1 after the K weighted rows "
           "(docs/kernels/cann_sample.md, \"Shared experts\")",
           allowed=f"{_LIMITS} (`cann_sample`: 0..4); nonzero exactly when "
           "`shared_expert_ranks` is"),
    Option("shared_expert_ranks", "int", 0,
           "S_r: ranks 0..S_r-1 hold the shared experts, each replicated on R = S_r / S "
           "ranks; MoE expert e is on rank S_r + e // L. Not allowed with a case directory "
           "(the CANN sample has no shared experts)",
           allowed="0..W-1 (at least one MoE rank), a multiple of S"),
    Option("timing_only", "bool", False, "skip payload bytes (flags and counts still move) "
           "for fast sweeps", allowed="must be `false` with a case directory"),
)
"""The generic workload keys, in docs/scenario.md's order (routing's are ROUTING)."""

ROUTING: tuple[Option, ...] = (
    Option("kind", "choice", "balanced",
           "expert ids: the sample's round robin, uniform random distinct ids, Zipf-skewed "
           "(hot experts), log-normal expert loads, or read from a .npy file (see "
           "\"Routing\" below)", choices=ROUTING_KINDS),
    Option("seed", "int", 0, "seeds routing and generated token data (with `kind: file`, "
           "the token data only)", lo=0, hi=2**32 - 1, allowed="0..2^32-1"),
    Option("s", "float", ZIPF_DEFAULT_S, "Zipf exponent", lo=0.0, hi=100.0, lo_open=True,
           allowed="> 0 (at most 100), only with `kind: zipf`"),
    Option("sigma", "float", LOGNORMAL_SIGMA, "standard deviation of the experts' "
           "log-popularity", lo=0.0, hi=SIGMA_MAX, lo_open=True,
           allowed=f"> 0 (at most {SIGMA_MAX:g}), only with `kind: lognormal`"),
    Option("path", "str", None, "expert ids `[W, BS, K]` int32", required=True,
           allowed="with `kind: file`, and only then: a .npy file; relative paths are "
           "resolved against the scenario file's folder"),
)
"""`workload.routing`'s keys (`path`: required with kind file)."""
ROUTING_PARAMS = {"s": "zipf", "sigma": "lognormal", "path": "file"}  # key: its one kind

WORKLOAD_REQUIRED = tuple(o.name for o in GENERIC if o.required)
MOE_KEYS = ("bs", "h", "k", "ep_world_size", "experts_per_rank", "shared_experts",
            "shared_expert_ranks")
"""The MoE shape's keys: an exchange family's (Family.uses_moe_shape) shape, no other's."""
WORKLOAD_DEFAULTS: dict[str, Any] = {
    **{o.name: o.default for o in GENERIC if not o.required},
    "routing": {o.name: o.default for o in ROUTING if o.name in ("kind", "seed")},
}
_GENERIC = {o.name: o for o in GENERIC}
_ROUTING = {o.name: o for o in ROUTING}
# The shape bounds `npusim lint` holds a user family it does not import to: any shape the
# loader can represent; the family's own shape_limits are checked when it runs.
_ANY = 2**31 - 1
UNIMPORTED_LIMITS = ShapeLimits(bs=(1, _ANY), h=(1, _ANY), h_multiple=1, k=(1, _ANY),
                                ep_world_size=(2, _ANY), experts=_ANY, shared_experts=(0, _ANY),
                                source="the family's own, checked when it runs",
                                why="the loader's bound")
MAX_REF_CHARS = 4096  # PATH_MAX: a longer kernel reference names no file


@dataclass(frozen=True)
class Workload:
    """The kernel family, its op and validated options (readable as attributes too:
    ``w.dispatch_quant``), the generic keys, and the MoE shape of a family that reads one
    (an ExchangeFamily; None for any other, whose own options size what it runs)."""

    op: str
    shape: MoeShape | None = None
    dtype: str = "float16"
    timing_only: bool = False
    routing: Routing = field(default_factory=Routing)
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
    def ops(self) -> tuple[str, ...]:
        """Kernel calls in run order."""
        return (tuple(k.name for k in self.family.kernels_of(self.op, self.options))
                if self.family is not None
                else (self.op,))

    def to_dict(self) -> dict[str, Any]:
        """Generic keys, then the family's options in declaration order; the MoE shape's
        keys and the routing only with a MoE shape (without one they describe nothing
        the family runs)."""
        s = self.shape
        if s is None:
            return {"kernel": self.kernel, "op": self.op, "dtype": self.dtype,
                    **self.options, "timing_only": self.timing_only}
        return {
            "kernel": self.kernel,
            "op": self.op,
            "bs": s.BS,
            "h": s.H,
            "k": s.K,
            "ep_world_size": s.W,
            "experts_per_rank": s.L,
            "num_experts": s.E,
            "dtype": self.dtype,
            **self.options,
            "shared_experts": s.S,
            "shared_expert_ranks": s.S_r,
            "timing_only": self.timing_only,
            "routing": self.routing.to_dict(),
        }


def _routing(src: str, raw: Any) -> Routing:
    key = "workload.routing"
    doc = section(src, key, raw, tuple(_ROUTING))

    def get(name: str) -> Any:
        return option_value(src, _ROUTING[name], doc.get(name, _ROUTING[name].default), key)

    kind, seed = get("kind"), get("seed")
    for param, owner in ROUTING_PARAMS.items():
        if param in doc and kind != owner:
            raise InputError(src, f"{key}.{param}",
                             f"only used with kind: {owner} (kind is {kind!r})")
    s = sigma = path = None
    if kind == "zipf":
        s = get("s")
    elif kind == "lognormal":
        sigma = get("sigma")
    elif kind == "file":
        if "path" not in doc:
            raise InputError(src, f"{key}.path", "missing (required with kind: file); "
                             "allowed: a .npy file of [W, BS, K] int32 expert ids")
        path = get("path")
    return Routing(kind=kind, seed=seed, s=s, sigma=sigma, path=path)


def anchored(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """A workload document with its file references (a kernel .py file, a routing file)
    made absolute against `base`, the folder of the scenario they are relative to, so
    that the workload read elsewhere (a measurement row of `--map`) names the same files
    as `run` of that scenario."""
    w = dict(raw)
    ref = w.get("kernel")
    if isinstance(ref, str) and registry.is_file_ref(ref) and not user_path(ref).is_absolute():
        w["kernel"] = str(base / user_path(ref))
    r = w.get("routing")
    if isinstance(r, dict) and isinstance(r.get("path"), str) and not user_path(
            r["path"]).is_absolute():
        w["routing"] = {**r, "path": str(base / user_path(r["path"]))}
    return w


def routing_file(src: str, w: Workload, base: Path) -> Workload:
    """kind file: read and check the ids now (so lint catches a bad file); the workload
    keeps them and the file's SHA-256, which the resolved scenario reports."""
    r, s = w.routing, w.shape
    if r.kind != "file" or r.path is None:
        return w
    if s is None:
        raise InputError(src, "workload.routing.kind", f"file: expert ids [W, BS, K] of a MoE "
                         f"shape, which {w.kernel} does not read; allowed: the seeded kinds "
                         f"({', '.join(DRAWN_KINDS)})")
    p = user_path(r.path)
    got = read_routing_file(p if p.is_absolute() else base / p, r.path, src,
                            "workload.routing.path", s.W, s.BS, s.K, s.E)
    return replace(w, routing=replace(r, sha256=got.sha256, ids=got.ids))


def _family(src: str, raw: Any, base: Path, import_kernels: bool) -> Family | None:
    """The family workload.kernel names; None for a user's file or module when lint
    checks the scenario without importing it (the file must still exist)."""
    ref = raw.get("kernel", registry.DEFAULT) if isinstance(raw, dict) else registry.DEFAULT
    ref = string(src, "workload.kernel", ref)
    if len(ref) > MAX_REF_CHARS:
        raise InputError(src, "workload.kernel", f"{show(ref)}: longer than {MAX_REF_CHARS} "
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
    return {o.name: option_value(src, o, doc.get(o.name, o.default))
            for o in fam.options}


def workload_of(src: str, raw: Any, base: Path, import_kernels: bool = True) -> Workload:
    key = "workload"
    fam = _family(src, raw, base, import_kernels)
    own = tuple(o.name for o in fam.options) if fam is not None else ()
    allowed = WORKLOAD_REQUIRED + tuple(WORKLOAD_DEFAULTS) + own
    _other_family_option(src, raw, fam, allowed)
    if fam is None and isinstance(raw, dict):  # a user family's options: unknown here
        allowed += tuple(k for k in raw if isinstance(k, str))
    moe = _reads_shape(src, raw, fam)
    doc = section(src, key, raw, allowed, WORKLOAD_REQUIRED if moe else ("op",))

    def get(name: str) -> Any:
        return _given(doc, name)

    op = choice(src, f"{key}.op", doc["op"], tuple(fam.runs) if fam is not None
                else (doc["op"],) if isinstance(doc["op"], str) else ())
    sizes = _moe_sizes(src, doc, fam.shape_limits if fam is not None else UNIMPORTED_LIMITS) \
        if moe else None
    dtype = option_value(src, _GENERIC["dtype"], get("dtype"))
    return Workload(op=op, shape=None if sizes is None else MoeShape(*sizes, dtype=dtype),
                    dtype=dtype,
                    timing_only=option_value(src, _GENERIC["timing_only"], get("timing_only")),
                    routing=_routing(src, doc.get("routing", WORKLOAD_DEFAULTS["routing"])),
                    kernel=get("kernel"), options=(options := _options(src, fam, doc)),
                    family=fam.mode(options) if fam is not None else None)


def _reads_shape(src: str, raw: Any, fam: Family | None) -> bool:
    """Whether the workload has a MoE shape: always for an exchange family, never for any
    other (its keys would size nothing the family runs: refused), and for a user's family
    that lint does not import, when the scenario gives its keys."""
    given = [k for k in MOE_KEYS if k in raw] if isinstance(raw, dict) else []
    if fam is None:
        return bool(given)
    if given and not fam.uses_moe_shape:
        own = ", ".join(o.name for o in fam.options) or "none"
        raise InputError(src, f"workload.{given[0]}", f"{fam.name} reads no MoE shape (it is "
                         f"no MoE dispatch / combine family); allowed: leave it out, "
                         f"{fam.name}'s own options size its run ({own})")
    return fam.uses_moe_shape


def _given(doc: Mapping[str, Any], name: str) -> Any:
    """A generic key as the document gives it, else its declared default."""
    return doc[name] if name in doc else WORKLOAD_DEFAULTS[name]


def _moe_sizes(src: str, doc: Mapping[str, Any], lim: ShapeLimits
               ) -> tuple[int, int, int, int, int, int, int]:
    """(W, BS, H, K, L, S, S_r), MoeShape's order, within the family's shape limits,
    E = (W - S_r) * L at most its experts and K at most E."""
    def k_(name: str) -> str:
        return f"workload.{name}"

    max_e = lim.experts
    bs = integer(src, k_("bs"), doc["bs"], *lim.bs, why=lim.why_for("bs"))
    h = integer(src, k_("h"), doc["h"], *lim.h, why=lim.why_for("h"))
    if h % lim.h_multiple:
        raise InputError(
            src,
            k_("h"),
            f"{h} is not a multiple of {lim.h_multiple}; allowed: multiples of "
            f"{lim.h_multiple} in {lim.h[0]}..{lim.h[1]} ({lim.why_for('h')}: MX blocks, "
            "whole 32 B UB blocks)",
        )
    k = integer(src, k_("k"), doc["k"], *lim.k, why=lim.why_for("k"))
    w = integer(src, k_("ep_world_size"), doc["ep_world_size"], *lim.ep_world_size,
                why=lim.why_for("ep_world_size"))
    shared, shared_ranks = _shared(src, k_, _given(doc, "shared_experts"),
                                   _given(doc, "shared_expert_ranks"), w, lim)
    moe_ranks = w - shared_ranks
    e_why = (f"and ep_world_size * experts_per_rank <= {max_e}" if not shared_ranks
             else f"and (ep_world_size - shared_expert_ranks) * experts_per_rank <= {max_e}")
    l_lo, l_hi = lim.experts_per_rank or (1, max_e // 2)
    l_ = integer(src, k_("experts_per_rank"), doc["experts_per_rank"], l_lo, l_hi,
                 why=lim.why_for("experts_per_rank") if lim.experts_per_rank else e_why)
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
            f"{max_e} ({lim.why_for('experts')}), so experts_per_rank <= {max_e // moe_ranks}",
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
    return w, bs, h, k, l_, shared, shared_ranks


def _shared(src: str, k_: Any, raw_s: Any, raw_sr: Any, w: int, lim: ShapeLimits
            ) -> tuple[int, int]:
    """(S, S_r) under ops-transformer V2's rules: S in the family's range (V2: 0..4), S_r
    in 0..W-1, both zero or both nonzero, S_r a multiple of S (each shared expert on
    R = S_r / S ranks)."""
    shared = integer(src, k_("shared_experts"), raw_s, *lim.shared_experts,
                     why=lim.why_for("shared_experts"))
    ranks = integer(src, k_("shared_expert_ranks"), raw_sr, 0, w - 1,
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


