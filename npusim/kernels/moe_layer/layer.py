"""The layer's own figures, over the kernels a form runs: what the DeepEP tests print for a
layer (the sum of its kernels' device times: test_fused_deep_moe.py sums the profiler's
per-kernel averages), on the last kernel of the run, so a form of one kernel and a chain
of five report the same fields.

- `layer_latency_us`: the sum of the kernels' latencies (each from its launch to its end
  on the latest rank; the next kernel starts then, so this is also the chain's span);
- `layer_ops_us`: each kernel's latency;
- where a kernel reports `overlap` (npusim.kernels.common.overlap.layer_fields),
  `communication_hidden_us` and `communication_exposed_us`: its communication time behind
  compute and not, summed over the communication tags (per-rank means).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _us(ns: float) -> float:
    return round(ns / 1e3, 4)


def layer_fields(runs: Sequence[Any]) -> list[dict[str, Any]]:
    """One dict per run, the layer's figures on the last."""
    out: list[dict[str, Any]] = [{} for _ in runs]
    if not runs:
        return out
    ops = {r.op: _us(r.end_ns - r.start_ns) for r in runs}
    last: dict[str, Any] = {
        "layer_latency_us": _us(sum(r.end_ns - r.start_ns for r in runs)),
        "layer_ops_us": ops}
    split = [v for r in runs for v in (r.family_fields.get("overlap") or {}).values()]
    if split:
        last["communication_hidden_us"] = round(sum(v["hidden_us"] for v in split), 4)
        last["communication_exposed_us"] = round(sum(v["exposed_us"] for v in split), 4)
    out[-1] = last
    return out
