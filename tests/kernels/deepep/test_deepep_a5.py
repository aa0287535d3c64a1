"""Family deepep on the Ascend 950 (preset ascend950, DeepEP's A5 kernels): every normal-mode
kernel's outputs against numpy written from the sources' semantics, per quantisation mode
(the goldens of npusim.kernels.quant.golden, independent of the recipes the kernels run),
the test scripts' checks, the A5 window and record layout by hand, the multi-round
combine's row split, and the one-line refusals. Small shapes (EP 2-4, 64-256 tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from npusim.formats import fp8_format
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.family import FAMILY
from npusim.kernels.quant import golden
from npusim.scenario import load_scenario
from npusim.sim import simulate
from npusim.units import KiB, MiB
from tests.kernels.deepep.deepephelp import bf16, refused, sizes, write_scenario

A5 = "ascend950"
SMALL = {"bs": 64, "h": 1024, "k": 4, "ep_world_size": 2, "experts_per_rank": 4}
QUANTS = ("bf16", "int8", "pertoken_fp8_e4m3", "mx_fp8_e4m3", "mx_fp8_e5m2", "mx_fp4_e2m1")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _scenario(tmp: Path, hardware: str = A5, base: dict[str, Any] | None = None,
              **workload: Any):
    return load_scenario(write_scenario(tmp, base or SMALL, hardware, "a5", 5, **workload))


def _inputs(sc) -> list[dict[str, np.ndarray]]:
    w = sc.workload
    return FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 5}, True)


def _run(sc, inputs: Any = None):
    if inputs is None:
        return simulate(sc)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        return simulate(sc)


def _quantised(row: np.ndarray, quant: str) -> tuple[bytes, bytes]:
    """One token as the 950 dispatch sends it, from the schemes' definitions: (recv_x row
    bytes, dynamic_scales bytes)."""
    if quant == "bf16":
        return row.tobytes(), b""
    if quant in ("int8", "pertoken_fp8_e4m3"):
        q, s = golden.pertoken_row(row, "int8" if quant == "int8" else "e4m3")
        return q.tobytes(), np.float32(s).tobytes()
    if quant == "mx_fp4_e2m1":
        q, s = golden.mxfp4_row(row)
        return q.tobytes(), s.tobytes()
    q, s = golden.mx_row(row, quant[-4:], clip=False)
    return q.tobytes(), s[:row.size // 32].tobytes()


def _dequantised(data: bytes, scales: bytes, quant: str, h: int) -> np.ndarray:
    """The test script's per_token_cast_back of one row, in float64 then BF16."""
    if quant == "bf16":
        return np.frombuffer(data, bf16()).copy()
    if quant in ("int8", "pertoken_fp8_e4m3"):
        dt = np.int8 if quant == "int8" else fp8_format("e4m3")[0]
        v = np.frombuffer(data, dt).astype(np.float32) * np.frombuffer(scales, np.float32)[0]
        return v.astype(bf16())
    sc = np.repeat(2.0 ** (np.frombuffer(scales, np.uint8).astype(np.float64) - 127), 32)
    if quant == "mx_fp4_e2m1":
        b = np.frombuffer(data, np.uint8)
        codes = np.stack([b & 15, b >> 4], axis=1).reshape(-1)
        v = np.array([(-1.0 if c & 8 else 1.0) * E2M1[c & 7] for c in codes])
    else:
        v = np.frombuffer(data, fp8_format(quant[-4:])[0]).astype(np.float64)
    return (v * sc[:h]).astype(np.float32).astype(bf16())


