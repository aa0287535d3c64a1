"""How far a run's timing is vouched for: its fidelity ledger.

A ledger is per op of a run (family, preset, shape): the measured tables that vouch for
the family on the preset (their MAPE and worst row, computed from the table and the
table's validation record), whether the shape lies inside the rows' range, and the
assumed preset values the op's time depends on most (found by perturbing them). A run
no table vouches for is "uncalibrated", and the ledger says why.
"""

from npusim.fidelity.ledger import (
    DEFAULT_BAND,
    Assumed,
    Ledger,
    TableFit,
)

__all__ = ["DEFAULT_BAND", "Assumed", "Ledger", "TableFit"]
