"""The mc2 kernels (MoeDistributeDispatchV2 fullmesh_v1 + CombineV2) run on the simulator:
every output byte against the independent numpy reference (npusim.kernels.mc2.reference)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from npusim.hw.config import load_hardware
from npusim.kernels.mc2 import reference as ref
from npusim.workload.shape import MoeShape
from tests.kernels.mc2.mc2help import machine_for, make_tiling, run_combine, run_dispatch

BF16 = ml_dtypes.bfloat16


def _inputs(shape: MoeShape, seed: int, special: int = 0, mask: str | None = None,
            scales: np.ndarray | None = None) -> list[ref.DispatchInputs]:
    rng = np.random.default_rng(seed)
    ins = []
    for r in range(shape.W):
        bs = shape.bs[r]
        x = rng.uniform(-1, 1, (bs, shape.H)).astype(BF16)
        ids = np.argsort(rng.random((bs, shape.E + special)), axis=1)[:, :shape.K]
        w = rng.uniform(0, 1, (bs, shape.K)).astype(np.float32)
        m = None
        if mask == "1d":
            m = np.arange(bs) < max(1, bs - 1 - r)
        elif mask == "2d":
            m = rng.random((bs, shape.K)) < 0.7
            m[0] = False  # one token with no active pair
        ins.append(ref.DispatchInputs(x, ids.astype(np.int32), w, m, scales))
    return ins


def _check_dispatch(outs, want):
    for o, w in zip(outs, want, strict=True):
        assert o.n == w.n
        assert np.array_equal(o.ep_recv_count, w.ep_recv_count)
        assert np.array_equal(o.assist_info_for_combine, w.assist_info_for_combine)
        assert np.array_equal(o.expand_x.view(np.uint8), w.expand_x.view(np.uint8))
        assert np.array_equal(o.expert_token_nums, w.expert_token_nums)
        if w.dynamic_scales is not None:
            assert np.array_equal(o.dynamic_scales, w.dynamic_scales)


def _round_trip(preset, shape, quant="none", cquant="none", seed=0, etn=1, es_out=False,
                **kw):
    cfg = load_hardware(preset)
    t = make_tiling(shape, cfg, quant, cquant, expert_token_nums_type=etn,
                    smooth_scales=kw.get("scales") is not None, expert_scales_out=es_out,
                    x_active_mask=kw.get("mask") or "none")
    kw.setdefault("special", shape.special_experts)
    ins = _inputs(shape, seed, **kw)
    res, outs = run_dispatch(machine_for(cfg, t), t, ins)
    want = ref.reference_dispatch(shape, ins, quant, expert_token_nums_type=etn)
    _check_dispatch(outs, want)
    if es_out:
        for o, w in zip(outs, want, strict=True):
            assert np.array_equal(o.expand_scales[:o.n], w.expand_scales[:w.n])
    rows = [ref.dequantized_rows(o, quant, shape.dtype) for o in outs]
    rng = np.random.default_rng(seed + 1)
    n_const = max(shape.const_experts, 1)
    extra = {}
    if shape.special_experts:
        extra = dict(const_expert_alpha_1=rng.uniform(-1, 1, (n_const, shape.H)).astype(BF16),
                     const_expert_alpha_2=rng.uniform(-1, 1, (n_const, shape.H)).astype(BF16),
                     const_expert_v=rng.uniform(-1, 1, (n_const, shape.H)).astype(BF16))
    cin = [dict(expert_ids=i.expert_ids, expert_scales=i.expert_scales,
                x_active_mask=i.x_active_mask, **(dict(ori_x=i.x, **extra) if extra else {}))
           for i in ins]
    res2, xs = run_combine(machine_for(cfg, t), t, outs, rows, cin)
    cref = [ref.CombineInputs(rows[r], ins[r].expert_ids, ins[r].expert_scales,
                              ins[r].x_active_mask, ori_x=ins[r].x if extra else None,
                              const_alpha1=extra.get("const_expert_alpha_1"),
                              const_alpha2=extra.get("const_expert_alpha_2"),
                              const_v=extra.get("const_expert_v"))
            for r in range(shape.W)]
    wx = ref.reference_combine(shape, outs, cref, quant=cquant)
    for r in range(shape.W):
        assert np.array_equal(xs[r].view(np.uint16), wx[r].view(np.uint16))
    return t, res, res2


@pytest.mark.parametrize("preset,W,quant", [
    ("atlas_a3", 2, "none"), ("atlas_a3", 8, "int8"), ("ascend950", 2, "int8"),
    ("ascend950", 8, "none"),
])
def test_dispatch_combine_exact(preset, W, quant):
    shape = ref.mc2_shape(W=W, bs=(6,) * W, H=1024, K=4, E=2 * W)
    t, res, res2 = _round_trip(preset, shape, quant, seed=W)
    assert t.cores == {"atlas_a3": 48, "ascend950": 64}[preset]  # GetCoreNumAiv of the preset
    assert res.end_ns > res.start_ns and res2.end_ns > res2.start_ns


def test_cumsum_token_nums_and_static_int8_per_expert_scales():
    shape = ref.mc2_shape(W=2, bs=(5, 5), H=1024, K=2, E=4)
    sc = np.linspace(0.5, 4.0, 4 * 1024, dtype=np.float32).reshape(4, 1024)
    _round_trip("atlas_a3", shape, "static_int8", etn=0, scales=sc)


def test_int8_with_smooth_scales_on_the_950():
    shape = ref.mc2_shape(W=2, bs=(4, 4), H=1024, K=2, E=4)
    sc = np.linspace(0.5, 2.0, 4 * 1024, dtype=np.float32).reshape(4, 1024)
    _round_trip("ascend950", shape, "int8", scales=sc)


@pytest.mark.parametrize("mask", ["1d", "2d"])
def test_masks(mask):
    shape = ref.mc2_shape(W=4, bs=(6,) * 4, H=1024, K=3, E=8)
    _round_trip("atlas_a3", shape, "int8", seed=3, mask=mask)


@pytest.mark.parametrize("preset", ["atlas_a3", "ascend950"])
def test_zero_copy_const_experts_and_expand_scales(preset):
    shape = ref.mc2_shape(W=2, bs=(6, 6), H=1024, K=4, E=4, zero_experts=1, copy_experts=1,
                         const_experts=1)
    _round_trip(preset, shape, "none", seed=5, es_out=True)


def test_two_dim_mask_on_the_950():
    shape = ref.mc2_shape(W=2, bs=(5, 5), H=1024, K=3, E=4)
    _round_trip("ascend950", shape, "none", seed=11, mask="2d")


def test_shared_experts_and_combine_int8():
    # ranks 0, 1: one shared expert twice; ranks 2..5 hold 8 MoE experts
    shape = ref.mc2_shape(W=6, bs=(4,) * 6, H=1024, K=2, E=8, S=1, S_r=2)
    _round_trip("atlas_a3", shape, "int8", "int8", seed=7)


def test_uneven_bs_with_global_bs_on_the_950():
    shape = ref.mc2_shape(W=4, bs=(7, 3, 5, 1), H=1024, K=2, E=8, global_bs=32)
    _round_trip("ascend950", shape, "int8", seed=9)


@pytest.mark.parametrize("preset,W", [("atlas_a3", 16), ("ascend950", 16), ("atlas_a3", 48)])
def test_wide_worlds(preset, W):
    # W = 48 on A3: 48 ranks of 48 cores, one expert each, two tokens of two pairs
    shape = ref.mc2_shape(W=W, bs=(2,) * W, H=1024, K=2, E=W)
    _round_trip(preset, shape, "int8", seed=W)


@pytest.mark.parametrize("preset", ["atlas_a3", "ascend950"])
def test_performance_info_times_each_source(preset):
    cfg = load_hardware(preset)
    if preset == "atlas_a3":  # the hop between packages made 3 us long (preset: 0.5 us)
        cfg = dataclasses.replace(cfg, fabric=dataclasses.replace(cfg.fabric, levels=tuple(
            dataclasses.replace(lv, latency_ns=3000.0) if lv.name != "package" else lv
            for lv in cfg.fabric.levels)))
    shape = ref.mc2_shape(W=4, bs=(4,) * 4, H=1024, K=2, E=8)
    ins = _inputs(shape, 13)
    plain = make_tiling(shape, cfg, "int8")
    t = make_tiling(shape, cfg, "int8", performance_info=True)
    m0, m = machine_for(cfg, plain), machine_for(cfg, t)
    r0, outs0 = run_dispatch(m0, plain, ins)
    res, outs = run_dispatch(m, t, ins)
    _check_dispatch(outs, ref.reference_dispatch(shape, ins, "int8"))
    latency_us = (res.end_ns - res.start_ns) / 1000
    for perf in m.performance_info:
        # a wait is shorter than the kernel, and every source's count takes a while to land
        assert perf.shape == (4,) and (perf >= 0).all() and (perf < latency_us).all()
    if preset == "atlas_a3":  # counts from the other package cross the 3 us hop: every
        # rank runs the same program on alike data, so they start within a microsecond
        for r, p in enumerate(m.performance_info):
            other = [s for s in range(4) if s // 2 != r // 2]  # 2 dies per package
            assert (p[other] >= 2).all()
    # recording costs scalar work in the poll loop: never faster than without it
    assert res.end_ns >= r0.end_ns


@pytest.mark.parametrize("preset", ["atlas_a3", "ascend950"])
def test_combine_performance_info_names_only_the_sources(preset):
    """Rank r's tokens go to experts on ranks r and r + 1 only, so the combine's waits
    (PerformanceInfoPerToken, per source rank) are zero for the other two sources; the
    recording changes no output byte and never makes the combine faster."""
    cfg = load_hardware(preset)
    W, L = 4, 2
    shape = ref.mc2_shape(W=W, bs=(4,) * W, H=1024, K=2, E=W * L)
    ins = _inputs(shape, 5)
    for r, i in enumerate(ins):
        i.expert_ids[:] = [L * r, L * ((r + 1) % W) + 1]
    runs = []
    for perf in (False, True):
        t = make_tiling(shape, cfg, "none", performance_info=perf)
        _, outs = run_dispatch(machine_for(cfg, t), t, ins)
        rows = [ref.dequantized_rows(o, "none", shape.dtype) for o in outs]
        cin = [dict(expert_ids=i.expert_ids, expert_scales=i.expert_scales) for i in ins]
        m = machine_for(cfg, t)
        res, xs = run_combine(m, t, outs, rows, cin)
        runs.append((res, xs, m.performance_info))
    (r0, x0, _), (r1, x1, perf) = runs
    for a, b in zip(x0, x1, strict=True):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    assert r1.end_ns >= r0.end_ns
    latency_us = (r1.end_ns - r1.start_ns) / 1000
    for r, p in enumerate(perf):
        assert p.shape == (W,) and (p >= 0).all() and (p < latency_us).all()
        others = [s for s in range(W) if s not in (r, (r + 1) % W)]
        assert (p[others] == 0).all()


@pytest.mark.parametrize("W,H,mask", [(2, 1056, None), (8, 1024, "2d")])
def test_950_int8_combine_exact(W, H, mask):
    """comm_quant_mode 2 on the 950 (MoeDistributeCombineV2A5Mte<INT8_COMM_QUANT>): the
    row quantised per 8 values, its Align32(H) int8 and Align128(H) / 8 scales packed into
    480/512 B blocks, dequantised and summed as the reference does (H 1056: 144 scales
    sent, 132 used)."""
    shape = ref.mc2_shape(W=W, bs=(5,) * W, H=H, K=4, E=2 * W)
    t, _, _ = _round_trip("ascend950", shape, "int8", "int8", seed=W, mask=mask)
    assert t.window.combine_step < t.window.combine_slot  # fewer blocks than bf16