def _check_dispatch_combine(sc, inputs, res, quant: str) -> None:
    s = sizes(sc)
    h, W = sc.workload.shape.H, s.W
    lay, note, disp, comb = (r.outputs for r in res.ops)
    triples = ref.source_triples([a["topk_idx"] for a in inputs], s)
    want_lay = [ref.layout(a["topk_idx"], s) for a in inputs]
    bs = [a["topk_idx"].shape[0] for a in inputs]
    want_note = ref.notify([o["num_tokens_per_expert"] for o in want_lay], bs, s)
    per_expert = np.zeros(s.E, np.int64)  # the test script's all-reduced expert counts
    for a in inputs:
        np.add.at(per_expert, a["topk_idx"].reshape(-1), 1)
    back = []
    for r in range(W):
        for name, want in want_lay[r].items():
            assert np.array_equal(lay[r][name], want), (r, name)
        for name, want in want_note[r].items():
            assert np.array_equal(note[r][name].reshape(-1), want.reshape(-1)), (r, name)
        got_list = note[r]["recv_tokens_per_expert"].reshape(s.round, s.L).sum(axis=0)
        assert got_list.tolist() == per_expert.reshape(W, -1)[r].tolist(), r
        n = triples[r].shape[0]
        assert int(note[r]["total_recv_token"][0]) == n
        assert np.array_equal(disp[r]["expand_idx"][:3 * n], triples[r].reshape(-1))
        rows = disp[r]["recv_x"][:n].tobytes()
        scales = disp[r]["dynamic_scales"].tobytes()
        per_row, per_scale = len(rows) // max(n, 1), len(scales) // len(disp[r]["recv_x"])
        got_rows = []
        for i, (src, t, _k) in enumerate(triples[r]):
            data, sc_b = _quantised(inputs[src]["x"][t], quant)
            assert rows[i * per_row:(i + 1) * per_row] == data, (r, i)
            if quant != "bf16":
                assert scales[i * per_scale:(i + 1) * per_scale] == sc_b, (r, i)
            got_rows.append(_dequantised(data, sc_b, quant, h))
        back.append(np.array(got_rows, bf16()).reshape(n, h))
    want_x = ref.combine(back, triples, [a["topk_idx"] for a in inputs],
                         [a["topk_weights"] for a in inputs], s.E)
    for r in range(W):
        assert comb[r]["combined_x"].tobytes() == want_x[r].tobytes(), r


@pytest.mark.parametrize("quant", QUANTS)
def test_outputs_match_reference(tmp_path: Path, quant: str) -> None:
    sc = _scenario(tmp_path, quant=quant)
    inputs = _inputs(sc)
    _check_dispatch_combine(sc, inputs, _run(sc), quant)


@pytest.mark.parametrize("quant", ["int8", "mx_fp8_e4m3"])
def test_ep4_outputs_match_reference(tmp_path: Path, quant: str) -> None:
    base = {**SMALL, "bs": 128, "ep_world_size": 4, "experts_per_rank": 2}
    sc = _scenario(tmp_path, base=base, quant=quant)
    _check_dispatch_combine(sc, _inputs(sc), _run(sc), quant)


def test_token_index_survives_dispatch(tmp_path: Path) -> None:
    """x[:, -128:] = the token index (test_low_latency.py's and
    test_normal_and_low_latency.py's x; test_intranode.py fills x with the rank and leaves
    its check_data commented out): every received row ends with its source token's index
    (its expand_idx), and with weights 1/K the combine gives each token back (EP 4, 256
    tokens, BF16)."""
    base = {**SMALL, "bs": 256, "ep_world_size": 4, "experts_per_rank": 2}
    sc = _scenario(tmp_path, base=base)
    inputs = _inputs(sc)
    for a in inputs:
        a["x"][:, -128:] = np.arange(256, dtype=np.float32)[:, None].astype(bf16())
        a["topk_weights"][:] = np.float32(0.25)
    res = _run(sc, inputs)
    _, note, disp, comb = (r.outputs for r in res.ops)
    for r in range(4):
        n = int(note[r]["total_recv_token"][0])
        tok = disp[r]["expand_idx"][:3 * n].reshape(n, 3)[:, 1]
        tail = disp[r]["recv_x"][:n, -128:].astype(np.float32)
        assert np.array_equal(tail, np.repeat(tok[:, None].astype(np.float32), 128, 1)), r
        back = comb[r]["combined_x"][:, -128:].astype(np.float32)
        assert np.array_equal(back, np.repeat(np.arange(256, dtype=np.float32)[:, None],
                                              128, 1)), r


@pytest.mark.parametrize(("hardware", "enable", "key"),
                         [(A5, 0, 15000), (A5, 1, 15001), ("atlas_a3", 0, 13000),
                          ("atlas_a3", 1, 13001)])
