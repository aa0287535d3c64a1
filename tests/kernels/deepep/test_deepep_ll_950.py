"""Family deepep, mode low_latency on the Ascend 950 (DeepEP's A5 build: tiling keys 50000 /
50002 - 50005, moe_distribute_dispatch_v2_a5.h, moe_distribute_combine_v2_a5.h): outputs
byte for byte against a numpy reference written here from the kernels' semantics,
timing-only runs and the one-line refusals. Small shapes only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim.kernels.deepep.low_latency_a5 import tiling_key
from npusim.scenario import load_scenario
from npusim.sim import Forked, simulate
from tests.kernels.deepep.deepephelp import bf16, inputs_of, refused, run_on, write_scenario

W, BS, H, K, L = 4, 16, 1024, 4, 4
SMALL = {"bs": BS, "h": H, "k": K, "ep_world_size": W, "experts_per_rank": L}
F32 = np.float32


def _scenario(tmp: Path, name: str = "ll950", **workload: Any):
    return load_scenario(write_scenario(tmp, {"mode": "low_latency", **SMALL}, "ascend950",
                                        name, 7, **workload))


def _mx_row(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """QuantDynamicMx (quantize_functions.h), per block of 32: E = amax's biased exponent,
    scale byte e8 = max(E, emax) - emax (e4m3 8, e5m2 15), 0 for a zero block; elements
    fp8(x 2^(127 - e8)) rounded to nearest even and saturated (zero block: zeros); the
    scales padded to an even count with 0."""
    import ml_dtypes

    dt, fmax, emax = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0, 8),
                      "e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15)}[fmt]
    xf = x.astype(F32).reshape(-1, 32)
    amax = np.abs(xf).max(axis=1)
    e = ((amax.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    e8 = np.where(amax > 0, np.maximum(e, emax) - emax, 0)
    mul = np.where(amax > 0, np.exp2(127.0 - e8), 0.0)
    scaled = np.clip(xf.astype(np.float64) * mul[:, None], -fmax, fmax).astype(F32)
    q = scaled.astype(dt).view(np.uint8).reshape(-1)
    scales = np.zeros(len(e8) + len(e8) % 2, np.uint8)
    scales[:len(e8)] = e8
    return q, scales


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # magnitude of code & 7


def _e2m1_code(v: float) -> int:
    """The E2M1 code nearest v (ties to the even code), saturated at 6; the sign bit from
    v's sign, a negative value that rounds to 0 included."""
    a = min(abs(v), 6.0)
    dist = np.abs(E2M1 - a)
    best = np.flatnonzero(dist == dist.min())
    code = int(best[0]) if best.size == 1 else int(best[best % 2 == 0][0])
    return code | (8 if np.signbit(v) else 0)


