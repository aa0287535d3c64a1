"""What kernel families share (npusim.kernels.common), against hand arithmetic."""

from __future__ import annotations

import hashlib

import numpy as np

from npusim.hw.memory import RowTable
from npusim.kernels.common.chain import digest_rows, next_reads_digest
from npusim.kernels.common.heap import Heap
from npusim.kernels.common.mix import MixLaunch
from npusim.kernels.common.split import split_to_core
from npusim.kernels.common.status import StatusLayout
from npusim.units import align32, align256, align512, align_up, ceil_div
from npusim.workload.routing import Routing, make_routing

KiB = 1024


def test_align_and_ceil():
    assert ceil_div(7169, 32) == 225 and ceil_div(0, 32) == 0
    assert align32(7169) == 7200 and align256(7169) == 7424 and align512(14337) == 14848
    assert align_up(223, 2) == 224


def test_split_to_core_hands_the_remainder_to_the_first_parts():
    # 10 items over 4 cores: 3, 3, 2, 2
    assert [split_to_core(10, 4, i) for i in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert split_to_core(2, 4, 3) == (2, 2)


def test_heap_stacks_aligned_starts_and_regions_run_to_the_next_start():
    h = Heap((("a", 100), ("b", 512), ("c", 8)), 512)
    assert h.start == {"a": 0, "b": 512, "c": 1024} and h.end == 1032
    assert h.regions() == {"a": (0, 512), "b": (512, 1024), "c": (1024, 1032)}
    assert Heap((("a", 3), ("b", 5))).regions() == {"a": (0, 3), "b": (3, 8)}


def test_mix_launch_has_two_aivs_per_block():
    class Launch(MixLaunch):
        block_dim = 24

    assert Launch().cores == 24 and Launch().aiv_num == 48


def test_status_offsets_from_the_base():
    # the sample's status MiB at 1022 MiB, W 4, K + S = 9 slots per token
    base = 1022 * KiB * KiB
    st = StatusLayout(base, 4, 9)
    assert st.dispatch_status(1, 2 * 4 + 3) == base + 384 * KiB + 11 * 32
    assert st.combine_flag(0, 5, 2) == base + 64 * KiB + (5 * 9 + 2) * 32
    assert st.dispatch_state_word(7) == base + 768 * KiB + 7 * 512
    assert StatusLayout(0, 4, 9).combine_state_word(3) == 818 * KiB + 3 * 512
    # count-core tables of n_cs = 3: row 2 of the partial sums, column 1 of the flags
    assert st.cumsum_cal(3, 2, 1) == base + 868 * KiB + (2 * 3 + 1) * 32
    assert st.cumsum_flag(3, 5) == base + 876 * KiB + 5 * 3 * 32
    assert st.cumsum_flag_zone(3, 8) == (base + 876 * KiB, base + 876 * KiB + 8 * 3 * 32)


def test_digest_reads_rows_up_to_the_count_only():
    recv = np.array([1, 2], np.int32)
    a = {"ep_recv_count": recv, "expand_x": np.arange(8, dtype=np.int16).reshape(4, 2)}
    b = {**a, "expand_x": a["expand_x"].copy()}
    b["expand_x"][3] = 99  # beyond the count: combine never reads it
    assert next_reads_digest([a], "ep_recv_count", ["expand_x"]) == \
        next_reads_digest([b], "ep_recv_count", ["expand_x"])
    b["expand_x"][1] = 99
    assert next_reads_digest([a], "ep_recv_count", ["expand_x"]) != \
        next_reads_digest([b], "ep_recv_count", ["expand_x"])


def _digest(a: object, rows: int | None = None) -> bytes:
    h = hashlib.sha256()
    digest_rows(h, a, rows)
    return h.digest()


def test_a_tensor_of_zero_rows_hashes_without_being_made():
    """A RowTable of 2**26 rows of 14 KiB (1 TiB) hashes by its picks: no memory, no time."""
    huge = RowTable.zeros(2**26, 14336)
    assert _digest(huge, 5000) == _digest(RowTable.zeros(2**26, 14336), 5000)
    assert _digest(huge, 5000) != _digest(huge, 5001)  # a row more read
    assert _digest(huge) != _digest(RowTable.zeros(2**26 + 1, 14336))  # another shape
    table = np.arange(6, dtype=np.uint8).reshape(2, 3)
    a = RowTable(table, np.array([0, 1, 1]), 4)
    b = RowTable(table, np.array([0, 1, 0]), 4)
    assert _digest(a, 2) == _digest(b, 2)  # they differ in row 2 only
    assert _digest(a, 3) != _digest(b, 3)


def test_an_array_hashes_its_rows_read_and_its_shape():
    a = np.zeros((6, 4), np.int16)
    b = a.copy()
    b[5, 0] = 1
    assert _digest(a, 5) == _digest(b, 5)
    assert _digest(a, 6) != _digest(b, 6)
    assert _digest(a, 5) != _digest(a[:5], 5)  # a tensor of other rows allocated
    assert _digest(a, 5) != _digest(a.view(np.uint16), 5)


def test_routing_draws_as_make_routing_and_reads_as_keywords():
    r = Routing(kind="zipf", seed=3)
    assert r.zipf_s == 1.2 and dict(r) == {"routing": "zipf", "seed": 3, "zipf_s": 1.2}
    got = r.expert_ids(2, 4, 2, 8, np.random.default_rng(0))
    want = make_routing("zipf", 2, 4, 2, 8, rng=np.random.default_rng(0), zipf_s=1.2)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert dict(Routing(kind="lognormal", sigma=0.5))["sigma"] == 0.5
