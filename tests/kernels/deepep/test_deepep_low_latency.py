"""Family deepep, mode low_latency: low_latency_dispatch / low_latency_combine against mc2's
numpy reference (written from the operators' semantics), test_low_latency.py's own checks
(per-expert counts, layout_range, the token index in x[:, -128:]), its bandwidth accounting
and the one-line refusals. Small shapes only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import yaml

from npusim.kernels.deepep.family import FAMILY
from npusim.kernels.mc2 import reference as mref
from npusim.scenario import load_scenario
from npusim.sim import Forked, simulate
from tests.kernels.deepep.deepephelp import refused, write_scenario

W, BS, H, K, L = 4, 16, 1024, 4, 4
SMALL = {"bs": BS, "h": H, "k": K, "ep_world_size": W, "experts_per_rank": L}


def _scenario(tmp: Path, name: str = "ll", hardware: str = "atlas_a3", **workload: Any):
    return load_scenario(write_scenario(tmp, {"mode": "low_latency", **SMALL}, hardware, name,
                                        5, **workload))


def _inputs(sc) -> list[dict[str, np.ndarray]]:
    w = sc.workload
    return FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 5}, True)


def _run(sc, inputs: list[dict[str, np.ndarray]]):
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        return simulate(sc)


def _bf16() -> np.dtype:
    from npusim.kernels.quant import token_dtype
    return token_dtype("bfloat16")


def _reference(inputs: list[dict[str, np.ndarray]], quant: str):
    """mc2's reference of the V2 pair: dispatch, then combine on the dequantised rows."""
    shape = mref.mc2_shape(W, (BS,) * W, H, K, W * L)
    ins = [mref.DispatchInputs(a["x"], a["topk_idx"].astype(np.int32)) for a in inputs]
    disp = mref.reference_dispatch(shape, ins, quant, 1)
    comb_in = [mref.CombineInputs(mref.dequantized_rows(d, quant, "bfloat16"),
                                  a["topk_idx"].astype(np.int32), a["topk_weights"])
               for d, a in zip(disp, inputs, strict=True)]
    return disp, mref.reference_combine(shape, disp, comb_in)


@pytest.mark.parametrize(("quant", "hardware"), [("bf16", "atlas_a3"), ("int8", "atlas_a3"),
                                                 ("bf16", "atlas_a2"), ("int8", "atlas_a2")])
def test_outputs_match_reference(tmp_path: Path, quant: str, hardware: str) -> None:
    """On the A2 with at most 8 ranks: the single-server kernels, the same V2 steps."""
    sc = _scenario(tmp_path, quant=quant, hardware=hardware)
    inputs = _inputs(sc)
    res = _run(sc, inputs)
    assert [r.op for r in res.ops] == ["low_latency_dispatch", "low_latency_combine"]
    disp, comb = (r.outputs for r in res.ops)
    want_d, want_x = _reference(inputs, "int8" if quant == "int8" else "none")
    every = np.concatenate([a["topk_idx"] for a in inputs])
    for r in range(W):
        d, want = disp[r], want_d[r]
        assert d["packed_recv_x"].tobytes() == want.expand_x.tobytes(), r
        if quant == "int8":
            assert d["packed_recv_x"].dtype == np.int8
            assert d["packed_recv_x_scales"].tobytes() == want.dynamic_scales.tobytes(), r
        assert np.array_equal(d["src_info"], want.assist_info_for_combine), r
        assert np.array_equal(d["layout_range"], want.ep_recv_count), r
        assert np.array_equal(d["packed_recv_count"], want.expert_token_nums), r
        # the test script's checks: recv_count per local expert = the pairs routed to it
        # over all ranks, and layout_range's inclusive cumsum steps by the same count
        lr = np.concatenate([[0], d["layout_range"].astype(np.int64)])
        for le in range(L):
            n = int((every == r * L + le).sum())
            assert int(d["packed_recv_count"][le]) == n
            assert int(lr[(le + 1) * W] - lr[le * W]) == n
        assert comb[r]["combined_x"].tobytes() == want_x[r].tobytes(), r


def test_one_local_expert_matches_reference(tmp_path: Path) -> None:
    """L = 1: UpdateTokenNumsOut writes the last core's total without re-reading counts."""
    sc = _scenario(tmp_path, quant="int8", experts_per_rank=1, k=2)
    inputs = _inputs(sc)
    disp = _run(sc, inputs).ops[0].outputs
    shape = mref.mc2_shape(W, (BS,) * W, H, 2, W)
    ins = [mref.DispatchInputs(a["x"], a["topk_idx"].astype(np.int32)) for a in inputs]
    for got, want in zip(disp, mref.reference_dispatch(shape, ins, "int8", 1), strict=True):
        assert np.array_equal(got["packed_recv_count"], want.expert_token_nums)
        assert got["packed_recv_x"].tobytes() == want.expand_x.tobytes()


