"""Which (peer, local expert) segments the doubleplane kernels send through the SDMA
engine (DispatchUseSdma / CombineUseSdma in hicann/shmem's *_doubleplane_kernel.cpp).

A segment of `count` rows of `row_bytes` (h * sizeof(T)) to or from `peer` goes by SDMA
when the peer is another rank, the segment is not empty, holds at least 2 MiB and holds
more than the average remote segment of this rank: bytes * den > num with
num = remote_tokens * row_bytes (every (token, k) pair of this rank crossing to another
rank) and den = max(W - 1, 1) * L (the remote segments). Every other segment goes by MTE.
Plain integers, no runtime: the kernels call it per segment, the tests and the report's
plane accounting call it on whole routings.
"""

from __future__ import annotations

import numpy as np

MIN_SDMA_BYTES = 2 << 20  # MIN_SDMA_BYTES: 2 MiB
SDMA_ISSUE_LIMIT = 256  # an sdma_quiet after every 256 SDMA puts


def threshold_den(world: int, local_experts: int) -> int:
    """DispatchThresholdDen / CombineThresholdDen: the count of remote segments."""
    return max(world - 1, 1) * local_experts


def use_sdma(peer: int, me: int, count: int, row_bytes: int, num: int, den: int) -> bool:
    """DispatchUseSdma / CombineUseSdma for one segment."""
    if peer == me or count <= 0 or den == 0:
        return False
    nbytes = count * row_bytes
    return nbytes >= MIN_SDMA_BYTES and nbytes * den > num


def dispatch_plan(ids: np.ndarray, me: int, world: int, local_experts: int,
                  row_bytes: int) -> np.ndarray:
    """[W, L] bool: which segments (dst, le) rank `me` sends by SDMA, from its expert_ids
    [BS, K] (dispatch: remote_tokens counts its pairs routed off the rank)."""
    dst = ids.reshape(-1) // local_experts
    counts = np.zeros((world, local_experts), np.int64)
    np.add.at(counts, (dst, ids.reshape(-1) % local_experts), 1)
    num = int((dst != me).sum()) * row_bytes
    den = threshold_den(world, local_experts)
    return np.array([[use_sdma(d, me, int(counts[d, le]), row_bytes, num, den)
                      for le in range(local_experts)] for d in range(world)], dtype=bool)


def combine_plan(ep_recv_count: np.ndarray, me: int, world: int, local_experts: int,
                 row_bytes: int) -> np.ndarray:
    """[W, L] bool: which segments (src, le) rank `me` sends back by SDMA, from its
    ep_recv_count [W * L] (CombineThresholdNum: the rows received from other ranks)."""
    ends = np.asarray(ep_recv_count, np.int64).reshape(local_experts, world)
    counts = np.diff(np.concatenate([[0], ends.reshape(-1)])).reshape(local_experts, world)
    remote = int(counts.sum() - counts[:, me].sum())
    num, den = remote * row_bytes, threshold_den(world, local_experts)
    return np.array([[use_sdma(s, me, int(counts[le, s]), row_bytes, num, den)
                      for le in range(local_experts)] for s in range(world)], dtype=bool)
