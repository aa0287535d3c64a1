"""FusedDeepMoe's window layout (moe_layer/fused_deep_moe/window.py), by hand."""

from __future__ import annotations

from npusim.kernels.moe_layer.fused_deep_moe.tiling import FusedTiling
from npusim.kernels.moe_layer.fused_deep_moe.window import FusedWindow, fits_status
from npusim.units import KiB

T = FusedTiling(W=4, BS=8, max_bs=8, H=1024, K=2, L=3, n1=1024, aic=24)


def test_slots_records_and_their_tail():
    w = FusedWindow(T)
    slot = 8 * 1024 * 2
    assert w.t.data_half_bytes == 4 * 3 * slot
    # rank 2's window, state 1, source 1, local expert 2, third token
    at = w.record(2, 1, 1, 2, 2)
    assert at == 4 * 3 * slot + 2 * 512 + (1 * 3 + 2) * slot + 2 * (1024 + 512)
    assert w.scale(at) == at + 1024 and w.flag(at) == at + 1028
    # every record of a full slot stays in it
    assert w.record(0, 0, 0, 0, 7) + 1024 + 512 <= w.slot(0, 0, 0, 1)
    assert w.combine_row(1, 0, 3, 1, 5) == 512 + (3 * 3 + 1) * slot + 5 * 2048


def test_status_follows_the_data_and_keeps_its_offsets():
    w = FusedWindow(T)
    assert w.status % 512 == 0 and w.status >= w.data_bytes
    assert w.status_entry(1, 3) == w.status + 512 * KiB + 3 * 512
    assert w.data_state_word(5) == w.status + 900 * KiB + 160
    assert w.group_line(2) == w.status + 932 * KiB + 256
    assert w.soft_sync(3) == w.status + 964 * KiB + 1536
    assert w.window_bytes == w.status + 1024 * KiB
    for owner in (0, 3):
        r = w.regions(owner)
        ends = [r[k] for k in ("data_state0", "data_state1", "status_state0",
                               "status_state1", "data_state_words", "group_lines",
                               "soft_sync")]
        assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False))
        assert r["data_state0"][0] == owner * 512


def test_status_capacity_at_the_limits():
    assert fits_status(FusedTiling(W=32, BS=1, max_bs=1, H=512, K=1, L=16, n1=1024, aic=24), 48)
    assert not fits_status(FusedTiling(W=64, BS=1, max_bs=1, H=512, K=1, L=16, n1=1024,
                                       aic=24), 48)