def _calc_diff(x: np.ndarray, y: np.ndarray) -> float:
    """tests/python/deepep/utils.py calc_diff: 1 - the cosine-like similarity of x+1, y+1."""
    a, b = x.astype(np.float64) + 1, y.astype(np.float64) + 1
    return float(1 - 2 * (a * b).sum() / (a * a + b * b).sum())


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_token_index_survives_dispatch_combine(tmp_path: Path, quant: str) -> None:
    """test_low_latency.py: x = rank - 128 with x[:, -128:] = the token index. Received rows
    keep one value outside the tail (BF16 exactly, INT8 within 0.1) and their token index in
    it (src_info's token; INT8 within half a step); combined_x comes back
    as x * sum(weights) (BF16: weights 1/K, exactly; INT8: calc_diff below 3e-3)."""
    sc = _scenario(tmp_path, quant=quant)
    inputs = _inputs(sc)
    for r, a in enumerate(inputs):
        x = np.full((BS, H), r - 128, np.float32)
        x[:, -128:] = np.arange(BS, dtype=np.float32)[:, None]
        a["x"] = x.astype(_bf16())
        if quant == "bf16":
            a["topk_weights"][:] = np.float32(1 / K)
    res = _run(sc, inputs)
    disp, comb = (o.outputs for o in res.ops)
    for r in range(W):
        d = disp[r]
        n = int(d["layout_range"][-1])
        rows = d["packed_recv_x"][:n].astype(np.float32)
        if quant == "int8":
            rows = rows * d["packed_recv_x_scales"][:n, None]
        head = rows[:, :-128]
        tol = 0.1 if quant == "int8" else 0
        assert np.allclose(head.min(axis=1), head.max(axis=1), atol=tol)
        src = d["src_info"][:n]
        want_tail = src[:, 1].astype(np.float32)[:, None]
        # INT8: within half a quantisation step, max|x| / 127 / 2 <= 128 / 254
        assert np.allclose(rows[:, -128:], want_tail, atol=128 / 254 if quant == "int8" else 0)
        got = comb[r]["combined_x"].astype(np.float32)
        ref = inputs[r]["x"].astype(np.float32) * inputs[r]["topk_weights"].sum(axis=1)[:, None]
        if quant == "bf16":
            assert np.array_equal(got, ref)
        else:
            assert _calc_diff(ref, got) < 3e-3


