"""Family deepep, mode low_latency on two A2 servers (comm_alg hierarchy): the layered
dispatch against mc2's numpy reference of the V2 dispatch (the same rows, scales and counts)
and the family's reference of the combine's reduce info, the RDMA bytes between the servers
by hand, and the one-line refusals. Small shapes only."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from npusim.hw.rdma import wire_bytes
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.family import FAMILY
from npusim.kernels.mc2 import reference as mref
from npusim.scenario import load_scenario
from npusim.sim import Forked, simulate
from tests.kernels.deepep.deepephelp import refused, write_scenario

W, BS, H, K, L = 16, 8, 1024, 4, 2
E = W * L
SMALL = {"mode": "low_latency", "comm_alg": "hierarchy", "op": "dispatch", "bs": BS, "h": H,
         "k": K, "ep_world_size": W, "experts_per_rank": L}
BIG_WINDOW = {"window.bytes": 2 << 30}  # HCCL_BUFFSIZE past the preset's 1 GiB
MTU, HEADER = 4096, 82  # atlas_a2 rdma.mtu_bytes, rdma.header_bytes


def _scenario(tmp: Path, name: str = "lay", overrides: dict | None = None, **workload: Any):
    return load_scenario(write_scenario(tmp, SMALL, "atlas_a2", name, 3,
                                        BIG_WINDOW if overrides is None else overrides,
                                        **workload))


def _run(sc):
    w = sc.workload
    inputs = FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 3},
                                True)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        return inputs, simulate(sc)


def _struct_len(quant: str) -> int:
    """| flag 32 B | token | expert ids Align8(K) x 4 B | scale 32 B |"""
    token = H if quant == "int8" else 2 * H
    return 32 + token + -(-K // 8) * 8 * 4 + 32


@pytest.mark.parametrize("quant", ["int8", "bf16"])
def test_layered_dispatch_matches_reference(tmp_path: Path, quant: str) -> None:
    sc = _scenario(tmp_path, quant=quant)
    _assert_dispatch_matches(sc, *_run(sc), quant, BS)


def test_int8_tokens_load_into_their_structs_buffer(tmp_path: Path) -> None:
    """Quantising, ReorderTokens loads a core's tokens into the structs' own buffer, a slot of
    max(struct, 2H) each, and casts them to fp32 beside it: 32 tokens per core (BS 256 over
    8 AIV) go 30 at a time, (190 KiB - 8 KiB - the int16 ids) // (2H + 4H), in the 192 KiB
    UB, where a bf16 buffer of their own beside the structs would overflow it."""
    bs, cores = 256, 8
    rec = _struct_len("int8")
    per_ub = (190 * 1024 - 8 * 1024 - bs * K * 2) // (2 * H + 4 * H)
    assert per_ub < bs // cores and per_ub * (rec + 2 * H + 4 * H) > 192 * 1024
    sc = _scenario(tmp_path, quant="int8", bs=bs,
                   overrides={**BIG_WINDOW, "chip.aiv_cores": cores})
    _assert_dispatch_matches(sc, *_run(sc), "int8", bs)


def _assert_dispatch_matches(sc, inputs, res, quant: str, bs: int) -> None:
    """The layered dispatch's outputs against mc2's reference of the V2 dispatch and the
    family's reference of the combine's reduce info."""
    assert [r.op for r in res.ops] == ["low_latency_dispatch_layered"]
    got = res.ops[0].outputs
    shape = mref.mc2_shape(W, (bs,) * W, H, K, E)
    ins = [mref.DispatchInputs(a["x"], a["topk_idx"].astype(np.int32)) for a in inputs]
    want = mref.reference_dispatch(shape, ins, "int8" if quant == "int8" else "none", 1)
    idxs = [a["topk_idx"] for a in inputs]
    cores = sc.hardware.chip.aiv_cores
    for r in range(W):
        d, wv = got[r], want[r]
        n = int(wv.ep_recv_count[-1])
        assert d["packed_recv_x"][:n].tobytes() == wv.expand_x[:n].tobytes(), r
        if quant == "int8":
            assert d["packed_recv_x_scales"][:n].tobytes() == wv.dynamic_scales[:n].tobytes()
        assert np.array_equal(d["packed_recv_count"], wv.expert_token_nums), r
        assert np.array_equal(d["layout_range"][:E], wv.ep_recv_count), r
        tail = ref.layered_reduce_info(idxs, r, L, W * bs, cores)
        assert d["layout_range"][E:].tobytes() == tail[E:].tobytes(), r


def test_rdma_bytes_between_the_servers_by_hand(tmp_path: Path) -> None:
    """Each rank writes, per token with an expert in the other server, one struct to its
    same-plane rank there, then a 64 B end flag: a WQE of n bytes puts n + ceil(n / MTU)
    headers on the port."""
    sc = _scenario(tmp_path, quant="int8")
    inputs, res = _run(sc)
    rec = _struct_len("int8")
    egress = {x.rank: x.bytes for x in res.ops[0].links if x.kind == "cluster.egress"}
    for r in range(W):
        other = 1 - r // 8
        ids = inputs[r]["topk_idx"]
        n = int(sum(any(int(e) // (8 * L) == other for e in row) for row in ids))
        assert egress[r] == n * wire_bytes(rec, MTU, HEADER) + wire_bytes(64, MTU, HEADER), r


def test_layered_refusals(tmp_path: Path) -> None:
    def no(**w: Any) -> str:
        return refused(_scenario, tmp_path, **w)

    msg = no(comm_alg="fullmesh")
    assert "workload.comm_alg" in msg and "BatchWrite" in msg and "allowed: hierarchy" in msg
    assert "AICPU side is not public" in msg and "layered kernels across servers" in msg
    msg = no(ep_world_size=8)
    assert "workload.comm_alg" in msg and "allowed here: fullmesh" in msg
    assert "layered combine" not in no(ep_world_size=64, experts_per_rank=1, op="dispatch",
                                       hccl_buffsize=100)
    msg = no(op="layout")
    assert "workload.op" in msg and "allowed with comm_alg hierarchy" in msg
    msg = no(hccl_buffsize=1000)
    assert "The HCCL_BUFFSIZE is 1000MB, the min value should be 1204MB" in msg
    msg = refused(_scenario, tmp_path, overrides={"window.bytes": 1 << 30})
    assert "window.bytes" in msg and "HCCL_BUFFSIZE 1205 MB" in msg
    msg = no(ep_world_size=64, experts_per_rank=1, op="dispatch_combine")
    assert "layered combine" in msg and "allowed: at most 56" in msg
    msg = no(mode="normal", ep_world_size=8)
    assert "workload.comm_alg" in msg and "allowed with mode normal: fullmesh" in msg


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_layered_combine_matches_reference(tmp_path: Path, quant: str) -> None:
    """The experts' outputs are the received rows (the tokens themselves; after an INT8
    dispatch fp32(q) * scale in BF16), so each token comes back as its weighted sum, taken
    server by server; the combine is BF16 either way."""
    sc = _scenario(tmp_path, quant=quant, op="dispatch_combine")
    inputs, res = _run(sc)
    assert [r.op for r in res.ops] == ["low_latency_dispatch_layered",
                                       "low_latency_combine_layered"]
    idxs = [a["topk_idx"] for a in inputs]
    disp = ref.dispatch([a["x"] for a in inputs], idxs, ref.Sizes(W, E, K, 1, BS), quant)
    dt = inputs[0]["x"].dtype
    rows = [(d["recv_x"].astype(np.float32) * d["dynamic_scales"][:, None]).astype(dt)
            if quant == "int8" else d["recv_x"] for d in disp]
    want = ref.layered_combine(rows, [d["expand_idx"] for d in disp],
                               idxs, [a["topk_weights"] for a in inputs], L)
    for r in range(W):
        assert res.ops[1].outputs[r]["combined_x"].tobytes() == want[r].tobytes(), r


def test_int8_token_index_survives_and_combine_alone_runs(tmp_path: Path) -> None:
    """test_low_latency.py's check through the layered pair with an INT8 dispatch: x =
    rank - 128 with the token index in x[:, -128:] comes back as x * sum(weights) within
    DeepEP's calc_diff threshold; the combine alone runs on the references' dispatch and
    gives the pair's bytes."""
    sc = _scenario(tmp_path, quant="int8", op="dispatch_combine")
    w = sc.workload
    inputs = FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 3},
                                True)
    dt = inputs[0]["x"].dtype
    for r, a in enumerate(inputs):
        x = np.full((BS, H), r - 128, np.float32)
        x[:, -128:] = np.arange(BS, dtype=np.float32)[:, None]
        a["x"] = x.astype(dt)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        both = simulate(sc)
        alone = simulate(_scenario(tmp_path, name="alone", quant="int8", op="combine"))
    for r in range(W):
        got = both.ops[1].outputs[r]["combined_x"].astype(np.float64) + 1
        want = (inputs[r]["x"].astype(np.float64)
                * inputs[r]["topk_weights"].sum(axis=1)[:, None]) + 1
        assert 1 - 2 * (got * want).sum() / (got * got + want * want).sum() < 3e-3, r
        assert alone.ops[0].outputs[r]["combined_x"].tobytes() == \
            both.ops[1].outputs[r]["combined_x"].tobytes(), r


