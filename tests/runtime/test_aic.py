"""The AIC core kind: MTE2 into L1, MTE1, the cube's mmad and FixPipe, timed by hand from
the preset (tests/runtime/aichelp.py: 1 GHz, so a cycle is a ns and B/cycle is GB/s), numerically
against numpy, and the sanitiser on L1/L0."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npusim.errors import KernelError
from npusim.hw.config import load_hardware
from npusim.runtime.launch import launch
from tests.runtime.aichelp import aic_hw, mix_machine

RNG = np.random.default_rng(7)


def _aic0(body):
    """A MIX program whose AIC of block 0 runs `body`; every other core returns."""
    def program(ctx):
        if ctx.core.kind.name == "aic" and ctx.block_idx == 0:
            with ctx.phase("cube_work"):
                yield from body(ctx)
    return program


def _fill(ctx, buf, array):
    ctx.ub_write(buf, 0, array, ops=0)  # test set-up: bytes straight into L0 (no cost)


@pytest.mark.parametrize("dtype,m,n,k,fractals", [
    # ceil(40/16) x ceil(24/16) x ceil(100/16): 3 x 2 x 7 fractals of 16x16x16
    ("float16", 40, 24, 100, 42),
    ("bfloat16", 16, 16, 16, 1),
    # fp8: K fractals of 32 elements, 3 x 2 x ceil(100/32) = 24 of 16x16x32
    ("float8_e4m3fn", 40, 24, 100, 24),
    ("int8", 32, 32, 64, 8),  # 2 x 2 x 64/32
])
def test_an_mmad_costs_its_fractals_at_the_dtypes_rate(dtype, m, n, k, fractals):
    hw = aic_hw()
    seen = {}
    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    a = RNG.integers(-3, 4, (m, k)).astype(dt)
    b = RNG.integers(-3, 4, (k, n)).astype(dt)

    def body(ctx):
        la = ctx.alloc("a", 16384, "l0a")
        lb = ctx.alloc("b", 16384, "l0b")
        lc = ctx.alloc("c", m * n * 4, "l0c")
        _fill(ctx, la, a)
        _fill(ctx, lb, b)
        op = ctx.mmad(lc, la, lb, m, n, k, dtype)
        yield from ctx.wait(op)
        seen["ns"] = op.done_at - op.start_at
        seen["c"] = lc.view(np.int32 if dtype == "int8" else np.float32, m * n).reshape(m, n)

    launch(mix_machine(hw), _aic0(body))
    # the presets: 4096 MACs per cycle in fp16 (16x16x16), 8192 in int8/fp8 (16x16x32):
    # one fractal a cycle; plus cube_issue_cycles 20
    assert seen["ns"] == pytest.approx(20 + fractals)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.array_equal(seen["c"], want.astype(seen["c"].dtype))


def test_an_mx_mmad_scales_each_32_elements_of_k():
    hw = aic_hw()
    m, n, k = 16, 16, 64
    a = RNG.integers(-2, 3, (m, k)).astype(ml_dtypes.float8_e4m3fn)
    b = RNG.integers(-2, 3, (k, n)).astype(ml_dtypes.float8_e4m3fn)
    sa = RNG.integers(125, 130, (m, k // 32)).astype(np.uint8)  # E8M0: 2^(e - 127)
    sb = RNG.integers(125, 130, (k // 32, n)).astype(np.uint8)
    got = {}

    def body(ctx):
        la, lb = ctx.alloc("a", 4096, "l0a"), ctx.alloc("b", 4096, "l0b")
        qa, qb = ctx.alloc("sa", 512, "l0a"), ctx.alloc("sb", 512, "l0b")
        lc = ctx.alloc("c", m * n * 4, "l0c")
        for buf, arr in ((la, a), (lb, b), (qa, sa), (qb, sb)):
            _fill(ctx, buf, arr)
        yield from ctx.wait(ctx.mmad(lc, la, lb, m, n, k, "float8_e4m3fn", a_scale=qa,
                                     b_scale=qb))
        got["c"] = lc.view(np.float32, m * n).reshape(m, n).copy()

    launch(mix_machine(hw), _aic0(body))
    fa = a.astype(np.float64) * np.repeat(2.0 ** (sa.astype(np.float64) - 127), 32, axis=1)
    fb = b.astype(np.float64) * np.repeat(2.0 ** (sb.astype(np.float64) - 127), 32, axis=0)
    assert np.allclose(got["c"], fa @ fb, rtol=1e-6)


def test_an_fp8_mmad_on_a_cube_without_fp8_is_refused():
    hw = load_hardware("atlas_a3", {"chip.aiv_cores": 4})

    def body(ctx):
        la, lb = ctx.alloc("a", 512, "l0a"), ctx.alloc("b", 512, "l0b")
        lc = ctx.alloc("c", 1024, "l0c")
        ctx.mmad(lc, la, lb, 16, 16, 32, "float8_e4m3fn")
        yield from ()

    with pytest.raises(KernelError, match=r"does not take float8_e4m3fn"):
        launch(mix_machine(hw), _aic0(body))


def test_mte2_into_l1_then_mte1_into_l0a_and_l0b():
    hw = aic_hw()
    x = RNG.integers(0, 255, 4096).astype(np.uint8)
    t = {}

    def body(ctx):
        l1 = ctx.alloc("l1", 4096, "l1")
        yield from ctx.wait(ctx.copy_in(l1, ctx.tensor("x"), 0, 4096))
        t["l1"] = ctx.t
        a, b = ctx.alloc("a", 4096, "l0a"), ctx.alloc("b", 2048, "l0b")
        la = ctx.load_data(a, l1, 4096)
        lb = ctx.load_data(b, l1, 2048, src_offset=2048)
        yield from ctx.wait(la, lb)
        t["la"], t["lb"] = la.done_at, lb.done_at
        t["a"], t["b"] = a.view(np.uint8).copy(), b.view(np.uint8).copy()

    m = mix_machine(hw)
    m.ranks[0].tensor("x", x)
    launch(m, _aic0(body))
    # MTE2: 4096 B at 100 B/cycle = 40.96 ns, + mte2_latency 100
    assert t["l1"] == pytest.approx(140.96)
    # MTE1 in order: 10 + 4096 / 256 = 26 cycles, then 10 + 2048 / 256 = 18
    assert t["la"] == pytest.approx(140.96 + 26)
    assert t["lb"] == pytest.approx(140.96 + 26 + 18)
    assert np.array_equal(t["a"], x) and np.array_equal(t["b"], x[2048:])


def test_mte1_into_l0a_runs_at_the_a3s_512_b_per_cycle():
    hw = load_hardware("atlas_a3", {"chip.clock_ghz": 1.0, "chip.aiv_cores": 4,
                                    "scalar.cycles_per_op": 0.0, "aic.mte1_issue_cycles": 10})
    t = {}

    def body(ctx):
        l1 = ctx.alloc("l1", 4096, "l1")
        ctx.ub_write(l1, 0, np.zeros(4096, np.uint8), ops=0)
        a, b = ctx.alloc("a", 4096, "l0a"), ctx.alloc("b", 4096, "l0b")
        la, lb = ctx.load_data(a, l1, 4096), ctx.load_data(b, l1, 4096)
        yield from ctx.wait(la, lb)
        t["la"], t["lb"] = la.done_at - la.start_at, lb.done_at - lb.start_at

    launch(mix_machine(hw), _aic0(body))
    assert t["la"] == pytest.approx(10 + 4096 / 512)  # l1_to_l0_a_rate 512 on the 910B ini
    assert t["lb"] == pytest.approx(10 + 4096 / 256)  # l1_to_l0_b_rate 256


def test_fixpipe_to_gm_and_into_an_aivs_ub():
    hw = aic_hw()
    m_, n_ = 32, 32
    c = RNG.standard_normal((m_, n_)).astype(np.float32)
    t = {}

    def program(ctx):
        if ctx.block_idx != 0:
            return
        if ctx.core.kind.name == "aic":
            lc = ctx.alloc("c", m_ * n_ * 4, "l0c")
            _fill(ctx, lc, c)
            yield from ctx.cross_core_wait_flag(1)  # AIV0 has allocated its tile
            to_gm = ctx.fixpipe(ctx.tensor("y"), lc, m_, n_, "bfloat16")
            to_ub = ctx.fixpipe(ctx.peer_buffer(0, "tile"), lc, m_, n_, "bfloat16",
                                relu=True)
            t["issued"] = ctx.t
            yield from ctx.wait(to_gm, to_ub)
            t["gm"], t["ub"] = to_gm.done_at, to_ub.done_at
            ctx.cross_core_set_flag(4, 0, "fixpipe")
        elif ctx.sub_block_idx == 0:
            tile = ctx.alloc("tile", m_ * n_ * 2)
            ctx.cross_core_set_flag(4, 1)
            yield from ctx.cross_core_wait_flag(0)
            t["aiv"] = ctx.t
            t["tile"] = ctx.ub_read(tile, ml_dtypes.bfloat16, m_ * n_).reshape(m_, n_)

    m = mix_machine(hw)
    m.ranks[0].tensor("y", np.zeros((m_, n_), ml_dtypes.bfloat16))
    launch(m, program)
    # the AIV's flag lands at flag_ns = 100; 2048 B of bf16
    assert t["issued"] == pytest.approx(100.0)
    # to GM at 32 B/cycle: 64 ns + latency 100
    assert t["gm"] == pytest.approx(100 + 64 + 100)
    # FixPipe is one queue: the UB write streams after the GM one's last byte (at 164),
    # 2048 B at 128 B/cycle = 16 ns, + 100
    assert t["ub"] == pytest.approx(100 + 64 + 16 + 100)
    # the AIC's set on PIPE_FIX lands after both, + flag_ns
    assert t["aiv"] == pytest.approx(280 + 100)
    y = m.ranks[0].tensors["y"].as_array(ml_dtypes.bfloat16, (m_, n_))
    assert np.array_equal(y, c.astype(ml_dtypes.bfloat16))
    assert np.array_equal(t["tile"], np.maximum(c, 0).astype(ml_dtypes.bfloat16))


def test_fixpipe_into_ub_is_not_a_path_of_the_a3():
    hw = load_hardware("atlas_a3", {"chip.aiv_cores": 4})

    def program(ctx):
        if ctx.block_idx:
            return
        if ctx.core.kind.name == "aic":
            lc = ctx.alloc("c", 1024, "l0c")
            yield from ctx.cross_core_wait_flag(1)  # mode 2: both AIVs have set it
            ctx.fixpipe(ctx.peer_buffer(0, "tile"), lc, 16, 16, "float32")
        else:
            ctx.alloc("tile", 1024)
            ctx.cross_core_set_flag(2, 1, "mte3")

    with pytest.raises(KernelError, match=r"not a path of preset atlas_a3"):
        launch(mix_machine(hw), program)


@pytest.mark.parametrize("buffer,size,label", [("l0a", 65536, "L0A"), ("l0b", 65536, "L0B"),
                                               ("l0c", 262144, "L0C"), ("l1", 524288, "L1")])
def test_an_l0_or_l1_overflow_names_rank_core_step_and_address(buffer, size, label):
    def body(ctx):
        ctx.alloc("first", 1024, buffer)
        ctx.alloc("too_big", size - 1024 + 1, buffer)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(mix_machine(aic_hw()), _aic0(body))
    e = info.value
    # the AIC of block 0 is core 0 of the MIX launch's block order
    assert (e.rank, e.core, e.step, e.address) == (0, "0 (aic 0)", "cube_work", 1024)
    assert f"{label} overflow: buffer 'too_big'" in str(e)


def test_an_l1_address_off_its_512_b_alignment_is_an_error():
    def body(ctx):
        l1 = ctx.alloc("l1", 2048, "l1")
        a = ctx.alloc("a", 1024, "l0a")
        ctx.ub_write(l1, 0, np.zeros(2048, np.uint8), ops=0)
        ctx.load_data(a, l1, 512, src_offset=32)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(mix_machine(aic_hw()), _aic0(body))
    e = info.value
    assert (e.rank, e.core, e.step, e.address) == (0, "0 (aic 0)", "cube_work", 32)
    assert "L1 address is not 512 B aligned" in str(e)


def test_l0c_allocations_are_1024_b_aligned_and_an_unaligned_fixpipe_into_ub_is_caught():
    hw = aic_hw()
    seen = {}

    def program(ctx):
        if ctx.block_idx:
            return
        if ctx.core.kind.name == "aic":
            first, second = ctx.alloc("c0", 100, "l0c"), ctx.alloc("c1", 100, "l0c")
            seen["offsets"] = (first.offset, second.offset)
            ctx.ub_write(first, 0, np.zeros(64, np.float32), ops=0)
            yield from ctx.cross_core_wait_flag(1)
            ctx.fixpipe(ctx.peer_buffer(0, "tile"), first, 4, 4, "float32", dst_offset=16)
        elif ctx.sub_block_idx == 0:
            ctx.alloc("tile", 1024)
            ctx.cross_core_set_flag(4, 1)
        yield from ()

    with pytest.raises(KernelError) as info:
        launch(mix_machine(hw), program)
    assert seen["offsets"] == (0, 1024)
    e = info.value
    assert (e.core, e.address) == ("0 (aic 0)", 16)
    assert "UB address is not 32 B aligned" in str(e)


def test_the_cube_reading_l0a_before_its_load_lands_is_a_missing_wait():
    def body(ctx):
        l1 = ctx.alloc("l1", 512, "l1")
        yield from ctx.wait(ctx.copy_in(l1, ctx.tensor("x"), 0, 512))
        a, b = ctx.alloc("a", 512, "l0a"), ctx.alloc("b", 512, "l0b")
        c = ctx.alloc("c", 1024, "l0c")
        ctx.ub_write(b, 0, np.zeros(512, np.uint8), ops=0)
        ctx.load_data(a, l1, 512)
        ctx.mmad(c, a, b, 16, 16, 16, "float16")  # no wait for MTE1: the cube's start is
        yield from ()                              # before LoadData's end

    m = mix_machine(aic_hw())
    m.ranks[0].tensor("x", np.zeros(512, np.uint8))
    with pytest.raises(KernelError, match=r"cube 'mmad' reads L0A buffer 'a' before"):
        launch(m, _aic0(body))


def test_int8_sums_past_2_24_stay_exact_through_fixpipe_rows_at_a_pitch():
    """An int8 mmad over K 2048 of 127 x -128 sums to -33292288 (past fp32's 2^24); an
    int32 FixPipe keeps it, and with dst_row_bytes its rows land one matrix row apart."""
    hw = aic_hw()
    m_, n_, k = 16, 16, 2048
    a = np.full((m_, k), 127, np.int8)
    b = np.full((k, n_), -128, np.int8)
    b[:, 1] = 1  # column 1: 127 * 2048

    def body(ctx):
        la, lb = ctx.alloc("a", m_ * k, "l0a"), ctx.alloc("b", k * n_, "l0b")
        lc = ctx.alloc("c", m_ * n_ * 4, "l0c")
        _fill(ctx, la, a)
        _fill(ctx, lb, b)
        yield from ctx.wait(ctx.mmad(lc, la, lb, m_, n_, k, "int8"))
        yield from ctx.wait(ctx.fixpipe(ctx.tensor("y"), lc, m_, n_, "int32",
                                        dst_offset=4 * 8, dst_row_bytes=4 * 40))

    m = mix_machine(hw)
    m.ranks[0].tensor("y", np.zeros((m_, 40), np.int32))
    launch(m, _aic0(body))
    y = m.ranks[0].tensors["y"].as_array(np.int32, (m_, 40))
    assert y[0, 8] == 127 * -128 * 2048 and y[0, 9] == 127 * 2048
    assert np.array_equal(y[:, 8:24], np.broadcast_to(y[0, 8:24], (m_, 16)))
    assert not y[:, :8].any() and not y[:, 24:].any()


def test_fixpipe_dequantises_per_channel_to_fp16_from_an_l1_scale():
    """The quant-pre path DispatchFFNCombine's GMM uses: int32 C times each column's fp32
    (the low half of a uint64 in L1), rounded to fp16 (RNE): 2049 * 0.5 = 1024.5 goes to
    the even 1024 (fp16 spacing 1 there), 2051 * 0.5 = 1025.5 to 1026."""
    hw = aic_hw()
    m_, n_, k = 16, 16, 32
    a = np.ones((m_, k), np.int8)
    b = np.zeros((k, n_), np.int8)
    b[0, 2:] = 1
    b[:16, 0], b[16, 0] = 127, 17  # column sums 16 * 127 + 17 = 2049
    b[:16, 1], b[16, 1] = 127, 19  # 2051
    scale = np.full(n_, 0.5, np.float32)
    scale[2] = 3.0

    def body(ctx):
        la, lb = ctx.alloc("a", m_ * k, "l0a"), ctx.alloc("b", k * n_, "l0b")
        lc = ctx.alloc("c", m_ * n_ * 4, "l0c")
        ls = ctx.alloc("scale", n_ * 8, "l1")
        _fill(ctx, la, a)
        _fill(ctx, lb, b)
        _fill(ctx, ls, scale.view(np.uint32).astype(np.uint64))
        yield from ctx.wait(ctx.mmad(lc, la, lb, m_, n_, k, "int8"))
        yield from ctx.wait(ctx.fixpipe(ctx.tensor("y"), lc, m_, n_, "float16",
                                        channel_scale=ls))

    m = mix_machine(hw)
    m.ranks[0].tensor("y", np.zeros((m_, n_), np.float16))
    launch(m, _aic0(body))
    y = m.ranks[0].tensors["y"].as_array(np.float16, (m_, n_))
    assert y[0, 0] == np.float16(1024.0) and y[15, 1] == np.float16(1026.0)
    assert y[3, 2] == np.float16(3.0) and y[5, 3] == np.float16(0.5)
