"""Shared experts (ops-transformer MoeDistributeDispatchV2 / CombineV2,
docs/kernels/cann_sample.md).

S shared experts live on ranks 0..S_r-1, each replicated on R = S_r / S ranks; the
E = L * (W - S_r) MoE experts on ranks S_r.. (expert e on rank S_r + e // L). Every token
of every rank goes to shared expert j on rank (r mod R) + j R as the row (r, t, K + j);
combine adds those rows with weight 1 after the K weighted MoE rows.

Dispatch outputs and combine x are compared byte for byte with cann_sample.reference (plain
numpy, written from the semantics); a worked example is checked against numbers derived by
hand; the dispatch -> combine round trip with identity experts gives (sum w + S) x within
the quantisation bound of samplehelp.round_trip_bound; bad inputs are one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.kernels.cann_sample.reference import (
    dispatch_plan,
    expert_outputs_from_dispatch,
    reference_dispatch,
)
from npusim.scenario import load_scenario
from tests.kernels.cann_sample.samplehelp import (
    U,
    assert_bytes_equal,
    case_id,
    check_dispatch_outputs,
    check_x,
    combine_ref,
    dispatch_ref,
    round_trip_bound,
    run,
    scenario,
    simulate_with,
    workload_inputs,
)

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "scenarios" / "examples" / "dispatch_combine_shared.yaml"
BF = "bfloat16"
ZIPF = {"kind": "zipf", "seed": 1, "s": 2.0}



def _s(op: str, W: int, S: int, S_r: int, BS: int, K: int, L: int, dq: str = "mxfp8",
       cq: str = "none", dtype: str = "float16", routing: dict[str, Any] | None = None,
       h: int = 1024, **extra: Any):
    w = dict(op=op, ep_world_size=W, shared_experts=S, shared_expert_ranks=S_r, bs=BS, h=h,
             k=K, experts_per_rank=L, dispatch_quant=dq, combine_quant=cq, dtype=dtype, **extra)
    if routing is not None:
        w["routing"] = routing
    return pytest.param(w, id=case_id(**w))


DISPATCH_CASES = [
    _s("dispatch", 2, 1, 1, 1, 1, 4, dtype=BF),  # one shared rank sends to itself, one MoE rank
    _s("dispatch", 4, 1, 2, 8, 4, 2),  # R = 2: even sources to rank 0, odd ones to rank 1
    _s("dispatch", 4, 2, 2, 8, 2, 4, "int8", routing=U(1)),  # R = 1: every token to both
    _s("dispatch", 8, 2, 4, 33, 4, 2, "none", routing=U(2)),  # shared ranks: half the world
    _s("dispatch", 5, 2, 4, 8, 3, 4, routing=ZIPF,  # W % R != 0: 3 and 2 senders
       expert_token_nums_type="cumsum"),
    _s("dispatch", 6, 1, 3, 16, 8, 4, "int8", dtype=BF, routing=U(3)),  # R = 3
]
COMBINE_CASES = [
    _s("combine", 4, 1, 2, 8, 4, 2, cq="int8", dq="none"),
    _s("combine", 8, 2, 4, 8, 4, 2, cq="none", dq="none", dtype=BF, routing=U(4)),
    _s("combine", 5, 2, 4, 33, 3, 4, cq="int8", dq="none", routing=U(5)),
]
CHAIN_CASES = [
    _s("dispatch_combine", 4, 1, 2, 8, 4, 2, "mxfp8", "int8"),
    _s("dispatch_combine", 8, 2, 4, 8, 4, 2, "int8", "none", BF, U(6)),
    _s("dispatch_combine", 6, 4, 4, 8, 2, 2, "none", "int8", routing=U(7)),  # S = 4, R = 1
    _s("dispatch_combine", 9, 1, 1, 8, 8, 4, "mxfp8", "int8", h=7168),  # the sample's shape
]


def _run_dispatch(tmp_path: Path, workload: dict[str, Any]):
    """Run the workload, check its dispatch outputs against the reference; returns
    (scenario, result, inputs, reference dispatch outputs)."""
    sc, res = run(tmp_path, **workload)
    inp = workload_inputs(sc)
    disp = dispatch_ref(sc, inp.x, inp.expert_ids)
    check_dispatch_outputs(res.ops[0].outputs, disp)
    return sc, res, inp, disp


# Unsaturated MXFP8 (the sample's rule) can produce inf, and combine's INT8 block 0 * inf NaN,
# in the kernel and the reference alike (see test_combine).
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("workload", DISPATCH_CASES)
def test_dispatch_bit_exact(tmp_path: Path, workload: dict[str, Any]) -> None:
    sc, res, _, _ = _run_dispatch(tmp_path, workload)
    s = sc.workload.shape
    R = s.S_r // s.S
    for r in range(s.S_r):  # a shared rank's output shapes
        out = res.ops[0].outputs[r]
        assert out["expand_x"].shape[0] == s.BS * -(-s.W // R)
        assert out["ep_recv_count"].shape == (s.W,)
        assert out["expert_token_nums"].shape == (1,)


@pytest.mark.parametrize("workload", COMBINE_CASES)
def test_combine_bit_exact(tmp_path: Path, workload: dict[str, Any]) -> None:
    sc, res = run(tmp_path, **workload)
    inp = workload_inputs(sc)
    ref = combine_ref(sc, inp.expand_x, inp.expert_ids, inp.expert_scales, True)
    check_x(res.ops[0].outputs, ref, "kernel arithmetic, recip")
    if sc.workload.dtype == "float16":
        golden = combine_ref(sc, inp.expand_x, inp.expert_ids, inp.expert_scales, False)
        check_x(res.ops[0].outputs, golden, "golden arithmetic, divide")


def _check_chain(tmp_path: Path, workload: dict[str, Any]) -> None:
    """dispatch_combine: dispatch outputs, then x from identity experts, byte for byte."""
    sc, res, inp, disp = _run_dispatch(tmp_path, workload)
    w = sc.workload
    experts = [expert_outputs_from_dispatch(d, w.dispatch_quant, w.shape.H, w.dtype) for d in disp]
    ref = combine_ref(sc, experts, inp.expert_ids, inp.expert_scales, True, disp)
    check_x(res.ops[1].outputs, ref, "kernel arithmetic, recip")


@pytest.mark.parametrize("workload", CHAIN_CASES)
def test_dispatch_combine_bit_exact(tmp_path: Path, workload: dict[str, Any]) -> None:
    _check_chain(tmp_path, workload)


def test_worked_example_by_hand(tmp_path: Path) -> None:
    """W = 8, S_r = 2, S = 1, L = 4 (E = 24), K = 8, BS = 16 (docs/kernels/cann_sample.md):
    R = 2, rank 0 receives the tokens of ranks 0, 2, 4, 6 and rank 1 those of 1, 3, 5, 7;
    MoE expert e is on rank 2 + e // 4."""
    sc, res = run(tmp_path, op="dispatch", ep_world_size=8, shared_experts=1,
                  shared_expert_ranks=2, bs=16, h=1024, k=8, experts_per_rank=4,
                  dispatch_quant="none")
    out = res.ops[0].outputs
    inp = workload_inputs(sc)
    for g in (0, 1):
        srcs = [g, g + 2, g + 4, g + 6]
        counts = [16 if r % 2 == g else 0 for r in range(8)]
        assert out[g]["ep_recv_count"].tolist() == np.cumsum(counts).tolist()
        assert out[g]["expert_token_nums"].tolist() == [64]
        want = [[s, t, 8] for s in srcs for t in range(16)]
        assert out[g]["assist_info_for_combine"].tolist() == want
        assert_bytes_equal(out[g]["expand_x"], np.concatenate([inp.x[s] for s in srcs]),
                           f"rank {g} expand_x")
    for d in range(2, 8):  # a MoE rank gets the (src, token, k) with id in its 4 experts
        got = {tuple(row) for row in out[d]["assist_info_for_combine"][
            :out[d]["ep_recv_count"][-1]].tolist()}
        want = {(s, t, k) for s in range(8) for t in range(16) for k in range(8)
                if 2 + int(inp.expert_ids[s][t, k]) // 4 == d}
        assert got == want and out[d]["expert_token_nums"].shape == (4,)


@pytest.mark.parametrize(("S", "S_r"), [(1, 2), (2, 2), (2, 4)])
def test_round_trip_identity_experts(tmp_path: Path, S: int, S_r: int) -> None:
    """Identity experts and weights summing to 1: x comes back as (1 + S) x."""
    W, BS, K, L = 6, 8, 4, 2
    sc = scenario(tmp_path, op="dispatch_combine", ep_world_size=W, shared_experts=S,
                  shared_expert_ranks=S_r, bs=BS, h=1024, k=K, experts_per_rank=L,
                  dispatch_quant="none", combine_quant="none", routing=U(8))
    inp = workload_inputs(sc)
    ws = [np.full((BS, K), 1.0 / K, np.float32) for _ in range(W)]  # 1/4: exact, sum 1
    inputs = [{"x": inp.x[r], "expert_ids": inp.expert_ids[r], "expert_scales": ws[r]}
              for r in range(W)]
    res = simulate_with(sc, inputs)
    for r in range(W):
        # K rows x * 1/4 add up to x exactly in fp32; S more x: (1 + S) x in fp32 (13 bits
        # of mantissa at most), rounded once to fp16.
        want = (inp.x[r].astype(np.float32) * np.float32(1 + S)).astype(np.float16)
        assert_bytes_equal(res.ops[1].outputs[r]["x"], want, f"rank {r} x = {1 + S} x")


@pytest.mark.parametrize(("dquant", "cquant", "dtype"), [
    ("mxfp8", "int8", "float16"), ("int8", "none", "bfloat16"), ("mxfp8", "none", "bfloat16")])
def test_round_trip_quantised_within_bound(tmp_path: Path, dquant: str, cquant: str,
                                           dtype: str) -> None:
    W, BS, K, L, S, S_r = 8, 8, 4, 2, 2, 4
    sc = scenario(tmp_path, op="dispatch_combine", ep_world_size=W, shared_experts=S,
                  shared_expert_ranks=S_r, bs=BS, h=1024, k=K, experts_per_rank=L,
                  dispatch_quant=dquant, combine_quant=cquant, dtype=dtype,
                  mxfp8_saturate=True, routing=U(9))
    inp = workload_inputs(sc)
    rng = np.random.default_rng(10)
    ws = [rng.uniform(0.05, 1.0, (BS, K)).astype(np.float32) for _ in range(W)]
    ws = [(a / a.sum(axis=1, keepdims=True)).astype(np.float32) for a in ws]
    inputs = [{"x": inp.x[r], "expert_ids": inp.expert_ids[r], "expert_scales": ws[r]}
              for r in range(W)]
    res = simulate_with(sc, inputs)
    for r in range(W):
        x = inp.x[r].astype(np.float64)
        g = res.ops[1].outputs[r]["x"].astype(np.float64)
        assert np.isfinite(g).all()
        err = np.abs(g - (1 + S) * x)
        bound = round_trip_bound(inp.x[r], ws[r], dquant, cquant, dtype, shared=S)
        assert (err <= bound).all(), f"rank {r}: max excess {float((err - bound).max()):g}"
        # not vacuous: far below the (1 + S) x being checked
        assert (bound <= 0.14 * (1 + S) * np.abs(x) + 0.05 * np.abs(x).max()).all()


def test_reference_plan_by_hand() -> None:
    """dispatch_plan on a tiny routing: W = 3, S = 1, S_r = 1 (R = 1), L = 1, K = 1."""
    ids = [np.array([[0], [1]], np.int32), np.array([[1], [0]], np.int32),
           np.array([[0], [0]], np.int32)]
    plans = dispatch_plan(ids, 1, 1, 1)
    sh = plans[0]  # every rank's 2 tokens, slot K + 0 = 1
    assert list(zip(sh.src.tolist(), sh.token.tolist(), sh.k.tolist(), strict=True)) == [
        (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1), (2, 0, 1), (2, 1, 1)]
    assert sh.counts.reshape(-1).tolist() == [2, 2, 2]
    e0 = plans[1]  # expert 0 on rank 1: (0,0), (1,1), (2,0), (2,1)
    assert list(zip(e0.src.tolist(), e0.token.tolist(), strict=True)) == [
        (0, 0), (1, 1), (2, 0), (2, 1)]
    assert plans[2].n == 2  # expert 1 on rank 2
    x = [np.full((2, 1024), r + 1, np.float16) for r in range(3)]
    out = reference_dispatch(x, ids, 1, "none", shared_experts=1, shared_expert_ranks=1)
    assert out[0]["ep_recv_count"].tolist() == [2, 4, 6]
    assert out[0]["expert_token_nums"].tolist() == [6]
    assert out[0]["expand_x"][:, 0].tolist() == [1, 1, 2, 2, 3, 3]


# --------------------------------------------------------------------------- scenario errors
BASE = {"op": "dispatch_combine", "bs": 8, "h": 1024, "k": 4, "ep_world_size": 8,
        "experts_per_rank": 4}
W_ = "workload."
BAD = [
    ("sr-not-multiple", {"shared_experts": 2, "shared_expert_ranks": 3},
     W_ + "shared_expert_ranks", "not a multiple of shared_experts (2)"),
    ("s-without-ranks", {"shared_experts": 1}, W_ + "shared_expert_ranks", "0 with shared"),
    ("ranks-without-s", {"shared_expert_ranks": 2}, W_ + "shared_experts", "1..4 dividing 2"),
    ("s-5", {"shared_experts": 5, "shared_expert_ranks": 5}, W_ + "shared_experts", "0..4"),
    ("no-moe-rank", {"shared_experts": 1, "shared_expert_ranks": 8},
     W_ + "shared_expert_ranks", "0..7"),
    ("sr-bool", {"shared_experts": 1, "shared_expert_ranks": True},
     W_ + "shared_expert_ranks", "integer"),
    ("k-gt-moe-e", {"shared_experts": 1, "shared_expert_ranks": 7, "k": 5},
     W_ + "k", "k <= 4"),
    ("e-1025", {"shared_experts": 1, "shared_expert_ranks": 1, "ep_world_size": 8,
                "experts_per_rank": 147}, W_ + "experts_per_rank", "7 * 147 = 1029"),
]


@pytest.mark.parametrize(("extra", "key", "text"), [pytest.param(e, k, t, id=i)
                                                    for i, e, k, t in BAD])
def test_bad_shared_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             extra: dict[str, Any], key: str, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "workload": {**BASE, **extra}}))
    with pytest.raises(InputError) as info:
        load_scenario(path)
    assert info.value.key == key and text in str(info.value), str(info.value)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"npusim: error: {path}: {key}: "), err
    assert not out.exists()