def test_layered_combine_simulated_ahead_is_kept(tmp_path: Path) -> None:
    """With two workers the combine runs ahead on the references' dispatch; the simulated
    dispatch writes what the combine reads of it, so the forked run is kept."""
    sc = _scenario(tmp_path, quant="int8", op="dispatch_combine")
    inputs, one = _run(sc)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        two = simulate(sc, workers=2)
    assert two.combine_ahead == ("kept" if Forked.available() else "")
    assert [o["combined_x"].tobytes() for o in one.ops[-1].outputs] == \
        [o["combined_x"].tobytes() for o in two.ops[-1].outputs]


def test_layered_combine_after_int8_dispatch_sends_bf16(tmp_path: Path) -> None:
    """deep_ep.cpp's low_latency_combine passes comm_quant_mode 0, so after an INT8
    dispatch the layered combine (key 3000) still moves BF16 rows: on rank r's port, per
    token of its same-plane rank p in the other server with n > 0 experts in r's server,
    one WRITE of n rows of 2H bytes, then the 32 B status; INT8 rows (H + scales) would be
    about half of that."""
    sc = _scenario(tmp_path, quant="int8", op="dispatch_combine")
    inputs, res = _run(sc)
    assert res.ops[1].op == "low_latency_combine_layered"
    egress = {x.rank: x.bytes for x in res.ops[1].links if x.kind == "cluster.egress"}
    for r in range(W):
        here, p = r // 8, (r + 8) % W
        rows = [sum(int(e) // (8 * L) == here for e in row) for row in inputs[p]["topk_idx"]]
        want = sum(wire_bytes(n * 2 * H, MTU, HEADER) for n in rows if n)
        assert egress[r] == want + wire_bytes(32, MTU, HEADER), r
