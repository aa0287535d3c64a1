"""Helpers to run small scenarios from tests without scenario files on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import yaml

from npusim import sim
from npusim.kernels.cann_sample.family import DISPATCH_OUTPUTS
from npusim.kernels.cann_sample.reference import (
    dispatch_plan,
    reference_combine,
    reference_dispatch,
)
from npusim.result import RunResult
from npusim.scenario import Scenario, load_scenario
from npusim.sim import simulate
from npusim.workload.inputs import RunInputs, generate_inputs


def U(seed: int) -> dict[str, Any]:
    """Uniform random routing with this seed (the routing section of a workload)."""
    return {"kind": "uniform", "seed": seed}


def scenario(tmp: Path, name: str = "t", hardware: str = "ascend950",
             overrides: dict[str, Any] | None = None, **workload: Any) -> Scenario:
    w = {"op": "dispatch", "bs": 8, "h": 1024, "k": 4, "ep_world_size": 4,
         "experts_per_rank": 2, "dtype": "float16", "dispatch_quant": "mxfp8"}
    routing = workload.pop("routing", None)
    w.update(workload)
    if routing is not None:
        w["routing"] = routing
    doc = {"name": name, "hardware": hardware, "workload": w}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def run(tmp: Path, **kw: Any) -> tuple[Scenario, RunResult]:
    sc = scenario(tmp, **kw)
    return sc, simulate(sc)


# --------------------------------------------------------------------------- inputs, references
# Expected values come from cann_sample.reference (plain numpy, no runtime) fed with the same inputs
# the simulator reads; nothing here looks at simulator outputs.


def case_id(**w: Any) -> str:
    """Readable pytest id of a workload dict, e.g. w4-bs33-h1024-k4-l4-mxfp8-bf16-uniform1."""
    parts = [f"w{w['ep_world_size']}", f"bs{w['bs']}", f"h{w['h']}", f"k{w['k']}",
             f"l{w['experts_per_rank']}"]
    op = w.get("op", "dispatch")
    if op in ("dispatch", "dispatch_combine"):
        parts.append(w.get("dispatch_quant", "mxfp8"))
    if op in ("combine", "dispatch_combine"):
        parts.append("c" + w.get("combine_quant", "none"))
    parts.append({"float16": "fp16", "bfloat16": "bf16"}[w.get("dtype", "float16")])
    r = w.get("routing") or {"kind": "balanced"}
    parts.append(r["kind"] + (str(r["seed"]) if r["kind"] != "balanced" else "")
                 + (f"s{r['s']:g}" if "s" in r else ""))
    if w.get("expert_token_nums_type", "count") == "cumsum":
        parts.append("cumsum")
    if w.get("shared_experts"):
        parts.append(f"s{w['shared_experts']}r{w['shared_expert_ranks']}")
    return "-".join(parts)


def workload_inputs(sc: Scenario) -> RunInputs:
    """The inputs a seeded scenario describes (generate_inputs from the workload fields)."""
    w = sc.workload
    return generate_inputs(w.shape, **w.routing, with_combine="combine" in w.ops)


def simulate_with(sc: Scenario, inputs: list[dict[str, np.ndarray]]) -> RunResult:
    """simulate(sc) on hand-made per-rank inputs (x, expert_ids, expert_scales, expand_x)
    instead of the seeded ones: the driver's input loader is swapped for the call. The
    arrays are copied, so the caller's stay untouched whatever the run does with its own."""
    own = [{k: np.array(v, copy=True) for k, v in d.items()} for d in inputs]
    with mock.patch.object(sim, "load_inputs", lambda _sc: own):
        return simulate(sc)


def dispatch_ref(sc: Scenario, x: list[np.ndarray], ids: list[np.ndarray]
                 ) -> list[dict[str, np.ndarray]]:
    w = sc.workload
    return reference_dispatch(x, ids, w.shape.L, w.dispatch_quant,
                              w.expert_token_nums_type, saturate=w.mxfp8_saturate,
                              shared_experts=w.shape.S,
                              shared_expert_ranks=w.shape.S_r)


def combine_ref(sc: Scenario, expand_x: list[np.ndarray], ids: list[np.ndarray],
                scales: list[np.ndarray], recip: bool,
                disp: list[dict[str, np.ndarray]] | None = None) -> list[np.ndarray]:
    """reference_combine; assist info and counts from `disp` or from the routing alone."""
    w = sc.workload
    if disp is None:
        plans = dispatch_plan(ids, w.shape.L, w.shape.S, w.shape.S_r)
        assist = [np.stack([p.src, p.token, p.k], axis=1) for p in plans]
        recv = [np.cumsum(p.counts) for p in plans]
    else:
        assist = [d["assist_info_for_combine"] for d in disp]
        recv = [d["ep_recv_count"] for d in disp]
    return reference_combine(expand_x, assist, recv, ids, scales, w.shape,
                             quant=w.combine_quant, recip=recip)


def check_dispatch_outputs(outputs: list[dict[str, np.ndarray]],
                           ref: list[dict[str, np.ndarray]]) -> None:
    """Every rank's five dispatch outputs byte for byte."""
    assert len(outputs) == len(ref)
    for r, (got, want) in enumerate(zip(outputs, ref, strict=True)):
        assert set(got) == set(want) == set(DISPATCH_OUTPUTS), (r, sorted(got), sorted(want))
        for name, arr in want.items():
            assert_bytes_equal(got[name], arr, f"rank {r} {name}")


