"""What the TileLang dispatch and combine compute, in plain numpy (the tests' golden).

Dispatch, on rank d: entry i = le * W + src (expert d * L + le, source rank src) in
order; its rows are src's (token, k) pairs routed to that expert in (token, k) order.
expand_x_out row j is the token's x, expand_ids row j is [src, token, k],
ep_receive_count[i] the running row count after entry i, expert_token_nums_out[le] (int64)
the rows of local expert le. Rows past the received ones stay zero.

Combine, on rank s: combine_out[token] = bf16(RINT) of the fp32 sum, in k order from 0,
of fp32(row) * expert_scales[token, k], row being what the holder of (token, k)'s expert
sends back: its expand_x row whose triple is [s, token, k].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npusim.kernels.common.padded import padded_dispatch, returned
from npusim.kernels.tilelang_shmem.tiling import BF16


def reference_dispatch(x: Sequence[np.ndarray], ids: Sequence[np.ndarray], L: int
                       ) -> list[dict[str, np.ndarray]]:
    """x [W, Bs, H], ids [W, Bs, K] -> per rank the four dispatch outputs (W * Bs * L
    rows: expandXOut's)."""
    return [{"expand_x_out": p.rows, "expand_ids": p.triples, "ep_receive_count": p.running,
             "expert_token_nums_out": p.per_expert}
            for p in padded_dispatch(x, ids, L, len(x) * len(x[0]) * L)]


def reference_combine(expand_x: list[np.ndarray], triples: list[np.ndarray],
                      recv: list[np.ndarray], scales: np.ndarray) -> list[np.ndarray]:
    """Per rank combine_out [Bs, H] from every rank's combine inputs; scales [W, Bs, K]."""
    W, Bs, K = scales.shape
    back = returned(expand_x, triples, recv, Bs, K)
    out = []
    for s in range(W):
        acc = np.zeros((Bs, back.shape[3]), np.float32)
        for k in range(K):
            acc = (acc + (back[s, :, k] * scales[s, :, k, None]).astype(np.float32)
                   ).astype(np.float32)
        out.append(acc.astype(BF16))
    return out
