"""The A3 chain's DequantSwigluQuant cut-group kernel and its OnesLike: the key chosen as
CountTilingKey chooses it (cases worked by hand from its formula), the cut-group outputs
byte for byte against the numpy reference, and OnesLike's tiling and output."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.kernels.moe_layer import tiling as tl
from npusim.kernels.moe_layer.ones_like import ones_like_tiling
from tests.kernels.moe_layer.layerhelp import reference_of, run_layer

UB, AIV = 196608, 48  # the A3 preset's UB bytes and AIV cores


@pytest.mark.parametrize(("rows", "groups", "cut"), [
    (16, 32, True),  # 16 // 32 = 0 rows a group
    (512, 32, True),  # 16 a group: EACH_GROUP_TOKEN_LESS_THAN is inclusive
    (543, 32, True),  # 16 (integer division)
    (544, 32, False),  # 17
    (16, 31, False),  # fewer than CUT_GROUP_LARGE_THAN_32 groups
    (1024, 64, True),
])
def test_the_key_follows_count_tiling_key(rows, groups, cut):
    assert tl.dsq_cut_group(rows, groups) is cut
    assert tl.dsq_tiling(UB, AIV, rows, 256, groups).cut_group is cut


def test_cut_group_cores_by_hand():
    # maxPreCore_ = min(coreNum_, inDimx_): the rows when fewer than the AIV ...
    assert tl.dsq_tiling(UB, AIV, 16, 256, 32).cores == 16
    # ... else every AIV, past PERFORMANCE_CORE_NUM's 36 (the normal key's cap)
    t = tl.dsq_tiling(UB, AIV, 512, 4096, 32)
    assert (t.cut_group, t.cores, t.ub_rows) == (True, 48, 16384 // 4096)
    assert tl.dsq_tiling(UB, AIV, 544, 4096, 32).cores == 36


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize(("W", "k", "L", "bs"), [
    # A = 8 * 2 = 16 rows over 32 experts: 16 cores, groups 16..31 on a second turn
    (2, 2, 32, 4),
    # A = 12 * 3 = 36 rows: 36 cores, one turn
    (4, 3, 32, 3),
])
def test_cut_group_matches_the_reference(tmp_path, W, k, L, bs):
    assert tl.dsq_cut_group(W * bs * min(L, k), L)
    sc, res = run_layer(tmp_path, ep_world_size=W, k=k, experts_per_rank=L, bs=bs,
                        intermediate=256)
    want = reference_of(sc)
    ops = {o.op: o for o in res.ops}
    for r in range(W):
        st = want.stages[r]
        n = st.recv_x.shape[0]
        assert n > 0
        dsq = ops["dequant_swiglu_quant"].outputs[r]
        assert _bits(dsq["y"][:n]) == _bits(st.swiglu)
        assert _bits(dsq["scale"][:n]) == _bits(st.swiglu_scale)
        assert _bits(ops["low_latency_combine"].outputs[r]["combined_x"]) == _bits(want.y[r])


def test_ones_like_fills_its_tensor_first(tmp_path):
    _, res = run_layer(tmp_path)
    first = res.ops[0]
    assert first.op == "ones_like"
    for out in first.outputs:
        assert _bits(out["y"]) == _bits(np.ones(1, np.float32))


def test_ones_like_tiling_by_hand():
    # one fp32: 4 B under MIN_CHUNK_SIZE 4096 a core -> ceil(4 / 4096) = 1 core, one tile
    t = ones_like_tiling(1, 4, AIV, UB)
    assert (t.cores, t.former_num, t.former_length, t.former_tile) == (1, 1, 1, 1)
    # 100000 fp32 = 400000 B >= 4096 * 48: 48 cores; 100000 % 48 = 16 cores of 2084,
    # 32 of 2083; a tile holds at most 196608 / 4 / 2 = 24576 elements
    t = ones_like_tiling(100000, 4, AIV, UB)
    assert (t.cores, t.former_num, t.former_length, t.tail_length) == (48, 16, 2084, 2083)
    assert (t.former_tile, t.tail_tile) == (2084, 2083)
    # 2 000 000 elements: 41667 a core, in tiles of 24576
    assert ones_like_tiling(2 * 10 ** 6, 4, AIV, UB).former_tile == 24576
