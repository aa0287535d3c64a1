"""Family deepep: every kernel's outputs against the numpy reference (written from DeepEP's
semantics, npusim/kernels/deepep/reference.py), the test script's own combine check, and the
one-line refusals. Small shapes only."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.family import FAMILY
from npusim.scenario import load_scenario
from npusim.sim import simulate
from tests.kernels.deepep.deepephelp import bf16, refused, sizes, write_scenario

SMALL = {"bs": 16, "h": 1024, "k": 4, "ep_world_size": 4, "experts_per_rank": 4}


def _scenario(tmp: Path, hardware: str = "atlas_a3", name: str = "d", **workload: Any):
    return load_scenario(write_scenario(tmp, SMALL, hardware, name, 3, **workload))


def _run(tmp: Path, inputs: Any = None, **workload: Any):
    sc = _scenario(tmp, **workload)
    if inputs is None:
        return sc, simulate(sc)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        return sc, simulate(sc)


def _inputs(sc) -> list[dict[str, np.ndarray]]:
    w = sc.workload
    return FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 3}, True)


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_outputs_match_reference(tmp_path: Path, quant: str) -> None:
    sc = _scenario(tmp_path, quant=quant)
    inputs = _inputs(sc)
    _, res = _run(tmp_path, quant=quant)
    s = sizes(sc)
    lay, note, disp, comb = (r.outputs for r in res.ops)
    want_lay = [ref.layout(a["topk_idx"], s) for a in inputs]
    want_note = ref.notify([o["num_tokens_per_expert"] for o in want_lay], [16] * 4, s)
    want_disp = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs], s, quant)
    for r in range(4):
        for name, want in want_lay[r].items():
            assert np.array_equal(lay[r][name], want), (r, name)
        for name, want in want_note[r].items():
            assert np.array_equal(note[r][name].reshape(-1), want.reshape(-1)), (r, name)
        n = want_disp[r]["recv_x"].shape[0]
        assert n == int(note[r]["total_recv_token"][0])
        got = disp[r]["recv_x"][:n]
        assert got.tobytes() == want_disp[r]["recv_x"].tobytes(), r
        assert np.array_equal(disp[r]["expand_idx"][:3 * n], want_disp[r]["expand_idx"])
        if quant == "int8":
            want_s = want_disp[r]["dynamic_scales"]
            assert disp[r]["dynamic_scales"][:n].tobytes() == want_s.tobytes()
        # num_recv_tokens_per_expert_list (MOE_EXPERT_TOKEN_NUMS_TYPE 1): the test script's
        # gbl_num_tokens_per_expert.view(W, -1)[rank], counted from every rank's topk_idx
        per_expert = np.zeros(s.E, np.int64)
        for a in inputs:
            np.add.at(per_expert, a["topk_idx"].reshape(-1), 1)
        got_list = note[r]["recv_tokens_per_expert"].reshape(s.round, s.L).sum(axis=0)
        assert got_list.tolist() == per_expert.reshape(4, -1)[r].tolist()
    rows = []
    for d in want_disp:
        if quant == "int8":
            rows.append((d["recv_x"].astype(np.float32) * d["dynamic_scales"][:, None]).astype(
                bf16()))
        else:
            rows.append(d["recv_x"])
    want_x = ref.combine(rows, [d["expand_idx"] for d in want_disp],
                         [a["topk_idx"] for a in inputs], [a["topk_weights"] for a in inputs], s.E)
    for r in range(4):
        assert comb[r]["combined_x"].tobytes() == want_x[r].tobytes(), r


@pytest.mark.parametrize("kw", [{}, {"bs": 80, "long_seq_round": 3, "per_round_tokens": 32}],
                         ids=["one_round", "multi_round"])
def test_token_index_survives_dispatch_combine(tmp_path: Path, kw: dict[str, Any]) -> None:
    """test_low_latency.py's check: x[:, -128:] = token index; with weights 1/K the K returned
    copies sum back to it exactly (also through the multi-round combine's three rounds)."""
    sc = _scenario(tmp_path, **kw)
    bs = sc.workload.shape.BS
    inputs = _inputs(sc)
    for a in inputs:
        a["x"][:, -128:] = np.arange(bs, dtype=np.float32)[:, None].astype(a["x"].dtype)
        a["topk_weights"][:] = np.float32(0.25)
    _, res = _run(tmp_path, inputs=inputs, **kw)
    for out in res.ops[-1].outputs:
        tail = out["combined_x"][:, -128:].astype(np.float32)
        assert np.array_equal(tail, np.repeat(np.arange(bs, dtype=np.float32)[:, None], 128, 1))


def test_rounds_dispatch_matches_reference(tmp_path: Path) -> None:
    """Two long-sequence rounds of 32 tokens: the round flags, per-round offsets."""
    kw = {"op": "dispatch", "bs": 48, "long_seq_round": 2, "per_round_tokens": 32}
    sc = _scenario(tmp_path, **kw)
    inputs = _inputs(sc)
    _, res = _run(tmp_path, **kw)
    s = sizes(sc)
    want = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs], s, "bf16")
    for r, out in enumerate(res.ops[-1].outputs):
        n = want[r]["recv_x"].shape[0]
        assert out["recv_x"][:n].tobytes() == want[r]["recv_x"].tobytes()
        assert np.array_equal(out["expand_idx"][:3 * n], want[r]["expand_idx"])


