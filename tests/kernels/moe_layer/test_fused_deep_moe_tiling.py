"""FusedDeepMoe's host tiling and refusals (moe_layer/fused_deep_moe/tiling.py), by hand."""

from __future__ import annotations

import pytest

from npusim.hw.config import load_hardware
from npusim.kernels.moe_layer.family import FAMILY
from npusim.kernels.moe_layer.fused_deep_moe import tiling as ft
from npusim.workload.shape import MoeShape

A3 = load_hardware("atlas_a3")
OK = {"intermediate": 4096, "weight_dtype": "int8", "hccl_buffsize": 0}


def shape(**kw) -> MoeShape:
    base = {"W": 16, "BS": 256, "H": 7168, "K": 8, "L": 16, "dtype": "bfloat16"}
    base.update(kw)
    return MoeShape(**base)


def test_the_test_defaults_fit_and_their_sizes():
    s = shape()
    assert ft.fused_misfit(s, OK, A3) is None
    t = ft.fused_tiling(s, 4096, 24)
    assert t.capacity == 256 * 16 * 8
    assert t.record_bytes == 7168 + 512
    assert t.slot_bytes == 256 * 7168 * 2
    # the survey's 1.79 GB: 16 * 256 * 16 * 7168 * 2 * 2
    assert t.window_need_bytes == 1_879_048_192
    assert ft.least_hccl_buffsize_mb(t) == 1792
    assert t.quant_rows == 8  # min(8, 16384 // 2048)
    assert ft.fused_tiling(s, 6144, 24).quant_rows == 5  # 16384 // 3072
    assert t.gmm1_blocks(300) == 2 * 32
    assert t.gmm2_blocks(300) == 3 * 28


def test_a_dispatched_record_fits_its_slot_from_h_512():
    t = ft.fused_tiling(shape(H=512), 1024, 24)
    assert t.max_bs * t.record_bytes <= t.slot_bytes


@pytest.mark.parametrize(("kw", "opts", "key", "words"), [
    ({"BS": 257}, {}, "workload.bs", "allowed: 1..256"),
    ({"H": 256}, {}, "workload.h", "allowed: 512..7168"),
    ({"H": 7200}, {}, "workload.h", "160-164"),
    ({}, {"intermediate": 512}, "workload.intermediate", "allowed: 1024..6144"),
    ({}, {"intermediate": 1088}, "workload.intermediate", "multiples of 128"),
    ({"K": 13}, {}, "workload.k", "allowed: 1..12"),
    ({"L": 25, "W": 4}, {}, "workload.experts_per_rank", "aivNum / 2 = 24"),
    ({"L": 1}, {}, "workload.experts_per_rank", "shallow-dispatch"),
    ({"L": 24, "W": 32, "K": 2, "BS": 4}, {}, "workload.experts_per_rank", "<= 512"),
    ({"S": 1, "S_r": 1}, {}, "workload.shared_experts", "allowed: 0"),
    ({}, {"hccl_buffsize": 200}, "workload.hccl_buffsize", "allowed: at least 1792"),
    ({}, {"weight_dtype": "bfloat16"}, "workload.weight_dtype", "allowed: int8"),
])
def test_refusals_name_the_key_the_limit_and_the_source(kw, opts, key, words):
    got = ft.fused_misfit(shape(**kw), {**OK, **opts}, A3)
    assert got is not None
    assert got.key == key
    assert words in got.message
    assert "\n" not in got.message


def test_other_chips_are_refused():
    """The family's check: FusedDeepMoe has an A3 and an A5 build, none for the A2."""
    got = FAMILY.misfit(shape(), {**OK, "form": "fused_deep_moe"}, load_hardware("atlas_a2"),
                        "moe_layer")
    assert got is not None and got.key == "hardware"
    assert "allowed: atlas_a3, ascend950" in got.message


def test_global_bs_sets_max_bs():
    s = shape(W=2, global_bs=512)
    assert ft.fused_misfit(s, OK, A3) is None
    assert ft.fused_tiling(s, 4096, 24).max_bs == 256
