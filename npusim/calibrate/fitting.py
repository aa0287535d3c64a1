"""The fit: bounded least squares, in log space, of the free preset parameters to a
table's rows and speed-ups, with a weak prior towards the starting values."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from npusim.calibrate.comparison import compare, log_residuals
from npusim.calibrate.simulate import simulate_tables
from npusim.calibrate.table import Measurement
from npusim.errors import InputError


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
        raise InputError(
            "command line", "--param", f"{spec!r}: expected KEY[,KEY...]=LOW:HIGH"
        ) from None
    if not (math.isfinite(hi) and 0 < lo < hi):  # nan fails every comparison
        raise InputError("command line", "--param", f"{spec!r}: allowed: finite bounds "
                         "0 < LOW < HIGH")
    return FreeParameter(tuple(k.strip() for k in keys.split(",")), lo, hi)


ALLOWED_KEY = "allowed: a preset key holding a real number, in one --param, LOW:HIGH in its range"


def check_params(params: list[FreeParameter], hardware: str) -> None:
    """Before the fit: every key once, and the preset loads with it at both bounds and
    between them (a whole-number key such as a core count cannot move continuously), so
    that no bad key surfaces mid-fit as an error of the table's rows."""
    from npusim.hw.config import load_hardware

    seen: set[str] = set()
    for p in params:
        for key in p.keys:
            if key in seen:
                raise InputError("command line", f"--param {key}", f"given twice; {ALLOWED_KEY}")
            seen.add(key)
            for value in (p.low, p.high, math.nextafter(p.high, p.low)):
                try:
                    load_hardware(hardware, {key: value}, override_source="--param")
                except InputError as exc:
                    why = ("holds a whole number, which a fit cannot move continuously"
                           if value not in (p.low, p.high) else exc.message)
                    raise InputError("command line", f"--param {key}",
                                     f"{why}; {ALLOWED_KEY}") from None


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


def point_key(x: Any) -> tuple:
    """The key of a parameter point (log values) in a fit's table of simulations."""
    import numpy as np

    return tuple(np.round(x, 12))


def fd_points(x: Any, hi: Any) -> list[tuple[Any, float]]:
    """The Jacobian's points: each parameter moved by FD_STEP in log space, downwards
    where that would cross its upper bound; with the step taken."""
    out = []
    for j in range(len(x)):
        h = FD_STEP if x[j] + FD_STEP <= hi[j] else -FD_STEP
        xj = x.copy()
        xj[j] += h
        out.append((xj, h))
    return out


class _Objective:
    """The fit's residuals and Jacobian at a point (log values), each point's table
    simulated once (cached by point) and every new point told to `progress`."""

    def __init__(
        self,
        rows: list[Measurement],
        hardware: str,
        params: list[FreeParameter],
        source: str,
        x0: Any,
        hi: Any,
        prior_weight: float,
        speedup_weight: float,
        workers: int | None,
        progress: Any,
    ) -> None:
        self.rows, self.hardware, self.params, self.source = rows, hardware, params, source
        self.x0, self.hi, self.workers, self.progress = x0, hi, workers, progress
        self.prior_weight, self.speedup_weight = prior_weight, speedup_weight
        self.count = 0
        self.cache: dict[tuple, list[float]] = {}
        self.best = math.inf

    def sim_at(self, x: Any) -> list[float]:
        return self.sim_many([x])[0]

    def sim_many(self, xs: list[Any]) -> list[list[float]]:
        """The table at each point: the points not simulated yet, all in one pool; each
        new point counted and told to `progress` in the order given."""
        import numpy as np

        keys = [point_key(x) for x in xs]
        first: dict[tuple, Any] = {}
        for k, x in zip(keys, xs, strict=True):
            first.setdefault(k, x)
        new = [k for k in first if k not in self.cache]
        if new:
            points = [expand(self.params, list(np.exp(first[k]))) for k in new]
            tables = simulate_tables(self.rows, self.hardware, points, self.source, self.workers)
            for key, values, table in zip(new, points, tables, strict=True):
                self.cache[key] = table
                self.count += 1
                cost = float(np.sum(np.square(log_residuals(self.rows, table))))
                improved = cost < self.best
                self.best = min(self.best, cost)
                if self.progress:
                    self.progress(self.count, table, values if improved else None)
        return [self.cache[k] for k in keys]

    def residuals(self, x: Any) -> Any:
        import numpy as np

        sim = self.sim_at(x)
        data = np.array(log_residuals(self.rows, sim))
        ratios = np.array(
            [math.log(sp["simulated"] / sp["measured"]) for sp in compare(self.rows, sim).speedups]
        )
        prior = self.prior_weight * (x - self.x0)
        return np.concatenate([data, self.speedup_weight * ratios, prior])

    def jacobian(self, x: Any) -> Any:
        """Forward differences moving each parameter by 2% (a fixed step in log space),
        away from a bound. Not scipy's diff_step: that step is relative to x itself, so
        a value near 1 (log 0, e.g. cycles_per_repeat at its floor) got a step of ~1e-12,
        which only flips event ties, and a large value (the launch) one of ~20%."""
        import numpy as np

        points = fd_points(x, self.hi)
        self.sim_many([x, *(xj for xj, _ in points)])  # the columns' tables in one pool
        r0 = self.residuals(x)
        jac = np.empty((r0.size, x.size))
        for j, (xj, h) in enumerate(points):
            jac[:, j] = (self.residuals(xj) - r0) / h
        return jac


def fit(
    rows: list[Measurement],
    hardware: str,
    params: list[FreeParameter],
    start: dict[str, float],
    source: str,
    *,
    prior_weight: float = 0.02,
    speedup_weight: float = 1.0,
    max_evals: int = 200,
    workers: int | None = None,
    progress: Any = None,
) -> FitResult:
    """Least squares on log(simulated / measured) of every row and of every quantisation
    speed-up the table implies, with a weak prior pulling each value towards its
    starting point (keeps under-determined parameters where they were),
    parameters searched in log space within their bounds (scipy's trust-region
    reflective method, finite differences)."""
    try:
        import numpy as np
        from scipy.optimize import least_squares
    except ModuleNotFoundError:
        raise InputError(
            "npusim calibrate", None, "needs scipy: pip install 'npusim[calibrate]'"
        ) from None
    lo = np.log([p.low for p in params])
    hi = np.log([p.high for p in params])
    x0 = np.log([min(max(start[p.name], p.low), p.high) for p in params])
    obj = _Objective(
        rows, hardware, params, source, x0, hi, prior_weight, speedup_weight, workers, progress
    )
    res = least_squares(
        obj.residuals,
        x0,
        jac=obj.jacobian,
        bounds=(lo, hi),
        x_scale=1.0,
        max_nfev=max_evals,
        method="trf",
    )
    values = {p.name: float(np.exp(v)) for p, v in zip(params, res.x, strict=True)}
    sim = obj.sim_at(res.x)
    # measured rows only: a speed-up is two of them again, not more evidence
    pinned = pinned_by(params, [m.name for m in rows], np.abs(np.asarray(res.jac))[: len(rows)])
    return FitResult(
        params,
        values,
        {p.name: start[p.name] for p in params},
        sim,
        obj.count,
        pinned_by=pinned,
        sims=obj.cache,
        x=tuple(float(v) for v in res.x),
    )


def pinned_by(
    params: list[FreeParameter], names: list[str], elasticity: Any
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
        out.append(
            {
                "parameter": p.name,
                "total_elasticity": total,
                "shares": shares,
                "top_row": top,
                "top_share": shares[top] if top else 0.0,
            }
        )
    return out
