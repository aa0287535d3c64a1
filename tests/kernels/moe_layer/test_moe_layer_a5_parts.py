"""Form unfused on the Ascend 950, its parts: the host tilings at the A5 test's defaults
derived by hand from the ascend950 preset's buffers (L1 512 KiB, UB 256 KiB, 32 AICs, 64 AIVs), the
GroupedMatmul block walk covering every output, the reference's steps against hand
arithmetic, and the refusals."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from npusim.errors import InputError
from npusim.kernels.moe_layer.a5 import reference as ref
from npusim.kernels.moe_layer.a5 import tiling as tl
from tests.kernels.moe_layer.test_moe_layer_a5 import a5_scenario

AIC = SimpleNamespace(cores=32, l1_bytes=512 * 1024)
UB, AIV = 256 * 1024, 64
E4M3 = ml_dtypes.float8_e4m3fn


def test_gmm_tiling_at_the_defaults():
    # baseM = baseN = 256, baseK = 128 B of fp8; one depth of A, B and 4 scale columns
    # each: 2 x 32768 + 2 x 1024 = 67584 B; the largest power of two below 512 KiB /
    # 67584 is 4 (8 x 67584 > 524288); a second pass per side is (32768 + 1024) x 4 >
    # 2 x 64 KiB, so it keeps 4: stepKa = stepKb = 4 / 2
    for k, n in ((7168, 6144), (3072, 7168)):
        t = tl.mx_gmm_tiling(AIC, 1536, k, n, 8)
        assert (t.base_m, t.base_n, t.base_k) == (256, 256, 128)
        assert (t.depth_a1, t.depth_b1, t.step_ka, t.step_kb, t.cores) == (4, 4, 2, 2, 32)


def test_swiglu_tiling_at_the_defaults():
    # maxTileLen = 262144 / (2 x 3 x 2 + 2 x 4) = 13107 -> 13104; base columns from 3072
    # down in 256s: 768 columns x 13104 // 768 = 17 rows gives 91 x 4 = 364 tiles, the
    # fewest (3072: 4 rows, 384 tiles; 256: 51 rows, 372), all 64 AIVs busy
    t = tl.swiglu_tiling(UB, AIV, 1536, 3072)
    assert (t.base_rows, t.base_cols, t.cores, t.double_buffer) == (17, 768, 64, True)


def test_mx_quant_tiling_at_the_defaults():
    # 512-column slices: 1536 x 6 loops over 64 cores; 64 x 1 and 32 x 2 both divide
    # evenly (delta 0), the sort prefers fewer column tiles: 24 rows each, all columns;
    # a UB pass: (262144 - 2048) / (256 x 6 + 8 x 2 x 5) = 160 slices of 256 -> 1280 blocks
    t = tl.mx_quant_tiling(UB, AIV, 1536, 3072)
    assert (t.row_tiles, t.col_tiles, t.row_block, t.col_block) == (64, 1, 24, 3072)
    assert t.ub_blocks == 1280


@pytest.mark.parametrize("cores, counts, n", [(8, [300, 5], 384), (32, [0, 40, 0, 17], 200),
                                              (16, [33], 1000), (32, [3, 0, 70], 640)])
def test_gmm_blocks_cover_every_output_inside_its_group(cores, counts, n):
    t = tl.mx_gmm_tiling(SimpleNamespace(cores=cores, l1_bytes=512 * 1024), sum(counts),
                         256, n, len(counts))
    seen = np.zeros((sum(counts), n), int)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for c in range(cores):
        for g, r0, rows, c0, cols in tl.mx_blocks(t, counts, c):
            assert starts[g] <= r0 and r0 + rows <= starts[g + 1]
            assert rows <= t.base_m and cols <= t.base_n and c0 + cols <= n
            seen[r0:r0 + rows, c0:c0 + cols] += 1
    assert seen.min() == 1  # a split tail on wrapped indices may repeat a block


def _code(v: float) -> int:
    return int(np.array(v, E4M3).view(np.uint8))


def test_mx_gemm_by_hand():
    # K = 256: two L0 steps; x's first 32 values 1.0 at scale 2^1 (2.0), the rest 1.0 at
    # scale 2^-1 (0.5); w all 2.0 at scale 2^0: 32 x 4 + 224 x 1 = 352
    xq = np.full((1, 256), _code(1.0), np.uint8)
    xs = np.array([[128] + [126] * 7], np.uint8)
    wq = np.full((256, 2), _code(2.0), np.uint8)
    ws = np.full((8, 2), 127, np.uint8)
    got = ref.mx_gemm(xq, xs, wq, ws, "e4m3")
    assert got.dtype == ml_dtypes.bfloat16 and got.astype(np.float32).tolist() == [[352, 352]]


def test_swiglu_by_hand():
    y = np.array([[2.0, 0.0, 3.0, 5.0]], ml_dtypes.bfloat16)
    want = np.float32(2.0 / (1.0 + np.exp(-2.0)) * 3.0)  # silu(2) x 3; silu(0) x 5 = 0
    got = ref.swiglu(y).astype(np.float32)
    assert got[0, 1] == 0 and got[0, 0] == np.float32(ml_dtypes.bfloat16(want))


@pytest.mark.parametrize("change, key, words", [
    ({"weight_dtype": "int8"}, "workload.weight_dtype", "allowed: fp8_e4m3, fp8_e5m2"),
    ({"intermediate": 320}, "workload.intermediate", "multiples of 128"),
    ({"h": 1056}, "workload.h", "multiples of 64"),
    ({"bs": 600}, "workload.bs", "allowed: 1..512"),
    # the weights pick the chip's kernels; the preset must be that chip
    ({"hardware": "atlas_a3"}, "workload.weight_dtype", "allowed: int8"),
    ({"form": "dispatch_ffn_combine"}, "hardware", "allowed: atlas_a3"),
])
def test_refusals_name_the_key_and_the_limit(tmp_path, change, key, words):
    with pytest.raises(InputError) as info:
        a5_scenario(tmp_path, **change)
    err = info.value
    assert (err.key, words in err.message, "\n" in err.message) == (key, True, False)


def test_requant_reproduces_the_documented_example():
    # aclnnDynamicMxQuant's example (ops-nn docs/aclnnDynamicMxQuant.md, scaleAlg 0, rint,
    # FLOAT8_E4M3FN): bf16 (0, 8, 64, 512) -> scale 2^(floor(log2 512) - 8) = 2, E8M0 128;
    # y (0, 4, 32, 256) = codes (0, 72, 96, 120); the block's other 28 zeros change nothing
    row = np.zeros((1, 32), ml_dtypes.bfloat16)
    row[0, :4] = [0, 8, 64, 512]
    codes, scales = ref.mx_quantize_bf16(row, "e4m3")
    assert codes[0, :4].tolist() == [0, 72, 96, 120] and scales.tolist() == [[128]]
