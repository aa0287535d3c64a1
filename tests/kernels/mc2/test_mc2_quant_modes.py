"""The 950's dispatch quantisation modes of family mc2 (pergroup, mxfp8, mxfp8_clip):
hand-computed small cases of each mode's maths, the kernel against the independent reference,
the record layouts, the one-line refusals on A3 and of FP4, and --tensors consistency."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.hw.config import load_hardware
from npusim.kernels.mc2 import reference as ref
from npusim.kernels.mc2.window import dispatch_slot
from npusim.kernels.quant import mxfp8_quantize, pergroup_quantize
from tests.kernels.mc2.mc2help import machine_for, make_tiling, run_dispatch

sys.path.insert(0, str(Path(__file__).parent))
from test_mc2_kernels import _check_dispatch, _inputs  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def _both(fn):
    """Run a hand case on the kernel side (npusim.kernels.quant) and the reference."""
    return pytest.mark.parametrize("side", ["kernel", "reference"])(fn)


# --------------------------------------------------------------------------- per group


def _pergroup(side, x, fp8, smooth=None):
    if side == "kernel":
        q, s = pergroup_quantize(x[None, :], fp8, smooth)
        return q[0], s[0]
    return ref.pergroup_row(x, fp8, smooth)


@_both
def test_pergroup_a_group_whose_max_is_known(side):
    # group 0: max |x| = 2, so d = 448 / 2 = 224: 2 -> 448, -1 -> -224, 0.25 -> 56;
    # group 1: max 0.5, d = 896: 0.5 -> 448, 0.125 -> 112; scales 1/224 and 1/896 in fp32
    x = np.zeros(256, np.float32)
    x[0], x[1], x[2] = 2.0, -1.0, 0.25
    x[128], x[129] = 0.5, 0.125
    q, s = _pergroup(side, x.astype(BF16), "e4m3")
    v = q.view(E4M3).astype(np.float32)
    assert v[:3].tolist() == [448.0, -224.0, 56.0]
    assert v[128:130].tolist() == [448.0, 112.0]
    assert (v[3:128] == 0).all() and (v[130:] == 0).all()
    assert s.tolist() == [np.float32(1) / np.float32(224), np.float32(1) / np.float32(896)]


@_both
def test_pergroup_rounds_to_nearest_even_and_takes_smooth_scales(side):
    # max 1 with smooth 2 -> 2, d = 57344 / 2 = 28672; bf16(0.3) = 0.30078125, * 2 * 28672
    # = 17248 lies between the e5m2 neighbours 16384 and 20480 (spacing 4096): 16384
    x = np.zeros(128, np.float32)
    x[0], x[1] = 1.0, 0.3
    q, s = _pergroup(side, x.astype(BF16), "e5m2", np.full(128, 2.0, np.float32))
    v = q.view(E5M2).astype(np.float32)
    assert v[0] == 57344.0 and v[1] == 16384.0
    assert s[0] == np.float32(1) / np.float32(28672)


# --------------------------------------------------------------------------- MX


def _mx(side, x, fp8, clip):
    if side == "kernel":
        q, s = mxfp8_quantize(x[None, :], saturate=True, fp8=fp8, clip=clip,
                              zero_subnormal_blocks=True)
        return q[0], s[0]
    return ref.mx_row(x, fp8, clip)


@_both
def test_mxfp8_e4m3_scale_is_the_max_exponent_minus_8(side):
    # block 0: max 3 = 1.5 * 2^1 -> floor(log2) 1, scale 2^(1 - 8) = 2^-7 (E8M0 120);
    # 3 * 2^7 = 384, 0.7 * 128 = 89.6 -> e4m3 (spacing 8 in [64, 128)) 88
    # block 1: max 480 -> 2^8 * 1.875: scale 2^0 (127); 480 > 448 saturates to 448
    x = np.zeros(64, np.float32)
    x[0], x[1] = 3.0, 0.7
    x[32], x[33] = 480.0, -1.0
    q, s = _mx(side, x.astype(BF16), "e4m3", clip=False)
    v = q.view(E4M3).astype(np.float32)
    assert s.tolist() == [120, 127]
    assert v[:2].tolist() == [384.0, 88.0]
    assert v[32:34].tolist() == [448.0, -1.0]


@_both
def test_mxfp8_e5m2_small_blocks_clamp_at_2_pow_minus_127_and_pad_to_even(side):
    # H 96: three blocks and one pad byte (0). Block 0 max 2^-120 -> 2^(-120 - 15) is
    # below 2^-127: byte 0, elements * 2^127 (2^-120 -> 2^7 = 128); block 1 all zero; block 2
    # max 1 -> 2^-15 (112): 1 -> 32768
    x = np.zeros(96, np.float32)
    x[0] = 2.0 ** -120
    x[64] = 1.0
    q, s = _mx(side, x.astype(BF16), "e5m2", clip=False)
    v = q.view(E5M2).astype(np.float32)
    assert s.tolist() == [0, 0, 112, 0]
    assert v[0] == 128.0 and v[64] == 32768.0 and (v[32:64] == 0).all()


@_both
def test_mxfp8_clip_rounds_the_scale_up_and_floors_the_max(side):
    # e4m3: block 0 max 3: 3 / 448 = 0.0067 -> the next power of two up, 2^-7 (120);
    # 3 * 128 = 384. Block 1 max 1e-6 < 1e-4: 1e-4 / 448 = 2.23e-7 -> 2^-22 (105);
    # 1e-6 * 2^22 = 4.19 -> e4m3 (spacing 0.5 in [4, 8)) 4.0. Block 2 max 448 * 2^-3 = 56:
    # exactly 2^-3, not rounded up (124), 56 * 8 = 448. (fp16(1e-6) = 17 * 2^-24, so the
    # element is 17 / 4 = 4.25, a tie between 4 and 4.5: even mantissa, 4.)
    x = np.zeros(96, np.float32)
    x[0] = 3.0
    x[32] = 1e-6
    x[64] = 56.0
    q, s = _mx(side, x.astype(np.float16), "e4m3", clip=True)
    v = q.view(E4M3).astype(np.float32)
    assert s.tolist() == [120, 105, 124, 0]
    assert v[0] == 384.0 and v[32] == 4.0 and v[64] == 448.0


@_both
def test_mxfp8_clip_and_mxfp8_differ_where_the_max_is_not_a_power_of_two(side):
    # e5m2, max 1.75 = 57344 * 2^-15: mode 4 floor(log2 1.75) = 0 -> 2^(0 - 15) (112); mode 5
    # fp32(1.75 * fp32(1/57344)) is 2^-15 exactly (the constant is 4.5e-8 high, under half
    # an fp32 ulp), a power of two, not rounded up: 112 as well
    x = np.zeros(32, np.float32)
    x[0] = 1.75
    assert _mx(side, x.astype(BF16), "e5m2", False)[1][0] == 112
    assert _mx(side, x.astype(BF16), "e5m2", True)[1][0] == 112
    # max bf16(1.8) = 1.796875: mode 4 keeps 2^-15 and 1.796875 * 2^15 = 58880 saturates
    # to 57344; mode 5 rounds up to 2^-14 (113): 1.796875 * 2^14 = 29440 -> e5m2 (spacing
    # 4096 in [16384, 32768)) 28672
    x[0] = 1.8
    q4, s4 = _mx(side, x.astype(BF16), "e5m2", False)
    q5, s5 = _mx(side, x.astype(BF16), "e5m2", True)
    assert (s4[0], s5[0]) == (112, 113)
    assert q4.view(E5M2).astype(np.float32)[0] == 57344.0
    assert q5.view(E5M2).astype(np.float32)[0] == 28672.0


# --------------------------------------------------------------------------- layouts


def test_record_layouts_as_quantinit():
    # pergroup: Align128(H) data + ceil(H/128) fp32; MX: Align256(H) + Align2(ceil(H/32))
    pg = dispatch_slot(1056, "pergroup")
    assert (pg.scale_offset, pg.scale_bytes) == (1152, 36)
    assert pg.triplet_offset == 1216 and pg.moved == 1228 and pg.slot == 1536
    mx = dispatch_slot(1056, "mxfp8")
    assert (mx.scale_offset, mx.scale_bytes) == (1280, 34)
    assert mx.triplet_offset == 1344 and mx.moved == 1356
    assert dispatch_slot(1056, "mxfp8_clip") == mx
    assert dispatch_slot(7168, "pergroup").scale_bytes == 224  # 56 groups of 4 B
    # MXFP4: ceil(H/2) bytes of pairs, the scales at Align256 of them
    fp4 = dispatch_slot(1056, "mxfp4_e2m1")
    assert (fp4.out_bytes, fp4.scale_offset, fp4.scale_bytes) == (528, 768, 34)
    assert fp4.triplet_offset == 832 and fp4.moved == 844 and fp4.slot == 1024


# --------------------------------------------------------------------------- kernel vs reference


@pytest.mark.parametrize("quant,fp8,dtype", [
    ("pergroup", "e4m3", "bfloat16"), ("pergroup", "e5m2", "float16"),
    ("mxfp8", "e5m2", "bfloat16"), ("mxfp8", "e4m3", "float16"),
    ("mxfp8_clip", "e4m3", "bfloat16"), ("mxfp8_clip", "e5m2", "float16"),
    ("mxfp4_e2m1", "e5m2", "bfloat16")])
@pytest.mark.parametrize("alg", ["fullmesh_v1", "fullmesh_v2"])
def test_kernel_outputs_equal_the_reference(quant, fp8, dtype, alg):
    cfg = load_hardware("ascend950")
    shape = ref.mc2_shape(W=4, bs=(5, 5, 5, 5), H=1056, K=3, E=8, dtype=dtype)
    t = make_tiling(shape, cfg, quant, quant_dtype=fp8, comm_alg=alg)
    ins = _inputs(shape, 2)
    if dtype == "float16":
        ins = [ref.DispatchInputs(i.x.astype(np.float16), i.expert_ids, i.expert_scales,
                                  None, None) for i in ins]
    _, outs = run_dispatch(machine_for(cfg, t), t, ins)
    want = ref.reference_dispatch(shape, ins, quant, quant_dtype=fp8)
    _check_dispatch(outs, want)
    assert all(w.dynamic_scales.shape[1] == (9 if quant == "pergroup" else 34) for w in want)
    if quant == "mxfp4_e2m1":  # [A, ceil(H/2)] bytes of E2M1 pairs
        assert all(o.expand_x.shape[1] == 528 for o in outs)


def test_pergroup_with_smooth_scales_equals_the_reference():
    cfg = load_hardware("ascend950")
    shape = ref.mc2_shape(W=4, bs=(4, 4, 4, 4), H=1024, K=2, E=8)
    rng = np.random.default_rng(5)
    scales = rng.uniform(0.5, 2.0, (shape.scale_rows(), shape.H)).astype(np.float32)
    t = make_tiling(shape, cfg, "pergroup", smooth_scales=True, quant_dtype="e4m3")
    ins = _inputs(shape, 3, scales=scales)
    _, outs = run_dispatch(machine_for(cfg, t), t, ins)
    _check_dispatch(outs, ref.reference_dispatch(shape, ins, "pergroup", quant_dtype="e4m3"))


# --------------------------------------------------------------------------- CLI


def _scenario(tmp: Path, hardware: str, **workload) -> Path:
    w = {"kernel": "mc2", "op": "dispatch_combine", "bs": 4, "h": 1024, "k": 4,
         "ep_world_size": 4, "experts_per_rank": 2, "dtype": "bfloat16",
         "routing": {"kind": "uniform", "seed": 1}}
    w.update(workload)
    p = tmp / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "hardware": hardware, "workload": w}))
    return p


@pytest.mark.parametrize("quant", ["pergroup", "mxfp8", "mxfp8_clip", "mxfp4_e2m1"])
def test_a3_refuses_the_950_modes_in_one_line(tmp_path, capsys, quant):
    out = tmp_path / "out"
    assert main(["run", str(_scenario(tmp_path, "atlas_a3", dispatch_quant=quant)),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "workload.dispatch_quant" in err
    assert "quant_mode 0 or 2" in err and quant in err
    assert not out.exists()


def test_fp4_e1m2_is_refused_as_not_modelled_on_the_950(tmp_path, capsys):
    assert main(["run", str(_scenario(tmp_path, "ascend950", dispatch_quant="mxfp4_e1m2")),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not modelled" in err and "e1m2" in err


def test_fp4_e2m1_of_float16_tokens_is_refused(tmp_path, capsys):
    sc = _scenario(tmp_path, "ascend950", dispatch_quant="mxfp4_e2m1", dtype="float16")
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "workload.dtype" in err and "FP16Convert" in err


def test_mx_refuses_smooth_scales(tmp_path, capsys):
    sc = _scenario(tmp_path, "ascend950", dispatch_quant="mxfp8", smooth_scales=True)
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    assert "workload.smooth_scales" in capsys.readouterr().err


@pytest.mark.parametrize("quant,fp8,cquant", [("pergroup", "e4m3", "none"),
                                              ("mxfp8_clip", "e5m2", "none"),
                                              ("mxfp8", "e4m3", "mxfp8_e4m3")])
def test_tensors_dump_agrees_with_the_reference_and_the_round_trip(tmp_path, quant, fp8,
                                                                    cquant):
    sc = _scenario(tmp_path, "ascend950", dispatch_quant=quant, quant_dtype=fp8,
                   combine_quant=cquant)
    tens = tmp_path / "tensors"
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--tensors", str(tens),
                 "--quiet"]) == 0
    W, H = 4, 1024
    load = lambda op, r, side, n: np.load(tens / op / f"rank_{r}" / side / f"{n}.npy")  # noqa: E731
    shape = ref.mc2_shape(W=W, bs=(4,) * W, H=H, K=4, E=8)
    ins = [ref.DispatchInputs(load("dispatch", r, "in", "x").view(BF16),
                              load("dispatch", r, "in", "expert_ids"),
                              load("dispatch", r, "in", "expert_scales"), None, None)
           for r in range(W)]
    want = ref.reference_dispatch(shape, ins, quant, quant_dtype=fp8)
    for r in range(W):
        ex = load("dispatch", r, "out", "expand_x")
        ds = load("dispatch", r, "out", "dynamic_scales")
        assert ex.dtype == np.uint8 and np.array_equal(ex, want[r].expand_x)
        assert np.array_equal(ds.view(np.uint8), want[r].dynamic_scales.view(np.uint8))
        # identity experts: combine's x = sum_k w_k * dequant(row), within the FP8 error
        x = ins[r].x.astype(np.float32)
        w = ins[r].expert_scales.astype(np.float32)
        y = load("combine", r, "out", "x").view(BF16).astype(np.float32)
        ws = w.sum(axis=1, keepdims=True)
        exact = x * ws
        # an fp8 element is within half an ulp (2^-4 e4m3, 2^-3 e5m2, relative) of x or,
        # below the normal range, within 2^-9 of the block's max; then bf16's 2^-8
        rel = 2.0 ** -(4 if fp8 == "e4m3" else 3)
        amax = np.abs(x).max(axis=1, keepdims=True)
        trips = 2 if cquant != "none" else 1  # the MXFP8 combine rounds each row again
        bound = ws * (np.abs(x) * ((1 + rel) ** trips - 1) + trips * 2 * amax * 2.0 ** -9)
        bound += np.abs(exact) / 128
        assert (np.abs(y - exact) <= bound).all()


# --------------------------------------------------------------------------- combine MXFP8


def test_combine_mx_round_trip_by_hand():
    # a block of max 3 (e4m3): scale byte 120 (2^-7), 3 -> 384 -> back 3; 0.7 -> 88 -> 0.6875;
    # a block whose max is below 2^-126 gets byte 0 and reads back as zeros
    x = np.zeros(64, np.float32)
    x[0], x[1] = 3.0, 0.7
    x[32] = 2.0 ** -130
    y = ref.mx_combine_row(x.astype(BF16), "e4m3")
    assert y[0] == 3.0 and y[1] == 0.6875 and (y[32:] == 0).all()


@pytest.mark.parametrize("cquant,dquant,S", [("mxfp8_e5m2", "none", 0),
                                              ("mxfp8_e4m3", "mxfp8", 0),
                                              ("mxfp8_e5m2", "pergroup", 1)])
def test_combine_mxfp8_equals_the_reference(cquant, dquant, S):
    from test_mc2_kernels import _round_trip
    W = 6 if S else 4
    shape = ref.mc2_shape(W=W, bs=(4,) * W, H=1056, K=3, E=8, S=S, S_r=2 * S)
    t, _, res2 = _round_trip("ascend950", shape, dquant, cquant, seed=7)
    assert t.window.combine_stride == 1536  # ceil((1280 + 2 * 34) / 480) * 512
    assert res2.end_ns > res2.start_ns


def test_a3_refuses_the_mxfp8_combine(tmp_path, capsys):
    sc = _scenario(tmp_path, "atlas_a3", combine_quant="mxfp8_e4m3")
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "workload.combine_quant" in err and "comm_quant_mode 4" in err
