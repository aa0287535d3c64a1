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

import numpy as np

from npusim.kernels.tilelang_shmem.tiling import BF16


def reference_dispatch(x: np.ndarray, ids: np.ndarray, L: int) -> list[dict[str, np.ndarray]]:
    """x [W, Bs, H], ids [W, Bs, K] -> per rank the four dispatch outputs."""
    W, Bs, H = x.shape
    rows = W * Bs * L
    out = []
    for d in range(W):
        expand = np.zeros((rows, H), x.dtype)
        triples = np.zeros((rows, 3), np.int32)
        recv = np.zeros(W * L, np.int32)
        nums = np.zeros(L, np.int64)
        j = 0
        for le in range(L):
            for src in range(W):
                flat = np.flatnonzero(ids[src].reshape(-1) == d * L + le)
                tok, k = np.divmod(flat, ids.shape[2])
                expand[j:j + flat.size] = x[src, tok]
                triples[j:j + flat.size, 0] = src
                triples[j:j + flat.size, 1] = tok
                triples[j:j + flat.size, 2] = k
                j += flat.size
                recv[le * W + src] = j
                nums[le] += flat.size
        out.append({"expand_x_out": expand, "expand_ids": triples, "ep_receive_count": recv,
                    "expert_token_nums_out": nums})
    return out


def reference_combine(expand_x: list[np.ndarray], triples: list[np.ndarray],
                      recv: list[np.ndarray], scales: np.ndarray) -> list[np.ndarray]:
    """Per rank combine_out [Bs, H] from every rank's combine inputs; scales [W, Bs, K]."""
    W, Bs, K = scales.shape
    H = expand_x[0].shape[1]
    back = np.zeros((W, Bs, K, H), np.float32)
    for r in range(W):
        for j in range(int(recv[r][-1])):
            src, tok, k = (int(v) for v in triples[r][j])
            back[src, tok, k] = expand_x[r][j].astype(np.float32)
    out = []
    for s in range(W):
        acc = np.zeros((Bs, H), np.float32)
        for k in range(K):
            acc = (acc + (back[s, :, k] * scales[s, :, k, None]).astype(np.float32)
                   ).astype(np.float32)
        out.append(acc.astype(BF16))
    return out