def _want_combined(sc, inputs: list[dict[str, np.ndarray]], quant: str) -> list[np.ndarray]:
    """combined_x from the reference's dispatch: rows dequantised as per_token_cast_back."""
    s = sizes(sc)
    disp = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs], s, quant)
    rows = [(d["recv_x"].astype(np.float32) * d["dynamic_scales"][:, None]).astype(bf16())
            if quant == "int8" else d["recv_x"] for d in disp]
    return ref.combine(rows, [d["expand_idx"] for d in disp], [a["topk_idx"] for a in inputs],
                       [a["topk_weights"] for a in inputs], s.E)


@pytest.mark.parametrize(("hardware", "quant"), [("atlas_a3", "bf16"), ("atlas_a2", "int8")])
def test_multi_round_combine_matches_reference(tmp_path: Path, hardware: str,
                                               quant: str) -> None:
    """cam_moe_combine_normal_multi_round.h: 80 tokens in rounds of 32 (32, 32, 16), fewer
    per round than cores, so some cores sit out every round; x byte for byte."""
    kw = {"bs": 80, "long_seq_round": 3, "per_round_tokens": 32, "quant": quant}
    sc = _scenario(tmp_path, hardware=hardware, **kw)
    w = sc.workload
    t = w.family.tiling(w.shape, w.options, sc.hardware)
    # the host tiling's key: 10000 + 1 (maxRound > 1) + 3000 on the A3
    assert t.combine_tiling_key == (13001 if hardware == "atlas_a3" else 10001)
    inputs = _inputs(sc)
    _, res = _run(tmp_path, hardware=hardware, **kw)
    comb = res.ops[-1]
    flags = [s for s in comb.spans if s.name == "round_sync"]
    for rank in range(4):  # ceil(80 / 32) = 3 rounds, each closed by the round flags
        assert len([s for s in flags if s.rank == rank and s.core == 0]) == 3
    for r, want in enumerate(_want_combined(sc, inputs, quant)):
        assert comb.outputs[r]["combined_x"].tobytes() == want.tobytes(), r


def test_multi_round_kernel_with_one_round(tmp_path: Path) -> None:
    """long_seq_round 2 selects the multi-round kernel even when the 16 tokens fit one round:
    its expert-block send split, no round flags; x byte for byte."""
    kw = {"long_seq_round": 2, "per_round_tokens": 32}
    sc = _scenario(tmp_path, **kw)
    inputs = _inputs(sc)
    _, res = _run(tmp_path, **kw)
    comb = res.ops[-1]
    assert not [s for s in comb.spans if s.name == "round_sync"]
    for r, want in enumerate(_want_combined(sc, inputs, "bf16")):
        assert comb.outputs[r]["combined_x"].tobytes() == want.tobytes(), r


