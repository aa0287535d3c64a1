"""The mc2 window (Mc2MoeContext CCL buffer): slot sizes, offsets, the ccl_buffer_size default
and the fit check, against hand arithmetic from the operator's formulas."""

from __future__ import annotations

import pytest

from npusim.kernels.mc2.window import (
    CclBufferTooSmall,
    combine_slot_bytes,
    default_ccl_buffer_mb,
    dispatch_slot,
    low_latency_ccl_buffer_mb,
    mc2_window,
)

MiB = 1 << 20


def test_dispatch_slots_h7168():
    # int8: 7168 B data, fp32 scale at 7168, triplet at Align32(7172) = 7200, 7212 B moved
    s = dispatch_slot(7168, "int8")
    assert (s.scale_offset, s.triplet_offset, s.moved, s.slot, s.ub_row) == (
        7168, 7200, 7212, 7680, 7232)
    # bf16: 14336 B data, triplet at 14336, 14348 moved -> Align512 14848
    b = dispatch_slot(7168, "none")
    assert (b.scale_offset, b.triplet_offset, b.moved, b.slot) == (None, 14336, 14348, 14848)
    # expert scales add 4 B after the triplet, the slot stays 14848
    e = dispatch_slot(7168, "none", expert_scales=True)
    assert (e.expert_scale_offset, e.moved, e.slot) == (14348, 14352, 14848)
    # static int8 has no scale in the slot
    assert dispatch_slot(7168, "static_int8").moved == 7168 + 12


def test_combine_slots():
    assert combine_slot_bytes(7168, "arch22") == 14336  # Align512(14336)
    assert combine_slot_bytes(7168, "arch35") == 30 * 512  # ceil(14336 / 480) = 30 blocks
    assert combine_slot_bytes(4096, "arch35") == 18 * 512  # ceil(8192 / 480) = 18


def test_default_ccl_buffer_size_by_hand():
    # BS 32, W 16, L 16, H 7168, K 8: 2 * (32 * 14848 * 256 + 32 * 14336 * 8) = 239 MiB;
    # + 1 MiB = 240 MiB -> Align2(240) / 2 = 120
    assert low_latency_ccl_buffer_mb(32, 7168, 16, 16, 8, 0) == 120
    # BS 128, W 8, L 32: 2 * (128 * 14848 * 256 + 128 * 14336 * 8) = 1002438656 B;
    # + 1 MiB = 957 MiB (exactly) -> Align2 958 -> 479
    assert low_latency_ccl_buffer_mb(128, 7168, 8, 32, 8, 0) == 479
    # one shared expert adds BS slots of combine: 2 * 128 * 14336 more = 3.5 MiB -> 961 -> 481
    assert low_latency_ccl_buffer_mb(128, 7168, 8, 32, 8, 1) == 481


def test_too_small_buffer_is_one_line_naming_the_need():
    with pytest.raises(CclBufferTooSmall) as e:
        mc2_window(32, 7168, 16, 16, 8, 0, "int8", "arch22", ccl_mb=20, cores=48)
    msg = str(e.value)
    assert "\n" not in msg and "too SMALL" in msg
    assert "= 240 MB of CCL buffer" in msg and "ccl_buffer_size >= 120 MB" in msg
    assert "tokenNeedSizeDispatch 14848" in msg and "(K 8 + S 0)" in msg
    # the default itself fits
    w = mc2_window(32, 7168, 16, 16, 8, 0, "int8", "arch22", ccl_mb=120, cores=48)
    assert w.total_win == 240 * MiB - MiB - 16 * 1024


def test_offsets():
    w = mc2_window(4, 1024, 2, 2, 2, 1, "none", "arch22", ccl_mb=64, cores=48)
    half = (128 * MiB - MiB - 2 * 1024) // 2
    assert w.half == half
    # combine slot Align512(2048) = 2048; token 1, k 2 of K + S = 3 -> slot 5
    assert w.combine_slot_offset(1, 1, 2) == MiB + half + 5 * 2048
    assert w.combine_flag(1, 1, 2) == 64 * 1024 + 384 * 1024 + 5 * 32
    # dispatch slot Align512(2048 + 12) = 2560; block 3 = src 1 * L 2 + local 1
    combine_area = 4 * 3 * 2048
    assert w.dispatch_slot_offset(0, 3, 2) == MiB + combine_area + 3 * 4 * 2560 + 2 * 2560
    assert w.dispatch_status(1, 3) == 384 * 1024 + 3 * 32
    assert w.dispatch_state_word(5) == 768 * 1024 + 5 * 512
    assert w.combine_state_word(5) == 818 * 1024 + 5 * 512
    regs = sorted(w.regions(0).values())
    assert all(b <= a2 for (_, b), (a2, _) in zip(regs, regs[1:], strict=False))


