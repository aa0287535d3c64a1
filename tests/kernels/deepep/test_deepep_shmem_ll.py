"""Family deepep, low-latency mode with context shmem (the shmem_ver branch's
ShmemMoeDistributeDispatchV2 / CombineV2): every output byte for byte against a numpy
reference written here from the V2 pair's meaning (loops over pairs, not the package's
reference), the same outputs as the HCCL kernels, the timing-only run, the metadata block's
offsets by hand and the one-line refusals. Small shapes only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim.kernels.deepep.family import FAMILY
from npusim.kernels.deepep.shmem_ll_window import ShmemLLWindow
from npusim.kernels.mc2.window import mc2_window
from npusim.scenario import load_scenario
from npusim.sim import simulate
from tests.kernels.deepep.deepephelp import bf16, refused, write_scenario

KiB, MiB = 1024, 1024 * 1024
SEED = 5


def _scenario(tmp: Path, name: str = "s", hardware: str = "atlas_a3", overrides: Any = None,
              **workload: Any):
    base = {"mode": "low_latency", "context": "shmem", "bs": 16, "h": 1024, "k": 4,
            "ep_world_size": 4, "experts_per_rank": 4}
    return load_scenario(write_scenario(tmp, base, hardware, name, SEED, overrides or None,
                                        **workload))


def _inputs(sc) -> list[dict[str, np.ndarray]]:
    w = sc.workload
    return FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": SEED},
                              True)


def _run(sc, inputs: list[dict[str, np.ndarray]]):
    from unittest import mock
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        return simulate(sc, keep_inputs=True)


# ---- the reference: the V2 pair's meaning, pair by pair
def ref_quant(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """QuantProcess (no epsilon here, unlike the normal mode): d = 127 / max|x| in fp32,
    int8(rint(x d)) (int32 -> half -> int8 is exact for |q| <= 127), the scale 1 / d."""
    f = x.astype(np.float32)
    d = np.float32(127.0) / np.abs(f).max()
    q = np.rint(f * d).astype(np.int32).astype(np.int8)
    return q, np.float32(np.float32(1.0) / d)


def ref_dispatch(inputs: list[dict[str, np.ndarray]], W: int, L: int, quant: str
                 ) -> list[dict[str, Any]]:
    """Rank q's received rows: local expert, then source, then the source's pairs in
    (token, k) order; the triple (source, token, k); ep_recv_count the inclusive count
    over (local expert, source); expert_token_nums per local expert."""
    out = []
    for q in range(W):
        rows, scales, triples, counts = [], [], [], []
        for le in range(L):
            for s in range(W):
                ids = inputs[s]["topk_idx"]
                for t in range(ids.shape[0]):
                    for k in range(ids.shape[1]):
                        if int(ids[t, k]) != q * L + le:
                            continue
                        x = inputs[s]["x"][t]
                        if quant == "int8":
                            r, sc = ref_quant(x)
                            rows.append(r)
                            scales.append(sc)
                        else:
                            rows.append(x)
                        triples.append((s, t, k))
                counts.append(len(triples))
        per_le = np.diff(np.array([0] + counts[W - 1::W]))
        out.append({"rows": rows, "scales": np.array(scales, np.float32),
                    "triples": np.array(triples, np.int32).reshape(-1, 3),
                    "layout_range": np.array(counts, np.int32),
                    "packed_recv_count": per_le.astype(np.int64)})
    return out


def ref_combine(inputs: list[dict[str, np.ndarray]], xs: list[np.ndarray],
                disp: list[dict[str, Any]], L: int) -> list[np.ndarray]:
    """combined_x[t] = bf16_rint(sum over k in order of fp32(w[t, k]) * fp32(row)), the row
    the expert's rank q holds for (r, t, k) in its combine input x."""
    where = [{tuple(int(v) for v in tr): i for i, tr in enumerate(d["triples"])} for d in disp]
    out = []
    for r, a in enumerate(inputs):
        ids, w = a["topk_idx"], a["topk_weights"]
        got = np.zeros(a["x"].shape, bf16())
        for t in range(ids.shape[0]):
            acc = np.zeros(a["x"].shape[1], np.float32)
            for k in range(ids.shape[1]):
                q = int(ids[t, k]) // L
                row = xs[q][where[q][(r, t, k)]].astype(np.float32)
                acc = acc + row * np.float32(w[t, k])
            got[t] = acc.astype(bf16())
        out.append(got)
    return out


@pytest.mark.parametrize(("quant", "W", "bs", "L"), [("bf16", 4, 16, 4), ("int8", 4, 16, 4),
                                                     ("int8", 8, 32, 2)])
def test_outputs_match_the_reference(tmp_path: Path, quant: str, W: int, bs: int, L: int
                                     ) -> None:
    sc = _scenario(tmp_path, quant=quant, ep_world_size=W, bs=bs, experts_per_rank=L)
    inputs = _inputs(sc)
    res = _run(sc, inputs)
    assert [o.op for o in res.ops] == ["shmem_moe_distribute_dispatch_v2",
                                       "shmem_moe_distribute_combine_v2"]
    disp, comb = (o.outputs for o in res.ops)
    want = ref_dispatch(inputs, W, L, quant)
    for r in range(W):
        d, wd = disp[r], want[r]
        n = len(wd["rows"])
        rows = d["packed_recv_x"]
        assert rows[:n].tobytes() == np.stack(wd["rows"]).tobytes(), r
        assert not rows[n:].any(), r
        if quant == "int8":
            assert d["packed_recv_x_scales"][:n].tobytes() == wd["scales"].tobytes(), r
        assert np.array_equal(d["src_info"].reshape(-1, 3)[:n], wd["triples"]), r
        assert np.array_equal(d["layout_range"], wd["layout_range"]), r
        assert np.array_equal(d["packed_recv_count"], wd["packed_recv_count"]), r
    xs = [a["x"] for a in res.ops[1].inputs]  # the combine's expert rows as it read them
    for r, want_x in enumerate(ref_combine(inputs, xs, want, L)):
        assert comb[r]["combined_x"].tobytes() == want_x.tobytes(), r


