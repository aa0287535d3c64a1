"""Measured latencies in, simulated latencies out: the tables behind `npusim validate` and
`npusim calibrate`.

A table is a CSV with one row per measured kernel call: the workload fields of a
scenario (op runs one kernel of its family: dispatch or combine for cann_sample),
`measured_us`, and optional `source` / `label` / `kernel` (the family, default
cann_sample) / `tolerance_pct` (the row's own target, e.g. 10 for the nine 950 vector
rows; `npusim validate --tolerance` for the others) and the family's options. A kernel's
`variant` option (cann_sample: its quantisation) pairs rows into speed-ups: a row
against its twin at the option's default. Rows are simulated in timing-only mode (no
payload numerics; the timing is identical, see tests/sim/test_timing_only.py) in parallel
processes.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from npusim.errors import InputError
from npusim.kernels import registry
from npusim.kernels.family import Family, Option
from npusim.shipped import targets_dir

WORKLOAD_FIELDS = ("op", "bs", "h", "k", "ep_world_size", "experts_per_rank", "dtype")
INT_FIELDS = ("bs", "h", "k", "ep_world_size", "experts_per_rank")
OPTIONAL = ("source", "label", "routing", "kernel", "tolerance_pct")


def _family(w: dict[str, Any]) -> Family:
    return registry.get(w.get("kernel", registry.DEFAULT))


def option_columns() -> dict[str, Option]:
    """Every built-in family's options, allowed as columns."""
    return {o.name: o for n in registry.names() for o in registry.get(n).options}


def variant_option(w: dict[str, Any]) -> Option | None:
    """The option the row's kernel declares as its variant (None: it declares none)."""
    fam = _family(w)
    run, i = timed_ops(fam, w)[w["op"]]
    name = fam.kernel(fam.runs_of(w)[run][i]).variant
    return next((o for o in fam.options if o.name == name), None)


TARGETS_DIR = targets_dir()  # package data (npusim._data.configs/targets)


@dataclass(frozen=True)
class Measurement:
    """One measured kernel call."""

    workload: dict[str, Any]
    measured_us: float
    source: str = ""
    label: str = ""
    tolerance: float | None = None  # the row's allowed error (a fraction), None: the default

    @property
    def op(self) -> str:
        return self.workload["op"]

    @property
    def quant(self) -> str:
        """The row's variant (cann_sample: the op's quantisation), "-" if none."""
        o = variant_option(self.workload)
        return "-" if o is None else str(self.workload.get(o.name, o.default))

    @property
    def base_quant(self) -> str:
        """The variant of the row's twin in a speed-up: the option's default."""
        o = variant_option(self.workload)
        return "-" if o is None else str(o.default)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        w = self.workload
        if "bs" not in w:
            return f"{w['op']}_{self.quant}"
        return f"{w['op']}_bs{w['bs']}_{self.quant}"


def default_table(hardware: str) -> Path:
    return TARGETS_DIR / f"{hardware}.csv"


