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

from collections.abc import Sequence

import numpy as np

from npusim.kernels.common.padded import padded_dispatch, returned


def reference_dispatch(x: Sequence[np.ndarray], ids: Sequence[np.ndarray], L: int
                       ) -> list[dict[str, np.ndarray]]:
    """x [W, BS, H], ids [W, BS, K] -> per rank expand_x, assist_info, ep_recv_count,
    expert_token_nums (W * BS * K rows: max_recv_tokens)."""
    BS, K = ids[0].shape
    return [{"expand_x": p.rows, "assist_info": p.triples, "ep_recv_count": p.running,
             "expert_token_nums": p.per_expert.astype(np.int32)}
            for p in padded_dispatch(x, ids, L, len(x) * BS * K)]


def reference_combine(expand_x: list[np.ndarray], assist: list[np.ndarray],
                      recv: list[np.ndarray], ids: np.ndarray, scales: np.ndarray,
                      E: int) -> list[np.ndarray]:
    """Per rank x_out [BS, H] from every rank's combine inputs."""
    W, BS, K = ids.shape
    rows = returned(expand_x, assist, recv, BS, K)  # what lands in each (token, k) slot
    out = []
    for s in range(W):
        acc = np.zeros((BS, rows.shape[3]), np.float32)
        for kk in range(K):
            valid = (ids[s, :, kk] >= 0) & (ids[s, :, kk] < E)
            term = rows[s, :, kk] * scales[s, :, kk, None].astype(np.float32)
            acc = np.where(valid[:, None], acc + term, acc).astype(np.float32)
        out.append(acc.astype(expand_x[0].dtype))
    return out