def test_same_outputs_as_the_hccl_kernels(tmp_path: Path) -> None:
    """The SHMEM pair moves the same bytes to other addresses: every output, the combined
    rows included, is the HCCL pair's."""
    sc = _scenario(tmp_path, quant="int8")
    inputs = _inputs(sc)
    shmem = _run(sc, inputs)
    hccl = _run(_scenario(tmp_path, name="h", quant="int8", context="hccl"), inputs)
    for a, b in zip(shmem.ops, hccl.ops, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert x.keys() == y.keys()
            for key in x:
                assert x[key].tobytes() == y[key].tobytes(), key


def test_timing_only_takes_the_same_time(tmp_path: Path) -> None:
    slow = simulate(_scenario(tmp_path, quant="int8"))
    fast = simulate(_scenario(tmp_path, name="t", quant="int8", timing_only=True))
    for a, b in zip(slow.ops, fast.ops, strict=True):
        assert (a.op, a.end_ns - a.start_ns) == (b.op, b.end_ns - b.start_ns)


def test_combine_alone_finds_the_state_the_dispatch_left(tmp_path: Path) -> None:
    """The combine's data state is the shared word the dispatch flipped (1): alone, on the
    reference's dispatch, it reads the same rows from the same data half."""
    sc = _scenario(tmp_path, quant="int8")
    inputs = _inputs(sc)
    both = _run(sc, inputs)
    alone = _run(_scenario(tmp_path, name="c", quant="int8", op="combine"), inputs)
    assert [o.op for o in alone.ops] == ["shmem_moe_distribute_combine_v2"]
    state = alone.ops[0].inputs[0]["shmem_state"]
    assert state.shape == (48, 128) and (state[:, 0] == 1).all() and not state[:, 1:].any()
    for x, y in zip(both.ops[-1].outputs, alone.ops[-1].outputs, strict=True):
        assert x["combined_x"].tobytes() == y["combined_x"].tobytes()


def test_the_metadata_block_offsets() -> None:
    """By hand, W 4, L 4, maxBs 16, H 1024, K 4, INT8: the dispatch slot is
    Align512(Align32(1024 + 4) + 12) = 1536 B, the combine's Align512(2048) = 2048 B."""
    win = ShmemLLWindow.of(mc2_window(16, 1024, 4, 4, 4, 0, "int8", "arch22", 8, 48,
                                      default=True))
    assert win.dispatch.slot == 1536 and win.combine_slot == 2048
    assert win.dispatch_state_word(3) == win.combine_state_word(3) == 3 * 512
    assert win.dispatch_status(0, 5) == 950 * KiB + 5 * 32
    assert win.dispatch_status(1, 5) == 1450 * KiB + 5 * 32
    assert win.dispatch_slot_offset(0, 6, 2) == 950 * KiB + MiB + 6 * 16 * 1536 + 2 * 1536
    assert win.combine_flag(1, 3, 2) == 1539 * KiB + 14 * 32
    assert win.combine_slot_offset(1, 3, 2) == 1539 * KiB + MiB + 2000 * MiB + 14 * 2048
    assert win.combine_slot_offset(0, 0, 0) == 1039 * KiB + MiB
    z = win.regions()
    assert z["combine_data"] == (2563 * KiB + 2000 * MiB, 2563 * KiB + 2000 * MiB
                                 + 16 * 4 * 2048)
    assert z["dispatch_data"] == (1974 * KiB, 1974 * KiB + 16 * 16 * 1536)
    assert win.overlap() is None


def _refused(tmp: Path, **workload: Any) -> str:
    return refused(_scenario, tmp, **workload)


def test_refusals(tmp_path: Path) -> None:
    assert "[1, 512]" in _refused(tmp_path, bs=513)
    msg = _refused(tmp_path, bs=16, h=7168, k=8, ep_world_size=8, experts_per_rank=64,
                   num_max_dispatch_tokens_per_rank=512)
    assert "Shmem_Buff is too SMALL" in msg and "4000 MB" in msg
    assert "allowed: hccl" in _refused(tmp_path, hardware="atlas_a2")
    assert "fullmesh_v1" in _refused(tmp_path, comm_alg="hierarchy")
    assert "belongs to the normal mode" in _refused(tmp_path, op="layout")
    msg = _refused(tmp_path, num_max_dispatch_tokens_per_rank=8)
    assert "EP_HOST_ASSERT" in msg


def test_the_family_maps_deepeps_heap(tmp_path: Path) -> None:
    """The combine's data sits 2000 MiB into the heap: at the preset's 1 GiB window the
    pair still runs, in the 8 GiB deep_ep.cpp maps per PE (local_mem_size)."""
    sc = _scenario(tmp_path)
    assert sc.hardware.window.bytes == 1 << 30
    w = sc.workload
    assert w.family.window_bytes(sc.tiling, sc.hardware) == 8 << 30
    assert sc.tiling.window.end > 2000 * MiB