def check_x(outputs: list[dict[str, np.ndarray]], ref: list[np.ndarray], what: str) -> None:
    """Every rank's combine output x byte for byte."""
    assert len(outputs) == len(ref)
    for r, (got, want) in enumerate(zip(outputs, ref, strict=True)):
        assert_bytes_equal(got["x"], want, f"rank {r} x ({what})")


def assert_bytes_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Same dtype, same shape, same bytes; on failure say where, in elements and rows."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    g = np.ascontiguousarray(got)
    e = np.ascontiguousarray(want)
    if np.array_equal(g.view(np.uint8), e.view(np.uint8)):
        return
    item = max(g.dtype.itemsize, 1)
    gb = g.reshape(-1).view(np.uint8).reshape(-1, item)
    eb = e.reshape(-1).view(np.uint8).reshape(-1, item)
    bad = np.nonzero((gb != eb).any(axis=1))[0]
    i = int(bad[0])
    where = np.unravel_index(i, g.shape) if g.ndim else ()
    raise AssertionError(
        f"{what}: {bad.size} of {g.size} elements differ; first at index "
        f"{tuple(int(v) for v in where)}: got {g.reshape(-1)[i]!r}, expected {e.reshape(-1)[i]!r}"
    )


# --------------------------------------------------------------------------- round-trip bound
# dispatch -> identity experts -> combine returns (sum_k w_k + S) x: every MoE expert gives
# back its (quantised) token times its weight, every one of the S shared experts the token
# with weight 1. With weights summing to 1 that is (1 + S) x. The bound on |x_out - (1+S) x|
# is derived here from the formats, per element:
#   u  = unit roundoff of the token dtype (2^-11 fp16, 2^-8 bf16)
#   e1 = dispatch quantise + dequantise to the token dtype:
#        none 0;  mxfp8 e5m2 (2 mantissa bits, RNE; saturating) |x| 2^-3, plus e5m2
#        subnormals (< block amax 2^-32 absolute), then the cast to the token dtype;
#        int8 per token: half a step amax/127/2 (fp32 scale 1/d, product rounding), then cast
#   e2 = combine INT8 block of 8 on the dispatched row v (block max m <= max |x| + e1):
#        q = rint(fp16(v / s)) is within 0.5 + 2^-5 steps (fp16 ulp below 128 is 2^-4) of
#        v / s, s = m / 127; the stored scale rounds to the token dtype (|q| s u <= m u);
#        the dequantised value rounds to the token dtype once more (u (|x| + e1 + e2))
#   sum_k w_k row_k + sum_j row_j in fp32 and the final cast: (|sum w| + S) (e1 + e2)
#        + |1 - sum w| |x| plus (K + S) 2^-24 of the magnitudes and u of the result.
# Every fp32 intermediate rounding (127 / amax, 1 / d, the products and quotients) is a few
# 2^-24 of amax at most; each stage carries amax 2^-18 for all of them.


def unit_roundoff(dtype: str) -> float:
    return 2.0**-11 if dtype == "float16" else 2.0**-8


def round_trip_bound(x: np.ndarray, w: np.ndarray, dquant: str, cquant: str, dtype: str,
                     shared: int = 0) -> np.ndarray:
    """Per element bound on |x_out - (1 + shared) x| for weights w [BS, K] summing to ~1."""
    u = unit_roundoff(dtype)
    ax = np.abs(x.astype(np.float64))
    amax = ax.max(axis=1, keepdims=True)
    sub = 2.0**-24 if dtype == "float16" else 0.0  # fp16 subnormal spacing / 2
    f32 = amax * 2.0**-18  # fp32 intermediate roundings of one stage
    if dquant == "none":
        e1 = np.zeros_like(ax)
    elif dquant == "mxfp8":
        blocks = ax.reshape(ax.shape[0], -1, 32).max(axis=2)
        e1 = ax * 2.0**-3 + np.repeat(blocks, 32, axis=1) * 2.0**-32
        e1 = e1 + u * (ax + e1) + sub
    elif dquant == "int8":
        e1 = amax / 127 / 2 + f32
        e1 = e1 + u * (ax + e1) + sub
    else:
        raise ValueError(dquant)
    if cquant == "int8":
        v = ax + e1
        m = np.repeat(v.reshape(v.shape[0], -1, 8).max(axis=2), 8, axis=1)
        e2 = m / 127 * (0.5 + 2.0**-5) + m * u + f32
        e2 = e2 + u * (v + e2) + sub
    else:
        e2 = np.zeros_like(ax)
    wabs = np.abs(w.astype(np.float64)).sum(axis=1, keepdims=True) + shared
    wdev = np.abs(1 - w.astype(np.float64).sum(axis=1, keepdims=True))
    n = w.shape[1] + shared
    inner = wabs * (e1 + e2) + wdev * ax + n * 2.0**-24 * wabs * (ax + e1 + e2)
    return inner + u * ((1 + shared) * ax + inner) + sub