def read_table(path: str | Path) -> list[Measurement]:
    """Parse a measurement CSV; errors name the file, the row and the column."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(str(p), None, f"cannot read: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    missing = [c for c in (*WORKLOAD_FIELDS, "measured_us") if c not in cols]
    if missing:
        raise InputError(str(p), None, f"missing column(s) {', '.join(missing)}; needed: "
                         f"{', '.join((*WORKLOAD_FIELDS, 'measured_us'))}")
    options = option_columns()
    known = (*WORKLOAD_FIELDS, "measured_us", *OPTIONAL, *options)
    extra = [c for c in cols if c not in known]
    if extra:
        raise InputError(str(p), extra[0], f"unknown column; allowed: {', '.join(known)}")
    rows = []
    for i, rec in enumerate(reader, start=2):
        where = f"row {i}"
        w: dict[str, Any] = {}
        for c in WORKLOAD_FIELDS:
            v = (rec.get(c) or "").strip()
            if c in INT_FIELDS and not v:  # left to the family (checked below)
                continue
            if c in INT_FIELDS:
                try:
                    w[c] = int(v)
                except ValueError:
                    raise InputError(str(p), f"{where}.{c}", f"must be an integer, got {v!r}"
                                     ) from None
            else:
                w[c] = v
        for c in (c for c in cols if c in options or c == "kernel"):
            v = (rec.get(c) or "").strip()
            if v:
                w[c] = _option_value(v, options.get(c), str(p), f"{where}.{c}")
        try:
            fam = _family(w)
        except registry.FamilyError as exc:
            raise InputError(str(p), f"{where}.kernel", str(exc)) from None
        blank = [c for c in INT_FIELDS if c not in w]
        if blank and fam.uses_moe_shape:
            raise InputError(str(p), f"{where}.{blank[0]}", "must be an integer, got ''")
        timed = timed_ops(fam, w)
        if w["op"] not in timed:
            raise InputError(str(p), f"{where}.op", f"{w['op']!r}; allowed: {', '.join(timed)}")
        if rec.get("routing"):
            w["routing"] = {"kind": rec["routing"].strip(), "seed": 0}
        try:
            measured = float(rec["measured_us"])
        except (TypeError, ValueError):
            raise InputError(str(p), f"{where}.measured_us",
                             f"must be a number, got {rec['measured_us']!r}") from None
        if not measured > 0:
            raise InputError(str(p), f"{where}.measured_us", "must be > 0")
        rows.append(Measurement(w, measured, (rec.get("source") or "").strip(),
                                (rec.get("label") or "").strip(),
                                _row_tolerance(rec.get("tolerance_pct"), str(p), where)))
    if not rows:
        raise InputError(str(p), None, "no measurement rows")
    return rows


def _row_tolerance(cell: str | None, src: str, where: str) -> float | None:
    """A `tolerance_pct` cell: a percentage in (0, 100], blank for the default."""
    v = (cell or "").strip()
    if not v:
        return None
    try:
        pct = float(v)
    except ValueError:
        pct = math.nan
    if not 0 < pct <= 100:
        raise InputError(src, f"{where}.tolerance_pct", f"{v!r}; allowed: a percentage in "
                         "(0, 100], or blank for validate's --tolerance")
    return pct / 100


def _option_value(v: str, o: Option | None, src: str, key: str) -> Any:
    """A CSV cell as the option's type (the scenario loader checks its range)."""
    if o is None or o.kind == "choice":
        return v
    if o.kind == "bool":
        return {"true": True, "false": False}.get(v, v)
    try:
        return int(v) if o.kind == "int" else float(v)
    except ValueError:
        raise InputError(src, key, f"must be {'an integer' if o.kind == 'int' else 'a number'}"
                         f", got {v!r}") from None


def timed_ops(fam: Family, workload: Mapping[str, Any] | None = None
              ) -> dict[str, tuple[str, int]]:
    """What a row's `op` may name, and how it is timed: (the `workload.op` run, the op's
    place in it). An op the family runs alone is its own run; an op it runs only inside
    a fused one (mc2's combine, after dispatch, which leaves it its inputs and window
    state) is timed inside the shortest such run. The runs are those of the row's options
    (a mode that launches kernels of its own, such as deepep's low latency)."""
    runs = fam.runs_of(workload)
    out = {op: (op, 0) for op, kernels in runs.items() if len(kernels) == 1}
    for run, kernels in sorted(runs.items(), key=lambda kv: len(kv[1])):
        for i, k in enumerate(kernels):
            out.setdefault(k, (run, i))
    return out


