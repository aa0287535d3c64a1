"""How much of MegaMoE's communication the fusion hides, and which stage is critical.

Per rank, from what the program noted on its cores (npusim.kernels.common.overlap):

- communication C: the union of the intervals in which a remote transfer of the rank is
  in flight (BuildSendMasks' mask stores, the dispatch's remote MTE2 pulls, the
  CombineTokens write-backs), from its start on the pipe to delivery (the rank barrier's
  4 B scalar stores are latency, not transfers, and are left out);
- compute X: the union of the intervals in which a cube (mmad) or a vector unit of the
  rank is busy;
- hidden = |C and X| / |C|: the share of communication time during which the rank also
  computes, so the fusion overlaps it; exposed = |C| - |C and X|, communication with
  nothing to hide it behind (on the critical path unless another rank is later).

A stage's time is the length of the union, over every rank, of the intervals the cores
that do its work (WORKERS: the AIC for the projections, AIV1 for counting and dispatch,
every AIV for the rest; the others only wait in it) spend in it. Stages overlap (that is
the pipeline); the critical stage is the work stage with the longest time, the one that
bounds the layer (synchronize_ranks, the barriers' waiting, is reported but not a
candidate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npusim.kernels.common import overlap
from npusim.kernels.kernel import CoreTiming

WORKERS = {"build_send_masks": "aiv", "quantize_local_tokens": "aiv",
           "synchronize_ranks": "aiv", "count_received_tokens": "aiv1", "dispatch": "aiv1",
           "first_projection": "aic", "second_projection": "aic", "combine": "aiv"}


def timing_fields(run: Any, cores: Sequence[Sequence[CoreTiming]]) -> dict[str, Any]:
    """The overlap figures of a finished call, synchronize_ranks (waiting) no candidate for
    the critical stage."""
    return overlap.timing_fields(run, cores, WORKERS, waits=("synchronize_ranks",))
