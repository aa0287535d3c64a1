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

One concept per module: table (reading a table into Measurements), simulate (a table's
rows as timing-only scenarios), comparison (errors, MAPE, speed-ups), fitting (the least
squares fit), loo (leave-one-out), preset (reading and rewriting the preset's values),
report (the fit report).
"""

from npusim.calibrate.comparison import (
    Comparison,
    compare,
    error,
    log_residuals,
    row_entry,
    unit_label,
)
from npusim.calibrate.fitting import (
    FitResult,
    FreeParameter,
    check_params,
    expand,
    fit,
    parse_param,
    pinned_by,
)
from npusim.calibrate.loo import leave_one_out, leave_one_out_linear
from npusim.calibrate.preset import current_values, fit_provenance, rewrite_preset
from npusim.calibrate.simulate import row_doc, simulate_row, simulate_table, simulate_tables
from npusim.calibrate.table import (
    TARGETS_DIR,
    Measurement,
    default_table,
    option_columns,
    read_table,
    timed_ops,
    variant_option,
)

__all__ = [
    "TARGETS_DIR",
    "Comparison",
    "FitResult",
    "FreeParameter",
    "Measurement",
    "check_params",
    "compare",
    "error",
    "current_values",
    "default_table",
    "expand",
    "fit",
    "fit_provenance",
    "leave_one_out",
    "leave_one_out_linear",
    "log_residuals",
    "option_columns",
    "parse_param",
    "pinned_by",
    "read_table",
    "rewrite_preset",
    "row_entry",
    "row_doc",
    "simulate_row",
    "simulate_table",
    "simulate_tables",
    "timed_ops",
    "unit_label",
    "variant_option",
]
