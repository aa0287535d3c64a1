"""The doubleplane segment rule (DispatchUseSdma / CombineUseSdma): remote, not empty, at
least 2 MiB, and strictly above the average remote segment; cases by hand."""

from __future__ import annotations

import numpy as np

from npusim.kernels.shmem_doubleplane.rule import (
    MIN_SDMA_BYTES,
    combine_plan,
    dispatch_plan,
    threshold_den,
    use_sdma,
)

ROW = 7168 * 2  # H 7168 fp16: 14336 B; 2 MiB / 14336 = 146.3 rows


def test_threshold_den_counts_the_remote_segments():
    assert threshold_den(8, 4) == 28
    assert threshold_den(1, 4) == 4  # max(W - 1, 1)


def test_a_local_or_empty_segment_never_takes_sdma():
    huge = 10 ** 9
    assert not use_sdma(3, 3, 10_000, ROW, 0, 28)
    assert not use_sdma(2, 3, 0, ROW, 0, 28)
    assert not use_sdma(2, 3, 10_000, ROW, 0, 0)  # no remote segments at all
    assert use_sdma(2, 3, 10_000, ROW, huge, 28)  # 143 MB * 28 > 1 GB


def test_two_mib_is_the_floor():
    assert 146 * ROW < MIN_SDMA_BYTES <= 147 * ROW
    assert not use_sdma(1, 0, 146, ROW, 0, 6)
    assert use_sdma(1, 0, 147, ROW, 0, 6)
    assert use_sdma(1, 0, 128, 16384, 0, 1)  # exactly 2 MiB (H 8192 bf16) is enough


def test_the_segment_must_be_strictly_above_the_average_remote_segment():
    # W 4, L 2: 6 remote segments; 200 rows against 1000 remote rows (average 166.7)
    assert use_sdma(1, 0, 200, ROW, 1000 * ROW, 6)
    assert not use_sdma(1, 0, 200, ROW, 1200 * ROW, 6)  # exactly the average: MTE
    # W 2, L 1: the only remote segment is the average itself, so never SDMA
    assert not use_sdma(1, 0, 500, ROW, 500 * ROW, 1)


def test_dispatch_plan_on_a_skewed_rank():
    # W 4, L 1, BS 256, K 1 on rank 0: 200 pairs to rank 1, 40 to rank 2, 16 kept
    ids = np.array([1] * 200 + [2] * 40 + [0] * 16, np.int32).reshape(256, 1)
    plan = dispatch_plan(ids, 0, 4, 1, ROW)
    # remote 240 rows over 3 remote segments (80 average); only rank 1's 200 rows
    # (2.87 MB) pass both tests; rank 2's 40 rows are under 2 MiB; rank 0 is local
    assert plan[:, 0].tolist() == [False, True, False, False]


def test_combine_plan_reads_the_segments_from_ep_recv_count():
    # rank 2, W 3, L 2: segment (le, src) counts [[300, 10, 0], [5, 0, 150]]
    counts = np.array([[300, 10, 0], [5, 0, 150]])
    plan = combine_plan(np.cumsum(counts.reshape(-1)), 2, 3, 2, ROW)
    # remote rows 300 + 10 + 5 = 315 over den 4: average 78.75 rows; src 0 le 0 (300
    # rows, 4.3 MB) only; (le 1, src 2) is the rank's own
    assert plan.tolist() == [[True, False], [False, False], [False, False]]


def test_the_quota_quiets_after_every_256_sdma_puts():
    from npusim.kernels.shmem_doubleplane.planes import Quota

    class Stub:
        def __init__(self):
            self.log = []

        def put_nbi(self, *args):
            self.log.append("put")
            yield from ()

        def quiet(self):
            self.log.append("quiet")
            yield from ()

    class Ctx:
        def scalar(self, n):
            pass

    stub = Stub()
    quota = Quota(stub)
    for _ in range(600):
        list(quota.put(Ctx()))
    assert stub.log.count("put") == 600 and quota.quiets == 2
    assert [i for i, e in enumerate(stub.log) if e == "quiet"] == [256, 513]
    assert quota.outstanding == 600 - 512  # the kernel's final sdma_quiet takes these
