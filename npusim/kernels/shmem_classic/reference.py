"""The semantics of dispatch_classic / combine_classic in plain numpy (no runtime), the
golden of the tests: what every rank's outputs must hold, element for element.

Dispatch: rank d receives, for each local expert le (expert d * L + le) and each source
rank s in order, s's (token, k) pairs routed to that expert in (token, k) order. Row j of
expand_x is the token's x; assist_info row j is [s, token, k]; ep_recv_count[le * W + s]
is the running row count after segment (le, s); expert_token_nums[le] the rows of le.
Rows past the received ones stay zero.

Combine: x_out[token] = T(sum over k, in k order, of float32(row) * scale) in float32,
where row is the expert output the rank holding (token, k)'s expert sends back (the
expand_x row whose assist is [me, token, k]); ids outside [0, E) add nothing.
"""

from __future__ import annotations

import numpy as np


def reference_dispatch(x: np.ndarray, ids: np.ndarray, L: int) -> list[dict[str, np.ndarray]]:
    """x [W, BS, H], ids [W, BS, K] -> per rank expand_x, assist_info, ep_recv_count,
    expert_token_nums."""
    W, BS, H = x.shape
    K = ids.shape[2]
    out = []
    for d in range(W):
        expand = np.zeros((W * BS * K, H), x.dtype)
        assist = np.zeros((W * BS * K, 3), np.int32)
        recv = np.zeros(W * L, np.int32)
        nums = np.zeros(L, np.int32)
        row = 0
        for le in range(L):
            e = d * L + le
            for s in range(W):
                tok, kk = np.nonzero(ids[s] == e)  # row-major: (token, k) order
                n = tok.size
                expand[row:row + n] = x[s, tok]
                assist[row:row + n] = np.stack([np.full(n, s), tok, kk], axis=1)
                row += n
                recv[le * W + s] = row
                nums[le] += n
        out.append({"expand_x": expand, "assist_info": assist, "ep_recv_count": recv,
                    "expert_token_nums": nums})
    return out


def reference_combine(expand_x: list[np.ndarray], assist: list[np.ndarray],
                      recv: list[np.ndarray], ids: np.ndarray, scales: np.ndarray,
                      E: int) -> list[np.ndarray]:
    """Per rank x_out [BS, H] from every rank's combine inputs."""
    W, BS, K = ids.shape
    H = expand_x[0].shape[1]
    dtype = expand_x[0].dtype
    rows = np.zeros((W, BS, K, H), np.float32)  # what lands in each (token, k) slot
    for r in range(W):
        n = int(recv[r][-1])
        for j in range(n):
            s, tok, kk = (int(v) for v in assist[r][j])
            rows[s, tok, kk] = expand_x[r][j].astype(np.float32)
    out = []
    for s in range(W):
        acc = np.zeros((BS, H), np.float32)
        for kk in range(K):
            valid = (ids[s, :, kk] >= 0) & (ids[s, :, kk] < E)
            term = rows[s, :, kk] * scales[s, :, kk, None].astype(np.float32)
            acc = np.where(valid[:, None], acc + term, acc).astype(np.float32)
        out.append(acc.astype(dtype))
    return out
