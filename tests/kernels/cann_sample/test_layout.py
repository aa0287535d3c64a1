"""Record and window layouts: the numbers of docs/kernels/cann_sample.md and the sample headers."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.kernels.cann_sample.layout import (
    GiB,
    KiB,
    MiB,
    WindowLayout,
    combine_record_layout,
    cumsum_core_count,
    dispatch_record_layout,
    pack_record_to_slot,
    unpack_slot,
)
from npusim.units import align32, align256, align512, align_up


def test_align_helpers():
    assert align_up(223, 2) == 224 and align_up(224, 2) == 224
    assert align32(7169) == 7200 and align256(7169) == 7424 and align512(14336) == 14336
    assert align512(14337) == 14848


def test_h7168_records_match_kernels_md():
    mx = dispatch_record_layout(7168, "mxfp8")
    assert (mx.payload_bytes, mx.scale_bytes, mx.triplet_offset) == (7168, 224, 7392)
    assert (mx.record_bytes, mx.blocks, mx.slot_bytes) == (7424, 16, 8192)
    fp = dispatch_record_layout(7168, "none", "float16")
    assert (fp.triplet_offset, fp.record_bytes, fp.blocks, fp.slot_bytes) == (
        14336,
        14368,
        30,
        15360,
    )
    assert dispatch_record_layout(7168, "none", "bfloat16") == fp
    i8 = dispatch_record_layout(7168, "int8")
    # int8 data Align32(H), fp32 scale at 7168, triplet at Align32(7172) = 7200
    assert (i8.scale_offset, i8.scale_bytes, i8.triplet_offset) == (7168, 4, 7200)
    assert (i8.record_bytes, i8.blocks, i8.slot_bytes) == (7232, 16, 8192)


def test_other_h():
    # H = 4000: Align256 = 4096 fp8 bytes, ceil(4000/32) = 125 -> 126 scale bytes,
    # triplet at Align32(4222) = 4224, record 4256 -> ceil(4256/480) = 9 blocks
    mx = dispatch_record_layout(4000, "mxfp8")
    assert (mx.payload_bytes, mx.scale_bytes, mx.triplet_offset) == (4096, 126, 4224)
    assert (mx.record_bytes, mx.blocks, mx.slot_bytes) == (4256, 9, 4608)
    with pytest.raises(ValueError):
        dispatch_record_layout(4000, "fp4")


def test_combine_record():
    c = combine_record_layout(7168, "int8")
    assert (c.send_bytes, c.scale_offset, c.scale_count, c.slot_bytes) == (8960, 7168, 896, 14336)
    n = combine_record_layout(7168, "none")
    assert (n.send_bytes, n.slot_bytes) == (14336, 14336)


def test_pack_unpack_slot():
    lay = dispatch_record_layout(7168, "mxfp8")
    rec = (np.arange(lay.record_bytes) % 251).astype(np.uint8)
    slot = pack_record_to_slot(rec, lay)
    assert slot.size == 8192
    blocks = slot.reshape(16, 512)
    assert np.array_equal(blocks[0, :480], rec[:480])
    assert np.array_equal(blocks[1, :480], rec[480:960])
    assert (blocks[:, 480:].copy().view("<f4") == 1.0).all()
    back, arrived = unpack_slot(slot, lay)
    assert arrived and np.array_equal(back, rec)
    slot[5 * 512 + 480 : 5 * 512 + 484] = 0  # block 5 flag not yet written
    assert unpack_slot(slot, lay)[1] is False


def test_cumsum_core_count():
    assert cumsum_core_count(32, 64, 8, 4) == 1
    assert cumsum_core_count(256, 64, 32, 8) == 8
    assert cumsum_core_count(1024, 64, 64, 16) == 16
    assert cumsum_core_count(1024, 20, 64, 16) == 10
    assert cumsum_core_count(16, 64, 2, 1) == 1


def test_window_offsets():
    w = WindowLayout(W=8, BS=16, H=7168, K=8, L=4, quant="mxfp8")
    base = 1022 * MiB
    assert w.dispatch_status_entry(0, 0, 0) == base
    assert w.dispatch_status_entry(1, 2, 3) == base + 384 * KiB + (2 * 8 + 3) * 32
    assert w.data_state_word(5) == base + 768 * KiB + 5 * 512
    assert w.combine_flag(3, 2) == base + 64 * KiB + (3 * 8 + 2) * 32
    assert w.combine_slot(1, 2) == 10 * 14336
    combine_area = 16 * 8 * 14336
    assert w.dispatch_data_base(0) == combine_area
    assert w.dispatch_data_base(1) == 512 * MiB + combine_area
    assert w.dispatch_block(1, 2, 3) == 512 * MiB + combine_area + (2 * 4 + 3) * 16 * 8192
    assert w.dispatch_slot(0, 0, 1, 5) == combine_area + 1 * 16 * 8192 + 5 * 8192
    assert w.n_cumsum == 1
    assert w.cumsum_handoff_entry(0, 0) == base + 868 * KiB
    assert w.cumsum_ready_flag(7, 0) == base + 876 * KiB + 7 * 32
    w.validate()
    assert max(b for _, b in w.regions().values()) <= GiB


def test_window_validate_rejects_overflow():
    # BS*K*32 of combine flags runs into dispatch status state 1 (at 384 KiB)
    with pytest.raises(ValueError, match="overlap"):
        WindowLayout(W=2, BS=2048, H=128, K=8, L=1, quant="mxfp8").validate()
    # a data area larger than half the window
    with pytest.raises(ValueError):
        WindowLayout(W=64, BS=512, H=7168, K=8, L=4, quant="none").validate()