def test_too_few_cores_for_the_shared_sends(tmp_path: Path) -> None:
    """C = 3, K = 1, S = 1: one shared-send core (max(1, 3 // 2)) leaves 2: fine; C = 2
    leaves 1, with no room for both a MoE-send and a cum-sum core."""
    doc = {"name": "s", "hardware_overrides": {"chip.aiv_cores": 3}, "workload": {
        **BASE, "k": 1, "shared_experts": 1, "shared_expert_ranks": 1}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load_scenario(path).hardware.chip.aiv_cores == 3
    doc["hardware_overrides"]["chip.aiv_cores"] = 2
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as info:
        load_scenario(path)
    assert info.value.key == "workload.shared_experts" and "chip.aiv_cores" in str(info.value)


def test_three_cores_one_of_each_role(tmp_path: Path) -> None:
    """A MoE-send core, a cum-sum core and a shared-send core: still byte-exact."""
    _check_chain(tmp_path, dict(
        overrides={"chip.aiv_cores": 3}, op="dispatch_combine", ep_world_size=4,
        shared_experts=1, shared_expert_ranks=2, bs=4, h=1024, k=1, experts_per_rank=2,
        dispatch_quant="int8", combine_quant="int8", routing=U(12)))


def test_case_dir_refuses_shared_experts(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "workload": {
        **BASE, "shared_experts": 1, "shared_expert_ranks": 1}}))
    (tmp_path / "case").mkdir()
    with pytest.raises(InputError) as info:
        load_scenario(path, case_dir_override=tmp_path / "case")
    assert info.value.key == "--case-dir" and "no shared experts" in str(info.value)


# --------------------------------------------------------------------------- the shipped example
def test_shipped_scenario_runs_from_the_cli(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    sc = load_scenario(SHIPPED)
    s = sc.workload.shape
    assert s.S >= 1 and s.S_r >= 1
    out = tmp_path / "o"
    assert main(["run", str(SHIPPED), "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert [op["op"] for op in rep["ops"]] == ["dispatch", "combine"]
    assert rep["scenario"]["workload"]["shared_expert_ranks"] == s.S_r
    md = (out / "report.md").read_text()
    assert f"S={s.S} on ranks 0..{s.S_r - 1}" in md
    assert "| 0 (shared) |" in md
    for op in rep["ops"]:  # every rank, the shared ones too, has its phases
        assert [row["rank"] for row in op["ranks"]] == list(range(s.W))
        for row in op["ranks"]:
            assert set(row["phases"]) == set(op["phases"]), (op["op"], row["rank"])