def test_combine_long_seq_needs_the_env_var(tmp_path: Path, hardware: str, enable: int,
                                            key: int) -> None:
    """deep_ep.cpp hands the combine round = DEEPEP_NORMAL_LONG_SEQ_ROUND only with
    DEEPEP_NORMAL_COMBINE_ENABLE_LONG_SEQ=1, else 1: the tiling key (10000 + 1 for
    maxRound > 1 + 3000 on the A3, 5000 on the 950)."""
    sc = _scenario(tmp_path, hardware, long_seq_round=3, per_round_tokens=32, bs=80,
                   combine_enable_long_seq=enable)
    w = sc.workload
    assert w.family.tiling(w.shape, w.options, sc.hardware).combine_tiling_key == key


@pytest.mark.parametrize("enable", [1, 0])
def test_rounds_on_the_950(tmp_path: Path, enable: int) -> None:
    """80 tokens in rounds of 32 (32, 32, 16): the dispatch's round flags, and the
    multi-round combine with its row split (enable 1) or the one-round kernel (0);
    recv_x and x byte for byte."""
    kw = {"bs": 80, "long_seq_round": 3, "per_round_tokens": 32,
          "combine_enable_long_seq": enable, "quant": "int8"}
    sc = _scenario(tmp_path, **kw)
    res = _run(sc)
    _check_dispatch_combine(sc, _inputs(sc), res, "int8")
    flags = [s for s in res.ops[-1].spans if s.name == "round_sync" and s.core == 0]
    assert len(flags) == (3 * 2 if enable else 0)  # three rounds on each of two ranks


def test_row_split_of_the_multi_round_combine() -> None:
    """InitTokenBalancedRoundSendDataA5, by hand: 10 rows in blocks ending at 3, 3, 7, 10
    over 4 cores (3, 3, 2, 2 rows): core 0 the first block, core 1 rows 3..5 of the third
    (the second is empty), core 2 row 6 of the third and row 7 of the fourth."""
    from npusim.kernels.deepep.combine_rounds_a5 import token_balanced_blocks

    class Ctx:
        num_cores = 4
        core_id = 0

        def alloc(self, *a: Any) -> None:
            return None

        def copy_in(self, *a: Any) -> None:
            return None

        def wait(self, *a: Any):
            return iter(())

        def ub_read(self, *a: Any, **k: Any) -> np.ndarray:
            return np.array([3, 3, 7, 10], np.int32)

        def tensor(self, name: str) -> None:
            return None

        def scalar(self, n: int) -> None:
            return None

        loop = scalar

    class T:
        E = 4

    def blocks(core: int) -> Any:
        ctx = Ctx()
        ctx.core_id = core
        gen = token_balanced_blocks(ctx, T())
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            return stop.value

    assert blocks(0) == ([0], [3], 3)
    assert blocks(1) == ([3], [3], 3)
    assert blocks(2) == ([6, 7], [1, 1], 2)
    assert blocks(3) == ([8], [2], 2)


def test_window_layout_by_hand() -> None:
    """The A5 map (moe_distribute_base.h, cam_moe_*_normal_a5.h, notify_dispatch_a5.h),
    HCCL_BUFFSIZE 300 MB: one window, a 4 MiB state zone, halves of 148 MiB."""
    from npusim.kernels.deepep.window_a5 import A5Window
    w = A5Window("hccl", 300 * MiB, 64, 4, 2048, 2560, 2048, "a5")
    assert w.half == 148 * MiB
    assert w.dispatch_status(1, 3) == 550 * KiB + 96
    assert w.round_status(1, 2) == 450 * KiB + 4 * KiB + 64
    assert w.combine_round_flag(1, 2) == 458 * KiB + 4 * KiB + 64
    assert w.notify_magic(3) == 1000 * KiB + 768
    assert w.dispatch_state(2) == 1050 * KiB + 1024
    assert w.combine_magic(2) == 1100 * KiB + 1024
    assert w.notify_flag(0, 2) == 64  # even calls: the state zone's start
    assert w.notify_data(1) == 148 * MiB + 2 * MiB  # odd calls: inside data half 0
    assert w.combine_status(1, 5) == 4 * MiB + 148 * MiB + 102 * MiB + 160
    assert w.combine_data(0, 1) == 4 * MiB + 106 * MiB + 2048
    assert w.dispatch_data(1, 2) == 4 * MiB + 148 * MiB + 106 * MiB + 64 * 4 * 2048 + 2 * 2560
    assert w.end == 300 * MiB


