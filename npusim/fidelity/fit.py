"""One table's word on one op at one shape: inside the rows' range, and their errors.

The keys are those the family's rows give: a numeric key (bs, ep_world_size,
block_bytes) spans lo..hi over the rows; a text key (mode, quant, path, transport,
dtype, the routing's kind) is the set of its values, and so is a number that names a
configuration (an option declared `exact`: hixl's servers, rms_norm_quant's step). The
errors are those of the simulated rows sharing the run's text values, so a RoCE run is
held against the RoCE rows. Another kernel's variant (a combine row's dispatch
quantisation) is no key of a row, as the speed-up pairing of npusim.calibrate.comparison
ignores it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from npusim.calibrate.comparison import error
from npusim.calibrate.table import family_of, timed_ops
from npusim.fidelity.ledger import TableFit
from npusim.fidelity.record import record_command
from npusim.fidelity.tables import Row

_NOT_KEYS = ("op", "kernel", "num_experts", "timing_only")


def row_keys(r: Row) -> dict[str, Any]:
    """The row's shape keys and their values (routing: its kind)."""
    w = r.m.workload
    fam = family_of(w)
    run, i = timed_ops(fam, w)[r.m.op]
    own = fam.kernel(fam.runs_of(w)[run][i]).variant
    others = {k.variant for k in fam.ops if k.variant is not None and k.variant != own}
    return {k: _plain(v) for k, v in w.items() if k not in _NOT_KEYS and k not in others}


def run_value(workload: Mapping[str, Any], family: str, key: str) -> Any:
    """The run's value of a key: the workload's, else its default (the family option's,
    or the scenario's for a generic key such as the routing)."""
    from npusim.kernels import registry
    from npusim.scenario.workload import WORKLOAD_DEFAULTS

    if key in workload:
        return _plain(workload[key])
    try:
        options = registry.get(family).options
    except registry.FamilyError:
        options = ()
    default = next((o.default for o in options if o.name == key), WORKLOAD_DEFAULTS.get(key))
    return _plain(default)


def exact_keys(family: str) -> set[str]:
    """The family's options that name a configuration (Option.exact): matched like words."""
    from npusim.kernels import registry

    try:
        return {o.name for o in registry.get(family).options if o.exact}
    except registry.FamilyError:
        return set()


def _plain(v: Any) -> Any:
    return v.get("kind") if isinstance(v, Mapping) else v


def numeric(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _span(values: list[Any]) -> str:
    lo, hi = min(values), max(values)
    return _show(lo) if lo == hi else f"{_show(lo)}..{_show(hi)}"


def errors_of(rows: Sequence[Row]) -> tuple[float | None, float | None, str]:
    """MAPE, worst |error| and its row over the rows with a simulated value."""
    errs = [(abs(error(r.m, r.simulated)), r.m.name) for r in rows if r.simulated is not None]
    if not errs:
        return None, None, ""
    worst = max(errs, key=lambda e: e[0])
    return sum(e for e, _ in errs) / len(errs), worst[0], worst[1]


def table_fit(table: str, preset: str, rows: Sequence[Row], family: str,
              workload: Mapping[str, Any]) -> TableFit:
    """A table's rows of one family and op against the run's workload."""
    keyed = [(r, row_keys(r)) for r in rows]
    exact = exact_keys(family)
    text = sorted({k for _, ks in keyed for k, v in ks.items() if not numeric(v) or k in exact})
    mine = {k: run_value(workload, family, k) for k in text}
    same = [(r, ks) for r, ks in keyed if all(str(ks[k]) == str(mine[k]) for k in text if k in ks)]
    outside = _not_among(keyed, text, mine) or _outside(same, family, workload, text)
    matched = [r for r, _ in same if r.simulated is not None]
    mape, worst, worst_row = errors_of(matched)
    done = sum(r.simulated is not None for r in rows)
    record = (f"{done} of {len(rows)} rows simulated: record them with "
              f"`{record_command(table, preset)}`")
    # inside the table's rows but not the simulated ones': no error measured out there
    unsimulated = "" if outside or not matched else _outside(
        [(r, ks) for r, ks in same if r.simulated is not None], family, workload, text)
    if outside:
        context = " ".join([family, *(_show(mine[k]) for k in text
                                      if k not in ("dtype", "routing"))])
        why = f"{outside} ({context})"
    elif unsimulated:
        why = unsimulated.replace("the table's", "the simulated rows'") + f"; {record}"
    elif worst is None:
        why = record
    else:
        why = ""
    return TableFit(table, len(rows), done, mape, worst, worst_row,
                    inside=not outside and not unsimulated, outside_why=why,
                    matched=len(matched))


def _not_among(keyed: list[tuple[Row, dict[str, Any]]], text: list[str],
               mine: Mapping[str, Any]) -> str:
    """The first text key whose run value no row has ('' if none)."""
    for k in text:
        seen = sorted({str(ks[k]) for _, ks in keyed if k in ks})
        if str(mine[k]) not in seen:
            return f"{k} {_show(mine[k])} is not among the table's {', '.join(seen)}"
    return ""


def _outside(same: list[tuple[Row, dict[str, Any]]], family: str,
             workload: Mapping[str, Any], matched: Sequence[str]) -> str:
    """The first numeric key (not one `matched` exactly) whose run value lies outside the
    rows' lo..hi ('' if none)."""
    keys = sorted({k for _, ks in same for k, v in ks.items() if numeric(v) and k not in matched})
    for k in keys:
        values = [ks[k] for _, ks in same if k in ks]
        v = run_value(workload, family, k)
        if numeric(v) and not min(values) <= v <= max(values):
            return f"{k} {_show(v)} is outside the table's {_span(values)}"
    return ""