def _mxfp4_row(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QuantDynamicMx to E2M1 (quantize_functions.h ComputeMaxExp / ComputeScale /
    ComputeFp4Data), per block of 32: E = the largest bf16 exponent field, e8 = max(E, 2)
    - 2 (a block of zeros and subnormals: e8 0, codes 0); codes of x 2^(127 - e8); byte i
    = code 2i | code 2i+1 << 4; the scales padded to an even count."""
    bits = x.view(np.uint16).astype(np.int64).reshape(-1, 32)
    q = np.zeros(x.size, np.uint8)
    scales = np.zeros(bits.shape[0] + bits.shape[0] % 2, np.uint8)
    xf = x.astype(np.float64)
    for b, blk in enumerate(bits):
        e = int(((blk >> 7) & 0xFF).max())
        if e == 0:
            continue
        e8 = max(e, 2) - 2
        scales[b] = e8
        for i in range(32):
            q[32 * b + i] = _e2m1_code(xf[32 * b + i] * 2.0 ** (127 - e8))
    return (q[0::2] | (q[1::2] << 4)).astype(np.uint8), scales


def _quant_row(x: np.ndarray, quant: str) -> tuple[np.ndarray, Any]:
    """QuantDynamicPerToken of the A5 build: d = qmax / max|x| if max > 0 else 1 (qmax
    127, pertoken_fp8_e4m3 448); INT8 q = rint(x d) (exact through int32 -> half ->
    int8), FP8 e4m3 of x d rounded to nearest even (|x d| <= 448 up to rounding:
    saturated); the scale stored is 1 / d. MX: :func:`_mx_row`, :func:`_mxfp4_row`."""
    if quant.startswith("mx_fp8_"):
        return _mx_row(x, quant.rsplit("_", 1)[1])
    if quant == "mx_fp4_e2m1":
        return _mxfp4_row(x)
    xf = x.astype(F32)
    if quant == "bf16":
        return x, F32(0)
    m = np.abs(xf).max()
    if quant == "pertoken_fp8_e4m3":
        import ml_dtypes

        d = F32(448) / m if m > 0 else F32(1)
        y = np.clip((xf * d).astype(F32), -448, 448)
        return y.astype(ml_dtypes.float8_e4m3fn), F32(F32(1) / d)
    d = F32(127) / m if m > 0 else F32(1)
    q = np.rint(xf * d).astype(np.int8)
    return q, F32(F32(1) / d)


def _dequant(x: np.ndarray, quant: str) -> np.ndarray:
    """The row the combine gets back (the test's per_token_cast_back), in bf16."""
    if quant == "bf16":
        return x
    q, s = _quant_row(x, quant)
    if quant in ("int8", "pertoken_fp8_e4m3"):
        return (q.astype(F32) * s).astype(bf16())
    if quant == "mx_fp4_e2m1":
        codes = np.stack([q & 15, q >> 4], axis=-1).reshape(-1, 32)
        vals = np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]
        mul = np.exp2(s[:codes.shape[0]].astype(np.float64) - 127)
        return (vals * mul[:, None]).astype(F32).reshape(-1).astype(bf16())
    import ml_dtypes

    dt = ml_dtypes.float8_e4m3fn if quant.endswith("e4m3") else ml_dtypes.float8_e5m2
    vals = q.view(dt).astype(F32).reshape(-1, 32)
    mul = np.exp2(s[:vals.shape[0]].astype(np.float64) - 127)
    return (vals * mul[:, None]).astype(F32).reshape(-1).astype(bf16())


def _reference(inputs: list[dict[str, np.ndarray]], quant: str):
    """Per rank: the received rows in (local expert, source rank, token) order with their
    scales, (src, token, k) triples, the inclusive cumsum over (local expert, source) and
    the count per local expert; per rank, combined_x = bf16 (RINT) of the fp32 sum in k
    order of weight x the (dequantised) row."""
    W = len(inputs)
    disp = []
    for r in range(W):
        rows, scales, trip, counts = [], [], [], []
        for le in range(L):
            e = r * L + le
            for src in range(W):
                ids = inputs[src]["topk_idx"]
                n = 0
                for t in range(BS):
                    for k in range(K):
                        if ids[t, k] == e:
                            q, s = _quant_row(inputs[src]["x"][t], quant)
                            rows.append(q)
                            scales.append(s)
                            trip.append((src, t, k))
                            n += 1
                counts.append(n)
        sdt = np.uint8 if quant.startswith("mx") else F32
        disp.append({"rows": np.array(rows), "scales": np.array(scales, sdt),
                     "src_info": np.array(trip, np.int32).reshape(-1, 3),
                     "layout_range": np.cumsum(counts).astype(np.int32),
                     "count": np.array(counts).reshape(L, W).sum(axis=1)})
    combined = []
    for r in range(W):
        x, ids, w = inputs[r]["x"], inputs[r]["topk_idx"], inputs[r]["topk_weights"]
        out = np.zeros((BS, H), F32)
        for t in range(BS):
            acc = np.zeros(H, F32)
            row = _dequant(x[t], quant)
            for k in range(K):
                acc = (acc + (row.astype(F32) * F32(w[t, k])).astype(F32)).astype(F32)
            out[t] = acc
        combined.append(out.astype(bf16()))
    return disp, combined


QUANTS = ["bf16", "int8", "mx_fp8_e4m3", "mx_fp8_e5m2", "mx_fp4_e2m1", "pertoken_fp8_e4m3"]
# deep_ep.cpp's packed_recv_x element of each mode (FP4 pairs and MX bytes as uint8)
RECV_DTYPE = {"int8": "int8", "mx_fp4_e2m1": "uint8", "pertoken_fp8_e4m3": "float8_e4m3fn",
              "mx_fp8_e4m3": "uint8", "mx_fp8_e5m2": "uint8", "bf16": "bfloat16"}


@pytest.mark.parametrize("quant", QUANTS)
def test_outputs_match_reference(tmp_path: Path, quant: str) -> None:
    """Every received row, scale, triple and count, and combined_x, byte for byte; rank 1's
    token 0 is all zeros, whose A5 per-token scale is 1.0 (the A3 kernel's 127 / 0 gives
    0); MX: the FP8 bytes or E2M1 pairs and the E8M0 scales of every block."""
    _check_outputs(tmp_path, quant, W)


@pytest.mark.parametrize(("quant", "ranks"), [("mx_fp4_e2m1", 2), ("pertoken_fp8_e4m3", 2),
                                              ("mx_fp4_e2m1", 8), ("pertoken_fp8_e4m3", 8)])
def test_new_modes_on_2_and_8_ranks(tmp_path: Path, quant: str, ranks: int) -> None:
    """The same checks with EP 2 and EP 8."""
    _check_outputs(tmp_path, quant, ranks)


def _check_outputs(tmp_path: Path, quant: str, W: int) -> None:
    sc = _scenario(tmp_path, quant=quant, ep_world_size=W)
    inputs = inputs_of(sc, 7)
    inputs[1]["x"][0] = 0
    res = run_on(sc, inputs)
    assert [r.op for r in res.ops] == ["low_latency_dispatch", "low_latency_combine"]
    disp, comb = (r.outputs for r in res.ops)
    want, want_x = _reference(inputs, quant)
    zero_rows = 0
    for r in range(W):
        d, ref = disp[r], want[r]
        n = len(ref["rows"])
        assert int(d["layout_range"][-1]) == n
        assert d["packed_recv_x"][:n].tobytes() == ref["rows"].tobytes(), r
        assert np.array_equal(d["src_info"][:n], ref["src_info"]), r
        assert np.array_equal(d["layout_range"], ref["layout_range"]), r
        assert np.array_equal(d["packed_recv_count"], ref["count"]), r
        if quant != "bf16":
            assert d["packed_recv_x_scales"][:n].tobytes() == ref["scales"].tobytes(), r
        assert str(d["packed_recv_x"].dtype) == RECV_DTYPE[quant]
        if quant in ("int8", "pertoken_fp8_e4m3"):
            zero_rows += int((ref["scales"] == 1.0).sum())
        assert comb[r]["combined_x"].tobytes() == want_x[r].tobytes(), r
    if quant in ("int8", "pertoken_fp8_e4m3"):
        assert zero_rows == K  # token 0 of rank 1 went to K experts
    if quant == "mx_fp4_e2m1":  # [A, H/2] pairs, [A, H/32] scales (H/32 even here)
        assert disp[0]["packed_recv_x"].shape[1] == H // 2
        assert disp[0]["packed_recv_x_scales"].shape[1] == H // 32


@pytest.mark.parametrize("quant", ["int8", "mx_fp4_e2m1", "pertoken_fp8_e4m3"])
def test_reference_outputs_carry_the_a5_scale(tmp_path: Path, quant: str) -> None:
    """The family's own reference (mc2's goldens, adjusted) agrees with the run on a zero
    row, rows and scales alike, dtypes and shapes included."""
    sc = _scenario(tmp_path, quant=quant, op="dispatch")
    inputs = inputs_of(sc, 7)
    inputs[2]["x"][3] = 0
    got = run_on(sc, inputs).ops[0].outputs
    w = sc.workload
    t = w.family.tiling(w.shape, w.options, sc.hardware)
    want = w.family.mode(w.options).reference_outputs("low_latency_dispatch", t, inputs)
    for g, r in zip(got, want, strict=True):
        for name in ("packed_recv_x", "packed_recv_x_scales"):
            assert (g[name].dtype, g[name].shape) == (r[name].dtype, r[name].shape), name
            assert g[name].tobytes() == r[name].tobytes(), name


@pytest.mark.parametrize("quant", ["bf16", "int8", "mx_fp8_e5m2", "mx_fp4_e2m1",
                                   "pertoken_fp8_e4m3"])
def test_timing_only_gives_the_same_times(tmp_path: Path, quant: str) -> None:
    sc = _scenario(tmp_path, quant=quant)
    full = run_on(sc, inputs_of(sc, 7))
    fast = simulate(_scenario(tmp_path, name="fast", quant=quant, timing_only=True))
    for a, b in zip(full.ops, fast.ops, strict=True):
        assert (a.op, a.end_ns - a.start_ns) == (b.op, b.end_ns - b.start_ns)


@pytest.mark.parametrize(("quant", "per"), [("bf16", 2 * H), ("mx_fp8_e4m3", H + H // 32 + 16),
                                           ("mx_fp4_e2m1", H + H // 128 * 4 + 16),
                                           ("pertoken_fp8_e4m3", H + H // 128 * 4 + 16)])
def test_bandwidth_fields_by_hand(tmp_path: Path, quant: str, per: int) -> None:
    """test_low_latency.py's accounting: BS K selections; dispatch num_bf16_bytes 2H,
    num_mxfp8_bytes H + H/32 + 16 (use_ue8m0) or num_fp8_bytes H + H/128 4 + 16 (use_fp8
    alone: INT8, per-token FP8, MXFP4), combine 2H."""
    sc = _scenario(tmp_path, quant=quant, timing_only=True)
    for op, nbytes in zip(simulate(sc).ops, (per, 2 * H), strict=True):
        ns = op.end_ns - op.start_ns
        assert op.family_fields["low_latency_bytes"] == BS * K * nbytes
        assert op.family_fields["low_latency_gbps"] == pytest.approx(BS * K * nbytes / ns,
                                                                     abs=0.01)


def test_tiling_keys() -> None:
    """moe_distribute_dispatch_v2_tiling.cpp: TILING_KEY_A5_TYPE + quantMode."""
    assert [tiling_key(q) for q in ("bf16", "int8", "mx_fp8_e4m3", "mx_fp4_e2m1",
                                    "pertoken_fp8_e4m3")] == [50000, 50002, 50003, 50004, 50005]


def _refused(tmp: Path, **workload: Any) -> str:
    return refused(_scenario, tmp, **workload)


def test_record_layout_matches_the_source_table() -> None:
    """QuantVariableInit's table (moe_distribute_dispatch_v2_a5.h, H 7168): hOutSize_,
    the scale offset, tokenQuantAlign_ * 4, hScaleIdxSize_, hAlignWinSize_,
    hOutAlignUbSize_ for MXFP4 and per-token FP8 (the INT8 record)."""
    from npusim.kernels.mc2.window import dispatch_slot

    for quant, want in (("mxfp4_e2m1", (3584, 3584, 3808, 3820, 4096, 3840)),
                        ("pertoken_fp8", (7168, 7168, 7200, 7212, 7680, 7232))):
        s = dispatch_slot(7168, quant)
        assert (s.out_bytes, s.scale_offset, s.triplet_offset, s.moved, s.slot,
                s.ub_row) == want, quant


def test_two_workers_give_the_same_run(tmp_path: Path) -> None:
    """With two workers the combine runs ahead on the family's reference dispatch, which
    must equal the simulated one on what the combine reads: times and outputs agree."""
    from unittest import mock

    for quant in ("mx_fp4_e2m1", "pertoken_fp8_e4m3"):
        sc = _scenario(tmp_path, quant=quant)
        inputs = inputs_of(sc, 7)
        inputs[1]["x"][0] = 0
        one = run_on(sc, inputs)
        given = inputs
        with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, g=given, **k: g):
            two = simulate(sc, workers=2)
        assert two.combine_ahead == ("kept" if Forked.available() else ""), quant
        for x, y in zip(one.ops, two.ops, strict=True):
            assert x.end_ns - x.start_ns == y.end_ns - y.start_ns
            for a, b in zip(x.outputs, y.outputs, strict=True):
                assert all(a[k].tobytes() == b[k].tobytes() for k in a), quant


def test_refusals(tmp_path: Path) -> None:
    from npusim.kernels.deepep.low_latency_a5 import quant_misfit

    assert all(quant_misfit({"quant": q}) is None for q in QUANTS)
    msg = quant_misfit({"quant": "hifloat8"}).message
    assert msg.startswith("hifloat8:") and f"allowed on ascend950: {', '.join(QUANTS)}" in msg
    # CheckWinSize counts 1 B for per-token FP8 as for INT8 and 2 B for MXFP4:
    # (16 x Align512(2 x 7168 + 44) x 16 + 16 x 14336 x 4) x 2 = 9437184 B (9 MB passes,
    # 8 does not), printed 9 + 1
    msg = _refused(tmp_path, hccl_buffsize=5, h=7168, quant="pertoken_fp8_e4m3")
    assert "NEEDED_HCCL_BUFFSIZE = 6MB" in msg
    msg = _refused(tmp_path, hccl_buffsize=8, h=7168, quant="mx_fp4_e2m1")
    assert "NEEDED_HCCL_BUFFSIZE = 10MB" in msg
    # CheckWinSize at H 7168, INT8: (16 x Align512(7168 + 44) x 4 x 4 + 16 x 14336 x 4) x 2
    # = 5767168 B, printed as 5 + 1 MB; the least it and DeepEP's default allow: 200
    msg = _refused(tmp_path, hccl_buffsize=5, h=7168, quant="int8")
    assert "HCCL_BUFFSIZE is too SMALL, NEEDED_HCCL_BUFFSIZE = 6MB" in msg
    assert "allowed: >= 200" in msg
    # 2 MB passes it at H 1024 (1 MiB), but leaves no data half past the 4 MiB state zone
    msg = _refused(tmp_path, hccl_buffsize=2)
    assert "A5_MTE_STATE_WIN_SIZE" in msg and "= -1048576 B" in msg
    assert "allowed: hccl" in _refused(tmp_path, context="shmem")
    assert "[0, 512]" in _refused(tmp_path, bs=513)