def test_950_combine_slots_overrun_what_the_check_allows():
    # bf16, BS 128, W 8, L 32, K 8 on the 950 with the helper's 479 MB: the check passes
    # (1002438656 + 8 KiB <= 957 MiB), but the kernel's combine area is 128 * 8 * 15360 =
    # 15728640 B, not 14680064, and one half (501739520 B) cannot hold it with the
    # 486539264 B dispatch area
    with pytest.raises(CclBufferTooSmall, match="passes the operator's check"):
        mc2_window(128, 7168, 8, 32, 8, 0, "none", "arch35", ccl_mb=479, cores=64)
    # INT8 slots are half the size: it fits
    mc2_window(128, 7168, 8, 32, 8, 0, "int8", "arch35", ccl_mb=479, cores=64)


def test_950_int8_combine_stride():
    from npusim.kernels.mc2.window import a5_int8_combine_bytes, combine_stride_bytes

    # H 7168: 7168 int8 + 2 * (7168 / 8) B of scales = 8960 B; ceil(8960 / 480) = 19 blocks
    assert a5_int8_combine_bytes(7168) == 8960
    assert combine_stride_bytes(7168, "arch35", "int8") == 19 * 512
    # H 1056: Align32 1056 + 2 * Align128(1056) / 8 = 1056 + 288 = 1344 B -> 3 blocks
    assert a5_int8_combine_bytes(1056) == 1344
    assert combine_stride_bytes(1056, "arch35", "int8") == 3 * 512
    # A3 and unquantised: the area's slot (0 = no separate stride)
    assert combine_stride_bytes(7168, "arch22", "int8") == 0
    assert combine_stride_bytes(7168, "arch35", "none") == 0
    w = mc2_window(4, 1056, 2, 2, 2, 0, "none", "arch35", ccl_mb=64, cores=64,
                   combine_quant="int8")
    assert w.combine_slot == 5 * 512  # ceil(2112 / 480): the area dispatch places stays
    assert w.combine_slot_offset(0, 1, 1) - w.combine_slot_offset(0, 0, 0) == 3 * 3 * 512


def test_the_default_buffer_fits_the_950s_check_where_the_helper_falls_short():
    # BS 32, H 7168, W 8, L 4, K 8, fullmesh_v2: tokenNeedSizeDispatch = ceil((14336 + 44) /
    # 480) * 512 = 30 * 512 = 15360, combine Align512(14336) = 14336.
    # 2 * (32 * 15360 * 8 * 4 + 32 * 14336 * 8) = 2 * (15 MiB + 3.5 MiB) = 37 MiB; the
    # helper adds 1 MB: 38 MiB -> Align2(38) / 2 = 19 MB, a 38 MiB CCL buffer. The 950's
    # check needs 37 MiB + W 8 * 1 KiB + 1 MiB status = 38 MiB + 8 KiB: 19 is short, 20 fits
    assert low_latency_ccl_buffer_mb(32, 7168, 8, 4, 8, 0, "fullmesh_v2") == 19
    with pytest.raises(CclBufferTooSmall) as e:
        mc2_window(32, 7168, 8, 4, 8, 0, "int8", "arch35", ccl_mb=19, cores=64,
                   comm_alg="fullmesh_v2")
    assert "= 39 MB of CCL buffer, so ccl_buffer_size >= 20 MB" in str(e.value)
    assert default_ccl_buffer_mb(32, 7168, 8, 4, 8, 0, "arch35", "fullmesh_v2") == 20
    mc2_window(32, 7168, 8, 4, 8, 0, "int8", "arch35", ccl_mb=20, cores=64,
               comm_alg="fullmesh_v2")
    # A3's check has no per-rank term: the helper's value stands
    assert default_ccl_buffer_mb(32, 7168, 8, 4, 8, 0, "arch22", "fullmesh_v2") == 19
