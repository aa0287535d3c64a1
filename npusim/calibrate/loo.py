"""Leave-one-out: how well the fit predicts a row it did not see, by a refit without the
row or by the first (linear) step of that refit."""

from __future__ import annotations

import math
from typing import Any

from npusim.calibrate.comparison import compare, log_residuals, row_entry
from npusim.calibrate.fitting import FitResult, FreeParameter, expand, fd_points, fit, point_key
from npusim.calibrate.simulate import simulate_table, simulate_tables
from npusim.calibrate.table import Measurement


def leave_one_out(
    rows: list[Measurement],
    hardware: str,
    params: list[FreeParameter],
    result: FitResult,
    source: str,
    *,
    max_evals: int = 60,
    workers: int | None = None,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Refit without each row (from the full fit) and predict it: the held-out error.
    `progress(entry)` is told each row as it is done (a refit takes minutes)."""
    out = []
    for i, m in enumerate(rows):
        rest = rows[:i] + rows[i + 1 :]
        sub = fit(
            rest, hardware, params, result.values, source, max_evals=max_evals, workers=workers
        )
        pred = simulate_table([m], hardware, sub.overrides(), source, workers=1)[0]
        out.append({**row_entry(m, pred, "predicted"), "evaluations": sub.evaluations,
                    "fitted": sub.values})
        if progress:
            progress(out[-1])
    return out


def _jacobian_sims(
    rows: list[Measurement],
    hardware: str,
    params: list[FreeParameter],
    result: FitResult,
    source: str,
    workers: int | None,
) -> list:
    """The full fit's finite-difference points, each with its table simulated (those a
    fit that stopped before its last Jacobian lacks are simulated here)."""
    import numpy as np

    x = np.array(result.x)
    points = fd_points(x, np.log([p.high for p in params]))
    missing = [xj for xj, _ in [(x, 0.0), *points] if point_key(xj) not in result.sims]
    tables = simulate_tables(
        rows, hardware, [expand(params, list(np.exp(xj))) for xj in missing], source, workers
    )
    for xj, table in zip(missing, tables, strict=True):
        result.sims[point_key(xj)] = table
    return points


def _residuals(
    rows: list[Measurement], keep: list[int], sim: list[float], speedup_weight: float
) -> Any:
    """The log residuals of the kept rows and of their speed-ups."""
    import numpy as np

    sub = [rows[i] for i in keep]
    part = [sim[i] for i in keep]
    ratios = [math.log(sp["simulated"] / sp["measured"]) for sp in compare(sub, part).speedups]
    return np.concatenate(
        [np.array(log_residuals(sub, part)), speedup_weight * np.array(ratios, dtype=float)]
    )


def leave_one_out_linear(
    rows: list[Measurement],
    hardware: str,
    params: list[FreeParameter],
    result: FitResult,
    source: str,
    *,
    prior_weight: float = 0.02,
    speedup_weight: float = 1.0,
    workers: int | None = None,
    progress: Any = None,
) -> list[dict[str, Any]]:
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
    points = _jacobian_sims(rows, hardware, params, result, source, workers)
    base = result.sims[point_key(x)]
    out = []
    for i, m in enumerate(rows):
        keep = [j for j in range(len(rows)) if j != i]
        r0 = _residuals(rows, keep, base, speedup_weight)
        jac = np.column_stack(
            [
                (_residuals(rows, keep, result.sims[point_key(xj)], speedup_weight) - r0) / h
                for xj, h in points
            ]
        )
        # the prior pulls towards the full fit (as a refit started there does): zero at x
        a = np.vstack([jac, prior_weight * np.eye(len(params))])
        b = -np.concatenate([r0, np.zeros(len(params))])
        step = lsq_linear(a, b, bounds=(lo - x, hi - x)).x
        values = expand(params, list(np.exp(x + step)))
        pred = simulate_table([m], hardware, values, source, workers=1)[0]
        out.append(
            {
                **row_entry(m, pred, "predicted"),
                "evaluations": 1,
                "method": "linear",
                "fitted": {p.name: float(math.exp(x[j] + step[j])) for j, p in enumerate(params)},
            }
        )
        if progress:
            progress(out[-1])
    return out