@pytest.mark.parametrize(("quant", "payload", "scale_at", "triple_at", "copied", "slot"), [
    ("bf16", 14336, 14336, 14368, 14380, 14848),
    ("int8", 7168, 7168, 7200, 7212, 7680),
    ("pertoken_fp8_e4m3", 7168, 7168, 7200, 7212, 7680),
    ("mx_fp8_e5m2", 7168, 7168, 7392, 7628, 7680),
    ("mx_fp4_e2m1", 3584, 3584, 3808, 4044, 4096)])
def test_record_layout_at_h7168(tmp_path: Path, quant: str, payload: int, scale_at: int,
                                triple_at: int, copied: int, slot: int) -> None:
    """cam_moe_dispatch_normal_a5.h Init at H 7168, by hand: hUBAlignSize, the scales'
    place, hScaleSizeAlign (the triple), hScaleIdxSize, hOutGMAlignSize."""
    sc = _scenario(tmp_path, base={**SMALL, "h": 7168}, quant=quant)
    w = sc.workload
    t = w.family.tiling(w.shape, w.options, sc.hardware)
    assert (t.payload_bytes, t.scale_offset, t.triple_offset, t.record_bytes,
            t.window.disp) == (payload, scale_at, triple_at, copied, slot)


def test_batch_rounds_rule() -> None:
    """notify_dispatch_a5.h tests E > 512 before E / W >= 128 (the A3 the other way)."""
    from npusim.kernels.deepep.notify import batch_rounds
    from npusim.kernels.deepep.tiling import DeepepTiling
    from npusim.workload.shape import MoeShape

    shape = MoeShape(BS=64, H=1024, K=4, W=4, L=160)  # E = 640 > 512, L >= 128
    got = {p: batch_rounds(DeepepTiling(shape, "bf16", 2, 32, 64, "hccl", 300, platform=p))
           for p in ("a3", "a5")}
    assert got == {"a3": 16, "a5": 8}


def test_timing_only_runs_the_same_time(tmp_path: Path) -> None:
    sc = _scenario(tmp_path, quant="mx_fp8_e4m3")
    full = _run(sc)
    timing = _run(_scenario(tmp_path, quant="mx_fp8_e4m3", timing_only=True))
    for a, b in zip(full.ops, timing.ops, strict=True):
        assert a.end_ns - a.start_ns == b.end_ns - b.start_ns, a.op


def test_refusals(tmp_path: Path) -> None:
    msg = refused(_scenario, tmp_path, hardware="atlas_a3", quant="mx_fp8_e4m3")
    assert "workload.quant" in msg
    assert "is not supported on this device, please use int8 or bf16 instead" in msg
    _scenario(tmp_path, mode="low_latency", quant="mx_fp4_e2m1")  # the 950's LL runs MXFP4
    msg = refused(_scenario, tmp_path, base={**SMALL, "h": 1280}, quant="mx_fp4_e2m1")
    assert "workload.h" in msg and "multiple of 512" in msg
    msg = refused(_scenario, tmp_path, context="shmem")
    assert "workload.context" in msg
    # DeepEP's check: (2048 * 4 * (14336 + 14848) + 106 MiB) * 2 = 668 MiB; the 950 needs 4 more
    msg = refused(_scenario, tmp_path, base={**SMALL, "bs": 2048, "h": 7168}, hccl_buffsize=669)
    assert "workload.hccl_buffsize" in msg and "state zone" in msg
    assert "allowed: at least 672" in msg
    sc = _scenario(tmp_path, base={**SMALL, "bs": 2048, "h": 7168}, hccl_buffsize=672)
    w = sc.workload
    t = w.family.tiling(w.shape, w.options, sc.hardware)
    assert w.family.tiling_misfit(t, w.shape, w.options, sc.hardware, w.op) is None
