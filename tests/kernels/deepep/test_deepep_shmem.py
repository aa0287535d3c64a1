"""Family deepep, normal mode with context shmem (the shmem_ver kernels): every output byte
for byte against a numpy reference written here from the kernels' semantics (loops over
pairs, not the package's reference), the timing-only run, the heap layout and the
one-line refusals. Small shapes only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim.kernels.deepep.family import FAMILY
from npusim.kernels.deepep.shmem_layout import META_DATA_SIZE, ShmemHeap, pe_stride
from npusim.scenario import load_scenario
from npusim.sim import simulate
from tests.kernels.deepep.deepephelp import bf16, refused, write_scenario

W, BS, K = 4, 64, 8
BASE = {"bs": BS, "h": 1024, "k": K, "ep_world_size": W, "context": "shmem"}
SEED = 5


def _scenario(tmp: Path, name: str = "s", hardware: str = "atlas_a3", **workload: Any):
    return load_scenario(write_scenario(tmp, {**BASE, "experts_per_rank": 4}, hardware, name,
                                        SEED, **workload))


def _inputs(sc) -> list[dict[str, np.ndarray]]:
    w = sc.workload
    return FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": SEED},
                              True)


# ---- the reference: each kernel's meaning, pair by pair
def ref_layout(topk: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray]:
    """num_tokens_per_expert, and send_token_idx_small: the pairs of this rank before (t, k)
    in token-major order that go to the same expert."""
    counts = np.zeros(E, np.int32)
    idx = np.zeros(topk.shape, np.int32)
    for t in range(topk.shape[0]):
        for k in range(topk.shape[1]):
            e = int(topk[t, k])
            idx[t, k] = counts[e]
            counts[e] += 1
    return counts, idx


def ref_put_offset(cnt: np.ndarray) -> np.ndarray:
    """put_offset[q E + le W + s]: rows on rank q before source s's first row for expert
    q L + le, rows ordered by local expert then source."""
    w, e = cnt.shape
    L = e // w
    out = np.zeros(w * e, np.int32)
    for q in range(w):
        row = 0
        for le in range(L):
            for s in range(w):
                out[q * e + le * w + s] = row
                row += cnt[s, q * L + le]
    return out


def ref_quant(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """QuantProcess: scale = 127 / (max|x| + 1e-12) in fp32; rint, then int32 -> half ->
    int8 (exact: |q| <= 127); the stored scale is its reciprocal."""
    f = x.astype(np.float32)
    scale = np.float32(127.0) / np.float32(np.abs(f).max() + np.float32(1e-12))
    q = np.rint(f * scale).astype(np.int32).astype(np.float16).astype(np.int8)
    return q, np.float32(np.float32(1.0) / scale)


def reference(inputs: list[dict[str, np.ndarray]], E: int, quant: str, rows: int
              ) -> dict[str, Any]:
    L, H = E // W, inputs[0]["x"].shape[1]
    lay = [ref_layout(a["topk_idx"], E) for a in inputs]
    cnt = np.stack([c for c, _ in lay])
    put = ref_put_offset(cnt)
    out_dt = np.int8 if quant == "int8" else inputs[0]["x"].dtype
    expand = [np.zeros((rows, H), out_dt) for _ in range(W)]
    scales = [np.zeros(rows, np.float32) for _ in range(W)]
    for s, a in enumerate(inputs):
        for t in range(BS):
            for k in range(K):
                e = int(a["topk_idx"][t, k])
                q, row = e // L, put[e * W + s] + lay[s][1][t, k]
                if quant == "int8":
                    expand[q][row], scales[q][row] = ref_quant(a["x"][t])
                else:
                    expand[q][row] = a["x"][t]
    back = [(expand[q].astype(np.float32) * scales[q][:, None]).astype(bf16())
            if quant == "int8" else expand[q] for q in range(W)]
    combined = []
    for s, a in enumerate(inputs):
        out = np.zeros((BS, H), bf16())
        for t in range(BS):
            acc = np.zeros(H, np.float32)
            for k in range(K):
                e = int(a["topk_idx"][t, k])
                row = put[e * W + s] + lay[s][1][t, k]
                acc = acc + back[e // L][row].astype(np.float32) * a["topk_weights"][t, k]
            out[t] = acc.astype(bf16())
        combined.append(out)
    per_dst = [cnt[:, q * L:(q + 1) * L].sum() for q in range(W)]
    return {"cnt": cnt, "put": put, "expand": expand, "scales": scales, "combined": combined,
            "total": max(per_dst), "max_bs": int(cnt.sum(axis=1).max()) // K,
            "per_expert": [cnt[:, q * L:(q + 1) * L].sum(axis=0) for q in range(W)]}


@pytest.mark.parametrize(("quant", "experts_per_rank"), [("bf16", 4), ("int8", 8)])
def test_outputs_match_the_reference(tmp_path: Path, quant: str, experts_per_rank: int
                                     ) -> None:
    sc = _scenario(tmp_path, quant=quant, experts_per_rank=experts_per_rank)
    assert [r for r in sc.workload.family.runs["dispatch_combine"]] == [
        "dispatch_layout", "shmem_notify_dispatch", "shmem_moe_dispatch_normal",
        "shmem_moe_combine_normal"]
    inputs = _inputs(sc)
    E = W * experts_per_rank
    L = experts_per_rank
    cnt = np.stack([ref_layout(a["topk_idx"], E)[0] for a in inputs])
    # deep_ep.cpp allocates the symmetric rows for num_recv_tokens: the busiest rank's
    rows = max(int(cnt[:, q * L:(q + 1) * L].sum()) for q in range(W))
    assert rows < sc.workload.shape.A
    want = reference(inputs, E, quant, rows)
    res = simulate(sc, workers=1)
    lay, note, disp, comb = (r.outputs for r in res.ops)
    for r in range(W):
        assert np.array_equal(lay[r]["num_tokens_per_expert"].reshape(-1), want["cnt"][r])
        assert np.array_equal(note[r]["recv_data"], want["cnt"])
        assert np.array_equal(note[r]["put_offset"], want["put"])
        assert int(note[r]["total_recv_tokens"][0]) == want["total"]
        assert int(note[r]["max_bs"][0]) == want["max_bs"]
        assert np.array_equal(note[r]["recv_tokens_per_expert"], want["per_expert"][r])
        assert disp[r]["expand_x"].tobytes() == want["expand"][r].tobytes(), r
        if quant == "int8":
            assert disp[r]["dynamic_scales"].tobytes() == want["scales"][r].tobytes(), r
        assert comb[r]["combined_x"].tobytes() == want["combined"][r].tobytes(), r


def test_same_combined_x_as_the_hccl_kernels(tmp_path: Path) -> None:
    """Different programs, one meaning: the HCCL and the SHMEM normal kernels return the
    same bytes (both sum the K rows in fp32 in k order)."""
    a = simulate(_scenario(tmp_path, name="h", context="hccl", bs=16), workers=1)
    b = simulate(_scenario(tmp_path, name="s", bs=16), workers=1)
    assert [r.op for r in b.ops][1:] == ["shmem_notify_dispatch", "shmem_moe_dispatch_normal",
                                         "shmem_moe_combine_normal"]
    for x, y in zip(a.ops[-1].outputs, b.ops[-1].outputs, strict=True):
        assert x["combined_x"].tobytes() == y["combined_x"].tobytes()


def test_timing_only_takes_the_same_time(tmp_path: Path) -> None:
    full = simulate(_scenario(tmp_path, name="f", quant="int8", bs=16), workers=1)
    fast = simulate(_scenario(tmp_path, name="t", quant="int8", bs=16, timing_only=True),
                    workers=1)
    for a, b in zip(full.ops, fast.ops, strict=True):
        assert (a.op, a.start_ns, a.end_ns) == (b.op, b.start_ns, b.end_ns)


def test_the_heap_layout() -> None:
    """deep_ep.cpp's 100 MiB metadata first, the tensors after it 512 B aligned; the PE
    stride hicann/shmem derives from the 8 GiB heap is 8 GiB (1 GiB is the granule)."""
    sc = load_scenario(write_scenario(Path("/tmp"), {**BASE, "experts_per_rank": 4},
                                      "atlas_a3", "heap", SEED, quant="int8"))
    w = sc.workload
    heap = ShmemHeap(w.family.tiling(w.shape, w.options, sc.hardware))
    A = W * BS * min(K, 4)  # rows one rank can receive (E 16, L 4)
    assert heap.num_tokens_per_expert == META_DATA_SIZE == 100 << 20
    assert heap.recv_data == META_DATA_SIZE + 512  # E 4 = 64 B, aligned up
    assert heap.expand_x == heap.recv_data + 512  # W E 4 = 256 B
    assert heap.dynamic_scales == heap.expand_x + A * 1024  # int8 rows of H
    assert heap.combine_x == heap.dynamic_scales + A * 4
    assert heap.sync_pool == heap.combine_x + A * 2048
    assert pe_stride() == 8 << 30 and pe_stride((8 << 30) + (2 << 20)) == 9 << 30


def test_the_heap_is_sized_by_the_routing(tmp_path: Path) -> None:
    """EP 16 at 4096 tokens (H 7168, top-8, 16 experts a rank, INT8): a rank could receive
    16 4096 8 rows, whose INT8 rows and bf16 recv_x (7168 + 4 + 14336 B a row) would
    need 10.5 GiB; deep_ep.cpp allocates the busiest rank's rows, which a uniform routing
    keeps near 4096 8, so the call fits the 8 GiB heap at the preset's 1 GiB window."""
    sc = _scenario(tmp_path, bs=4096, h=7168, ep_world_size=16, experts_per_rank=16,
                   quant="int8", timing_only=True)
    t = sc.tiling
    assert sc.workload.shape.A == 16 * 4096 * 8
    ids = FAMILY.make_inputs(sc.workload.shape, sc.workload.options, "dispatch_combine",
                             {"routing": "uniform", "seed": SEED}, False)
    per_rank = np.zeros(16, np.int64)
    for a in ids:
        np.add.at(per_rank, a["topk_idx"].ravel() // 16, 1)
    assert t.rows_capacity == per_rank.max() < 4096 * 8 * 1.1
    assert ShmemHeap(t).end < 8 << 30
    assert sc.workload.family.window_bytes(t, sc.hardware) == 8 << 30


def _refused(tmp: Path, **workload: Any) -> str:
    return refused(_scenario, tmp, **workload)


def test_refusals(tmp_path: Path) -> None:
    assert "no SHMEM" in _refused(tmp_path, hardware="atlas_a2")
    # the strides of dispatch (Align32(H item)) and combine (2H) agree: H is a multiple of 32
    assert "multiple of 32" in _refused(tmp_path, h=1040, quant="int8")
    assert "[1024, 7168]" in _refused(tmp_path, h=7200)
    assert "allowed: 1" in _refused(tmp_path, long_seq_round=2, per_round_tokens=32)
    assert "top-k" in _refused(tmp_path, experts_per_rank=1)  # K 8 > E 4
    # 384 ranks x 65536 tokens x top-1: a rank may receive 2^24 + 2^24 / 2 rows, past fp32
    msg = _refused(tmp_path, ep_world_size=384, experts_per_rank=1, bs=65536, k=1)
    assert "ReduceSum" in msg and "workload.bs" in msg
    # R E 4 of counts in UB: 384 ranks of 1 expert need 576 KiB in the notify's builders
    msg = _refused(tmp_path, ep_world_size=384, experts_per_rank=1, bs=1, k=1, op="dispatch")
    assert "UB" in msg and "workload.experts_per_rank" in msg


def test_two_workers_give_the_same_run(tmp_path: Path) -> None:
    """--workers 2 runs the later kernels on the reference's notify and dispatch: the same
    outputs and times as one worker."""
    sc = _scenario(tmp_path, quant="int8", bs=16)
    one, two = simulate(sc, workers=1), simulate(sc, workers=2)
    for a, b in zip(one.ops, two.ops, strict=True):
        assert (a.op, a.start_ns, a.end_ns) == (b.op, b.start_ns, b.end_ns)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert all(x[n].tobytes() == y[n].tobytes() for n in x)
