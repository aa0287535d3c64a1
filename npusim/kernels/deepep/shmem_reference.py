"""What ShmemNotifyDispatch computes, in numpy, from its outputs' meaning (deep_ep.cpp's
SHMEM branch): the family's chain uses it when a run starts after notify (`op: combine`).
The SHMEM dispatch's rows are the HCCL dispatch's recv_x (the same order: local expert,
source rank, token), so reference.dispatch serves both."""

from __future__ import annotations

import numpy as np


def notify(counts: list[np.ndarray], K: int) -> list[dict[str, np.ndarray]]:
    """Every rank's outputs from every rank's num_tokens_per_expert [E]: put_offset[e R + s]
    is where source s's first row for expert e lands on e's rank (rows by local expert,
    then source); total_recv_tokens the most rows any rank receives; max_bs the most pairs
    any rank sends, over K; recv_tokens_per_expert this rank's rows per local expert."""
    cnt = np.stack([np.asarray(c, np.int64).reshape(-1) for c in counts])  # [s, e]
    W, E = cnt.shape
    L = E // W
    per_dst = cnt.T.reshape(W, L * W)  # [q, le * W + s]
    put = (np.cumsum(per_dst, axis=1) - per_dst).reshape(-1).astype(np.int32)
    total = np.array([most_recv_rows(cnt)], np.int32)
    max_bs = np.array([cnt.sum(axis=1).max() // K], np.int32)
    return [{"recv_data": cnt.astype(np.int32), "put_offset": put,
             "total_recv_tokens": total, "max_bs": max_bs,
             "recv_tokens_per_expert": cnt[:, q * L:(q + 1) * L].sum(axis=0).astype(np.int64)}
            for q in range(W)]


def most_recv_rows(counts: np.ndarray) -> int:
    """totalRecvTokens from every rank's counts [source, E]: the rows of the rank that
    receives most (expert e lives on rank e // L)."""
    W = counts.shape[0]
    return int(counts.reshape(W, W, -1).sum(axis=(0, 2)).max())


def routed_counts(topk_idx: list[np.ndarray], E: int) -> np.ndarray:
    """dispatch_layout's num_tokens_per_expert of every rank [source, E] (ids < 0 unsent)."""
    return np.stack([np.bincount(ids[ids >= 0].ravel(), minlength=E) for ids in topk_idx])