def row_doc(m: Measurement, hardware: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The scenario that times the row: its run (see timed_ops), timing only."""
    workload = dict(m.workload)
    workload["op"] = timed_ops(_family(workload), workload)[m.op][0]
    workload["timing_only"] = True
    return {"name": m.name, "hardware": hardware, "hardware_overrides": dict(overrides),
            "workload": workload}


def simulate_row(args: tuple[dict[str, Any], str]) -> list[float]:
    """Latency (us) of each op of the row's run; runs in a worker process."""
    from npusim.scenario import scenario_from_doc
    from npusim.sim import simulate

    doc, src = args
    sc = scenario_from_doc(doc, src, Path.cwd())
    result = simulate(sc)
    return [(op.end_ns - op.start_ns) / 1000.0 for op in result.ops]


def _job_key(doc: dict[str, Any]) -> str:
    """Rows whose scenarios differ only in name share one simulation (two combine rows of
    one mc2 shape both read the fused run's result)."""
    return repr(sorted((k, repr(v)) for k, v in doc.items() if k != "name"))


def simulate_table(rows: list[Measurement], hardware: str, overrides: dict[str, Any],
                   source: str, workers: int | None = None) -> list[float]:
    """Simulated latency of every row (validates every row's scenario first, here)."""
    from npusim.scenario import scenario_from_doc

    jobs: list[tuple[dict[str, Any], str]] = []
    cost: list[float] = []
    where: list[tuple[int, int]] = []  # per row: its job, its op's place in the run
    keys: dict[str, int] = {}
    for i, m in enumerate(rows):
        doc = row_doc(m, hardware, overrides)
        key = _job_key(doc)
        if key not in keys:
            src = f"{source} (row {i + 2})"
            scenario_from_doc(doc, src, Path.cwd())  # bad rows fail here, in the parent
            keys[key] = len(jobs)
            jobs.append((doc, src))
            cost.append(_cost(m))
        where.append((keys[key], timed_ops(_family(m.workload), m.workload)[m.op][1]))
    n = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    if n <= 1:
        results = [simulate_row(j) for j in jobs]
    else:
        # the longest runs first keeps both workers busy to the end
        order = sorted(range(len(jobs)), key=lambda i: -cost[i])
        with ProcessPoolExecutor(max_workers=n) as pool:
            done = dict(zip(order, pool.map(simulate_row, [jobs[i] for i in order]),
                            strict=True))
        results = [done[i] for i in range(len(jobs))]
    return [results[j][k] for j, k in where]


def _cost(m: Measurement) -> float:
    w = m.workload
    return w.get("bs", 1) * w.get("k", 1) * w.get("ep_world_size", 1) * w.get("h", 1)


@dataclass
class Comparison:
    rows: list[Measurement]
    simulated: list[float]
    speedups: list[dict[str, Any]] = field(default_factory=list)

    def errors(self) -> list[float]:
        return [(s - m.measured_us) / m.measured_us for s, m in
                zip(self.simulated, self.rows, strict=True)]

    def mape(self) -> float:
        errs = self.errors()
        return sum(abs(e) for e in errs) / len(errs)


def compare(rows: list[Measurement], simulated: list[float]) -> Comparison:
    """Rows side by side, plus the quantisation speed-ups: every quantised row whose
    unquantised twin (same fields, quant none) is in the table."""
    cmp = Comparison(rows, simulated)
    index = {_key(m, m.base_quant): i for i, m in enumerate(rows) if m.quant == m.base_quant}
    for i, m in enumerate(rows):
        if m.quant == m.base_quant:
            continue
        j = index.get(_key(m, m.base_quant))
        if j is None:
            continue
        cmp.speedups.append({
            "op": m.op, "bs": m.workload.get("bs"), "quant": m.quant,
            "label": _speedup_label(m, rows[j]),
            "measured": rows[j].measured_us / m.measured_us,
            "simulated": simulated[j] / simulated[i],
        })
    return cmp


def _speedup_label(m: Measurement, base: Measurement) -> str:
    """How a speed-up is named: "dispatch BS 8 mxfp8" for a MoE row against its
    unquantised twin; the two rows' names for a family without the MoE shape."""
    if _family(m.workload).uses_moe_shape:
        return f"{m.op} BS {m.workload['bs']} {m.quant}"
    return f"{m.name} vs {base.name}"


def _key(m: Measurement, quant: str) -> tuple:
    """The row's fields with its variant set to `quant` and every other kernel's variant
    blanked (a combine row's dispatch quantisation does not matter to it)."""
    w = dict(m.workload)
    fam = _family(w)
    own = variant_option(w)
    for k in fam.ops:
        if k.variant is not None:
            w[k.variant] = quant if own is not None and k.variant == own.name else "-"
    return tuple(sorted((k, str(v)) for k, v in w.items()))


def log_residuals(rows: list[Measurement], simulated: list[float]) -> list[float]:
    return [math.log(s / m.measured_us) for s, m in zip(simulated, rows, strict=True)]


# ----------------------------------------------------------------------------- fitting
@dataclass(frozen=True)
class FreeParameter:
    """One fitted value, applied to one or more dotted preset keys (tied), within bounds."""

    keys: tuple[str, ...]
    low: float
    high: float

    @property
    def name(self) -> str:
        return ",".join(self.keys)


def parse_param(spec: str) -> FreeParameter:
    """'mte.put_gbps=4:64' or 'fabric.egress_gbps,fabric.ingress_gbps=100:1000'."""
    try:
        keys, rng = spec.split("=")
        lo, hi = (float(v) for v in rng.split(":"))
    except ValueError:
        raise InputError("command line", "--param", f"{spec!r}: expected KEY[,KEY...]=LOW:HIGH"
                         ) from None
    if not 0 < lo < hi:
        raise InputError("command line", "--param", f"{spec!r}: need 0 < LOW < HIGH")
    return FreeParameter(tuple(k.strip() for k in keys.split(",")), lo, hi)


@dataclass
class FitResult:
    params: list[FreeParameter]
    values: dict[str, float]  # fitted value per parameter name
    start: dict[str, float]
    simulated: list[float]
    evaluations: int
    loo: list[dict[str, Any]] = field(default_factory=list)
    # per parameter: how much each row (and speed-up) moves with it at the solution
    pinned_by: list[dict[str, Any]] = field(default_factory=list)
    # the fit's simulations of the whole table, by point (log values rounded), and the
    # solution's log values: a linear leave-one-out reuses the Jacobian's points
    sims: dict[tuple, list[float]] = field(default_factory=dict, repr=False)
    x: tuple[float, ...] = ()

    def overrides(self) -> dict[str, float]:
        return expand(self.params, [self.values[p.name] for p in self.params])


def expand(params: list[FreeParameter], values: list[float]) -> dict[str, float]:
    return {k: float(v) for p, v in zip(params, values, strict=True) for k in p.keys}


FD_STEP = 0.02  # finite-difference step of the fit, in log space (2% of each value)


def _point(x: Any) -> tuple:
    """The key of a parameter point (log values) in a fit's table of simulations."""
    import numpy as np
    return tuple(np.round(x, 12))


def _fd_points(x: Any, hi: Any) -> list[tuple[Any, float]]:
    """The Jacobian's points: each parameter moved by FD_STEP in log space, downwards
    where that would cross its upper bound; with the step taken."""
    out = []
    for j in range(len(x)):
        h = FD_STEP if x[j] + FD_STEP <= hi[j] else -FD_STEP
        xj = x.copy()
        xj[j] += h
        out.append((xj, h))
    return out


def fit(rows: list[Measurement], hardware: str, params: list[FreeParameter],
        start: dict[str, float], source: str, *, prior_weight: float = 0.02,
        speedup_weight: float = 1.0,
        max_evals: int = 200, workers: int | None = None,
        progress: Any = None) -> FitResult:
    """Least squares on log(simulated / measured) of every row and of every quantisation
    speed-up the table implies, with a weak prior pulling each value towards its
    starting point (keeps under-determined parameters where they were),
    parameters searched in log space within their bounds (scipy's trust-region
    reflective method, finite differences)."""
    try:
        import numpy as np
        from scipy.optimize import least_squares
    except ModuleNotFoundError:
        raise InputError("npusim calibrate", None, "needs scipy: pip install 'npusim[calibrate]'"
                         ) from None
    lo = np.log([p.low for p in params])
    hi = np.log([p.high for p in params])
    x0 = np.log([min(max(start[p.name], p.low), p.high) for p in params])
    count = [0]
    cache: dict[tuple, list[float]] = {}

    best = [math.inf]

    def sim_at(x: np.ndarray) -> list[float]:
        key = _point(x)
        if key not in cache:
            count[0] += 1
            values = expand(params, list(np.exp(x)))
            cache[key] = simulate_table(rows, hardware, values, source, workers)
            cost = float(np.sum(np.square(log_residuals(rows, cache[key]))))
            improved = cost < best[0]
            best[0] = min(best[0], cost)
            if progress:
                progress(count[0], cache[key], values if improved else None)
        return cache[key]

    def residuals(x: np.ndarray) -> np.ndarray:
        sim = sim_at(x)
        data = np.array(log_residuals(rows, sim))
        ratios = np.array([math.log(sp["simulated"] / sp["measured"])
                           for sp in compare(rows, sim).speedups])
        prior = prior_weight * (x - x0)
        return np.concatenate([data, speedup_weight * ratios, prior])

    def jacobian(x: np.ndarray) -> np.ndarray:
        """Forward differences moving each parameter by 2% (a fixed step in log space),
        away from a bound. Not scipy's diff_step: that step is relative to x itself, so
        a value near 1 (log 0, e.g. cycles_per_repeat at its floor) got a step of ~1e-12,
        which only flips event ties, and a large value (the launch) one of ~20%."""
        r0 = residuals(x)
        jac = np.empty((r0.size, x.size))
        for j, (xj, h) in enumerate(_fd_points(x, hi)):
            jac[:, j] = (residuals(xj) - r0) / h
        return jac

    res = least_squares(residuals, x0, jac=jacobian, bounds=(lo, hi), x_scale=1.0,
                        max_nfev=max_evals, method="trf")
    values = {p.name: float(np.exp(v)) for p, v in zip(params, res.x, strict=True)}
    sim = sim_at(res.x)
    # measured rows only: a speed-up is two of them again, not more evidence
    pinned = pinned_by(params, [m.name for m in rows], np.abs(np.asarray(res.jac))[:len(rows)])
    return FitResult(params, values, {p.name: start[p.name] for p in params}, sim, count[0],
                     pinned_by=pinned, sims=cache, x=tuple(float(v) for v in res.x))


def pinned_by(params: list[FreeParameter], names: list[str], elasticity: Any
              ) -> list[dict[str, Any]]:
    """Which rows pin each parameter: the share of |d log(sim/measured) / d log(value)|
    (at the solution) that each measured row contributes. A parameter that one row
    pins alone is predicted by nothing else (leave that row out and it drifts); one with
    a small total is held by the prior, not the data."""
    out = []
    for j, p in enumerate(params):
        col = [float(v) for v in elasticity[:, j]]
        total = sum(col)
        shares = {n: v / total for n, v in zip(names, col, strict=True)} if total > 0 else {}
        top = max(shares, key=shares.__getitem__) if shares else None
        out.append({"parameter": p.name, "total_elasticity": total,
                    "shares": shares, "top_row": top,
                    "top_share": shares[top] if top else 0.0})
    return out


def leave_one_out(rows: list[Measurement], hardware: str, params: list[FreeParameter],
                  result: FitResult, source: str, *, max_evals: int = 60,
                  workers: int | None = None, progress: Any = None) -> list[dict[str, Any]]:
    """Refit without each row (from the full fit) and predict it: the held-out error.
    `progress(entry)` is told each row as it is done (a refit takes minutes)."""
    out = []
    for i, m in enumerate(rows):
        rest = rows[:i] + rows[i + 1:]
        sub = fit(rest, hardware, params, result.values, source, max_evals=max_evals,
                  workers=workers)
        pred = simulate_table([m], hardware, sub.overrides(), source, workers=1)[0]
        out.append({"row": m.name, "measured_us": m.measured_us, "predicted_us": pred,
                    "error": (pred - m.measured_us) / m.measured_us,
                    "evaluations": sub.evaluations, "fitted": sub.values})
        if progress:
            progress(out[-1])
    return out


def leave_one_out_linear(rows: list[Measurement], hardware: str, params: list[FreeParameter],
                         result: FitResult, source: str, *, prior_weight: float = 0.02,
                         speedup_weight: float = 1.0, workers: int | None = None,
                         progress: Any = None) -> list[dict[str, Any]]:
    """Leave-one-out by the first step of each refit: for each row, the bounded
    Gauss-Newton step from the full fit on the residuals of the other rows (their
    speed-ups and the prior towards the full fit included), with the Jacobian of the full
    fit's own finite-difference points; then the held-out row is simulated at the stepped
    values. That is the step a trust-region refit from the full fit takes first (its
    first trust region spans the bounds), so it is exact to first order; its cost is one
    simulation of one row per row, where a refit is dozens of the whole table."""
    import numpy as np
    from scipy.optimize import lsq_linear

    lo = np.log([p.low for p in params])
    hi = np.log([p.high for p in params])
    x = np.array(result.x)
    points = _fd_points(x, hi)
    missing = [xj for xj, _ in [(x, 0.0), *points] if _point(xj) not in result.sims]
    for xj in missing:  # a fit that stopped before its last Jacobian
        result.sims[_point(xj)] = simulate_table(rows, hardware, expand(params, list(np.exp(xj))),
                                                 source, workers)
    base = result.sims[_point(x)]

    def residuals(keep: list[int], sim: list[float]) -> np.ndarray:
        sub = [rows[i] for i in keep]
        part = [sim[i] for i in keep]
        ratios = [math.log(sp["simulated"] / sp["measured"])
                  for sp in compare(sub, part).speedups]
        return np.concatenate([np.array(log_residuals(sub, part)),
                               speedup_weight * np.array(ratios, dtype=float)])

    out = []
    for i, m in enumerate(rows):
        keep = [j for j in range(len(rows)) if j != i]
        r0 = residuals(keep, base)
        jac = np.column_stack([(residuals(keep, result.sims[_point(xj)]) - r0) / h
                               for xj, h in points])
        # the prior pulls towards the full fit (as a refit started there does): zero at x
        a = np.vstack([jac, prior_weight * np.eye(len(params))])
        b = -np.concatenate([r0, np.zeros(len(params))])
        step = lsq_linear(a, b, bounds=(lo - x, hi - x)).x
        values = expand(params, list(np.exp(x + step)))
        pred = simulate_table([m], hardware, values, source, workers=1)[0]
        out.append({"row": m.name, "measured_us": m.measured_us, "predicted_us": pred,
                    "error": (pred - m.measured_us) / m.measured_us, "evaluations": 1,
                    "method": "linear",
                    "fitted": {p.name: float(math.exp(x[j] + step[j]))
                               for j, p in enumerate(params)}})
        if progress:
            progress(out[-1])
    return out


def current_values(hw_doc: dict[str, Any], params: list[FreeParameter]) -> dict[str, float]:
    """The preset's value of each parameter (the first key of a tied group)."""
    from npusim.hw.provenance import is_entry

    out = {}
    for p in params:
        node: Any = hw_doc
        for part in p.keys[0].split("."):
            if not isinstance(node, dict) or is_entry(node) or part not in node:
                raise InputError("command line", "--param", f"unknown preset key {p.keys[0]!r}")
            node = node[part]
        out[p.name] = float(node["value"] if is_entry(node) else node)
    return out


def fit_provenance(params: list[FreeParameter], table: str, report: str, day: str
                   ) -> dict[str, dict[str, str]]:
    """The `calibrated` provenance of every fitted key: its fit report, date and method."""
    out = {}
    for p in params:
        for k in p.keys:
            tied = [t.split(".")[-1] for t in p.keys if t != k]
            method = f"npusim calibrate to {table}" + (
                f", tied with {', '.join(tied)}" if tied else "") + f", bounds {p.low:g}-{p.high:g}"
            out[k] = {"fit": report, "date": day, "method": method}
    return out


def rewrite_preset(text: str, values: dict[str, float],
                   provenance: dict[str, dict[str, str]]) -> str:
    """The preset's YAML with each fitted value put in place as
    `{value: V, calibrated: provenance[key]}` (a plain value becomes such an entry too;
    the note of a value calibrated before is kept); every other line, value, provenance
    and comment is kept as it was."""
    lines = text.splitlines()
    out: list[str] = []
    section = ""
    done = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if not stripped or stripped.startswith("#"):
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        dotted = key if indent == 0 else f"{section}.{key}"
        if indent == 0:
            section = key
        if indent == 0 or dotted not in values:
            out.append(line)
            continue
        first = i - 1
        while i < len(lines) and (not lines[i].strip() or
                                  len(lines[i]) - len(lines[i].lstrip()) > indent):
            if not lines[i].strip():  # a blank line ends the entry unless it continues
                j = i
                while j < len(lines) and not lines[j].strip():
                    j += 1
                if j == len(lines) or len(lines[j]) - len(lines[j].lstrip()) <= indent:
                    break
            i += 1
        calibrated = dict(provenance[dotted])
        note = _calibrated_note(lines[first:i], indent)
        if note:
            calibrated["note"] = note
        entry = {key: {"value": float(_fmt(values[dotted])), "calibrated": calibrated}}
        block = yaml.safe_dump(entry, sort_keys=False, default_flow_style=False, width=4096)
        out += [" " * indent + b for b in block.splitlines()]
        done.add(dotted)
    missing = set(values) - done
    if missing:
        raise InputError("preset", sorted(missing)[0], "key not found in the preset text")
    return "\n".join(out) + "\n"


def _calibrated_note(block: list[str], indent: int) -> str | None:
    """The note of a value that was calibrated before (what it means is kept; where it
    came from is replaced); a sourced or assumed value's note is about its old source."""
    doc = yaml.safe_load("\n".join(line[indent:] for line in block))
    entry = next(iter(doc.values())) if isinstance(doc, dict) and doc else None
    old = entry.get("calibrated") if isinstance(entry, dict) else None
    return old.get("note") if isinstance(old, dict) else None


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.1f}"