def test_report_speaks_deepep(tmp_path: Path) -> None:
    sc, res = _run(tmp_path)
    d = next(r for r in res.ops if r.op == "dispatch")
    f = d.family_fields
    inputs = _inputs(sc)
    want = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs], sizes(sc),
                        "bf16")
    rows = [w["recv_x"].shape[0] for w in want]
    assert f["recv_x_rows"] == rows
    assert f["intranode_bytes"] == [n * 2 * 1024 for n in rows]
    ns = d.end_ns - d.start_ns
    assert f["kernel_bandwidth_gbps"] == pytest.approx(rows[0] * 2048 / ns, abs=0.01)
    # test_intranode's figure: buffer.dispatch, notify_dispatch and the dispatch kernel
    note = next(r for r in res.ops if r.op == "notify_dispatch")
    ns += note.end_ns - note.start_ns
    assert f["bottleneck_bandwidth_gbps"] == pytest.approx(rows[0] * 2048 / ns, abs=0.01)
    assert f["low_latency_bytes"] == 16 * 4 * 2 * 1024


def _refused(tmp: Path, **workload: Any) -> str:
    return refused(_scenario, tmp, **workload)


def test_refusals(tmp_path: Path) -> None:
    assert "please use int8 or bf16" in _refused(tmp_path, quant="mx_fp8_e4m3")
    assert "configured capacity (64)" in _refused(tmp_path, op="dispatch", bs=65,
                                                  long_seq_round=2, per_round_tokens=32)
    # DeepEP's own formula by hand: H 1024 -> comb 2048, disp Align512(2048 + 44) = 2560;
    # (16 * 4 * (2048 + 2560) + 4 MiB + 102 MiB) * 2 = 212.56 MiB -> 213 MB needed
    msg = _refused(tmp_path, hccl_buffsize=200)
    assert "NEEDED_HCCL_BUFFSIZE" in msg and "= 213MB" in msg and "HCCL_BUFFSIZE" in msg
    assert "no SHMEM" in _refused(tmp_path, hardware="atlas_a2", context="shmem")
    assert "belongs to the normal mode" in _refused(tmp_path, mode="low_latency", op="layout")


def test_combine_alone_runs_on_the_reference_dispatch(tmp_path: Path) -> None:
    _, both = _run(tmp_path)
    _, alone = _run(tmp_path, op="combine")
    for x, y in zip(both.ops[-1].outputs, alone.ops[-1].outputs, strict=True):
        assert x["combined_x"].tobytes() == y["combined_x"].tobytes()


def test_two_workers_give_the_same_run(tmp_path: Path) -> None:
    """--workers 2 forks notify_dispatch on the reference layout: outputs and times agree."""
    sc = _scenario(tmp_path, quant="int8")
    one, two = simulate(sc, workers=1), simulate(sc, workers=2)
    for a, b in zip(one.ops, two.ops, strict=True):
        assert (a.op, a.start_ns, a.end_ns) == (b.op, b.start_ns, b.end_ns)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert all(x[n].tobytes() == y[n].tobytes() for n in x)


def test_the_workload_runs_the_mode_its_options_pick(tmp_path: Path) -> None:
    """workload.mode picks the kernels (normal: the four; low_latency: the V2 pair), and
    `workload.kernel: deepep` names them together, with every mode's kernels."""
    normal = _scenario(tmp_path, name="n").workload
    low = _scenario(tmp_path, name="l", mode="low_latency").workload
    assert [k.name for k in normal.family.kernels_of("dispatch_combine", normal.options)] == [
        "dispatch_layout", "notify_dispatch", "dispatch", "combine"]
    assert [k.name for k in low.family.kernels_of("dispatch_combine", low.options)] == [
        "low_latency_dispatch", "low_latency_combine"]
    names = {k.name for k in FAMILY.ops}
    assert {k.name for m in FAMILY.modes.values() for k in m.ops} == names
    assert FAMILY.mode({"mode": "low_latency", "comm_alg": "hierarchy"}).runs["dispatch"] == (
        "low_latency_dispatch_layered",)