def test_bandwidth_fields(tmp_path: Path) -> None:
    """test_low_latency.py's accounting by hand: num_selections = BS K (no -1 ids, local
    included); INT8 dispatch H + H/128 * 4 + 16 B each, combine 2H."""
    sc = _scenario(tmp_path, quant="int8")
    res = _run(sc, _inputs(sc))
    d, c = res.ops
    sel = BS * K
    for op, per in ((d, H + H // 128 * 4 + 16), (c, 2 * H)):
        f = op.family_fields
        ns = op.end_ns - op.start_ns
        assert f["low_latency_bytes"] == sel * per
        assert f["low_latency_gbps"] == pytest.approx(sel * per / ns, abs=0.01)
        assert f["kernel_us"] == pytest.approx(ns / 1000, abs=0.01)


def test_combine_alone_runs_on_the_reference_dispatch(tmp_path: Path) -> None:
    sc = _scenario(tmp_path, quant="int8")
    inputs = _inputs(sc)
    both = _run(sc, inputs)
    alone = _run(_scenario(tmp_path, name="alone", quant="int8", op="combine"), inputs)
    assert [r.op for r in alone.ops] == ["low_latency_combine"]
    for x, y in zip(both.ops[-1].outputs, alone.ops[-1].outputs, strict=True):
        assert x["combined_x"].tobytes() == y["combined_x"].tobytes()


def test_num_max_dispatch_tokens_sizes_global_bs(tmp_path: Path) -> None:
    """global_bs = num_max_dispatch_tokens_per_rank x W (deep_ep.cpp): the window grows, the
    outputs' capacity A = global_bs min(K, L) too, the valid rows stay the same."""
    sc = _scenario(tmp_path, op="dispatch", num_max_dispatch_tokens_per_rank=32)
    t = sc.workload.family.tiling(sc.workload.shape, sc.workload.options, sc.hardware)
    assert t.shape.global_bs == 32 * W
    assert t.shape.rows_capacity(0) == 32 * W * min(K, L)


def _refused(tmp: Path, **workload: Any) -> str:
    return refused(_scenario, tmp, **workload)


def test_refusals(tmp_path: Path) -> None:
    assert "[0, 512]" in _refused(tmp_path, bs=513)
    msg = _refused(tmp_path, num_max_dispatch_tokens_per_rank=8)
    assert "num_max_dispatch_tokens_per_rank" in msg and "EP_HOST_ASSERT" in msg
    assert "belongs to the normal mode" in _refused(tmp_path, op="layout")
    assert "allowed: hccl" in _refused(tmp_path, context="shmem", hardware="atlas_a2")
    assert "please use int8 or bf16" in _refused(tmp_path, quant="mx_fp8_e5m2")
    msg = _refused(tmp_path, hccl_buffsize=1, bs=512, h=7168, k=8)
    assert "hccl_buffsize" in msg
    assert "normal mode's rounds" in _refused(tmp_path, long_seq_round=2)
    msg = _refused(tmp_path, mode="normal", num_max_dispatch_tokens_per_rank=32)
    assert "allowed with mode normal: 0" in msg


def test_a2_refusals(tmp_path: Path) -> None:
    """ops2's A2 bounds and its whole servers beyond 8 ranks, each on its key."""
    def a2(**w: Any) -> str:
        return refused(_scenario, tmp_path, hardware="atlas_a2", **w)

    msg = a2(ep_world_size=12, op="dispatch")
    assert "workload.ep_world_size" in msg
    assert "epWorldSize % 8" in msg and "allowed: 1..8 or a multiple of 8" in msg
    assert "MAX_HIDDEN_SIZE_A2" in a2(h=8192)
    assert "MAX_MOE_EXPERT_NUMS_A2" in a2(experts_per_rank=129)
    assert "allowed: 1..16" in a2(k=17, experts_per_rank=8)
    assert "[0, 512]" in a2(bs=513)


def test_set_switches_the_mode(tmp_path: Path) -> None:
    """`--set workload.mode=low_latency` on a normal-mode scenario runs the two V2 kernels."""
    path = tmp_path / "n.yaml"
    w = {"kernel": "deepep", "op": "dispatch_combine", "dtype": "bfloat16", "timing_only": True,
         "routing": {"kind": "uniform", "seed": 1}, **SMALL}
    path.write_text(yaml.safe_dump({"name": "n", "hardware": "atlas_a3", "workload": w}))
    out = subprocess.run([sys.executable, "-m", "npusim", "run", str(path), "--set",
                          "workload.mode=low_latency", "--out", str(tmp_path / "o"), "--quiet"],
                         capture_output=True, text=True, check=True)
    assert out.returncode == 0
    report = (tmp_path / "o" / "report.md").read_text()
    assert "low_latency_dispatch" in report and "dispatch_layout" not in report


def test_combine_simulated_ahead_is_kept(tmp_path: Path) -> None:
    """With two workers the combine runs ahead on the reference dispatch; the simulated
    dispatch writes exactly what the combine reads of it, so the forked run is kept and the
    result is the one of a single worker."""
    sc = _scenario(tmp_path, quant="int8")
    inputs = _inputs(sc)
    one = _run(sc, inputs)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        two = simulate(sc, workers=2)
    assert two.combine_ahead == ("kept" if Forked.available() else "")
    for x, y in zip(one.ops, two.ops, strict=True):
        assert x.end_ns - x.start_ns == y.end_ns - y.start_ns
    assert [o["combined_x"].tobytes() for o in one.ops[-1].outputs] == \
        [o["combined_x"].tobytes() for o in two.ops[-1].outputs]


def _token_puts(tmp: Path, fill_triple_waits: bool | None) -> list:
    """The put_token spans of rank 0's core 0 (two pairs at BS K = 64 over 48 cores);
    `fill_triple_waits` None: the family's own tiling."""
    from dataclasses import replace

    from npusim.kernels.deepep import low_latency as ll

    plain = ll.tiling
    # the scenario builds the tiling while it is loaded, so the patch covers both steps
    if fill_triple_waits is None:
        sc = _scenario(tmp, quant="int8", op="dispatch")
        run = simulate(sc, detailed_trace=True).ops[0]
    else:
        with mock.patch.object(
            ll, "tiling", lambda *a: replace(plain(*a), fill_triple_waits_mte3=fill_triple_waits)
        ):
            sc = _scenario(tmp, quant="int8", op="dispatch")
            run = simulate(sc, detailed_trace=True).ops[0]
    return sorted(
        (s for s in run.spans if s.rank == 0 and s.core == 0 and s.name == "put_token"),
        key=lambda s: s.start_ns,
    )


def test_fill_triple_waits_for_the_cores_puts(tmp_path: Path) -> None:
    """The fork's FillTriple starts with SyncFunc<MTE3_S> (moe_distribute_dispatch_v2.h):
    a core's next put starts only once its previous one has landed. Without that wait
    (ops-transformer's later ProcessToken) the second put leaves while the first flies."""
    one = _token_puts(tmp_path, None)
    assert len(one) == 2
    assert one[1].start_ns >= one[0].delivered_ns - 1e-9
    assert [s.start_ns for s in one] == [s.start_ns for s in _token_puts(tmp_path, True)]
    two = _token_puts(tmp_path, False)
    assert len(two) == 2
    assert two[1].start_ns < two[0].delivered_ns
