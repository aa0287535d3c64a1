"""What DeepEP-Ascend's normal mode computes, in numpy, from its documented semantics.

Written from the API's meaning (python/deep_ep doc/NORMAL_API.md, deep_ep.cpp's tensors),
not from the simulated kernels: layout counts from topk_idx; the count exchange as the
prefix sums each receiver needs; dispatch as "every (token, k) of every source lands once,
ordered by (local expert, source rank, token)"; combine as the fp32 weighted sum of the K
returned rows in k order, cast once with round-to-nearest-even.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npusim.kernels.exchange import received

F32 = np.float32


@dataclass(frozen=True)
class Sizes:
    W: int
    E: int
    K: int
    round: int  # rounds the buffers are sized for
    per_round_tokens: int

    @property
    def L(self) -> int:
        return self.E // self.W


def token_round(t: int, s: Sizes) -> int:
    return t // s.per_round_tokens


def layout(idx: np.ndarray, s: Sizes) -> dict[str, np.ndarray]:
    """get_dispatch_layout: per-round expert counts, per-rank token counts, is_token_in_rank,
    and each (token, k)'s place among this round's sends to its expert."""
    bs = idx.shape[0]
    per_expert = np.zeros((s.round, s.E), np.int32)
    in_rank = np.zeros((bs, s.W), np.int32)
    slot = np.zeros((bs, s.K), np.int32)
    for t in range(bs):
        r = token_round(t, s)
        for k in range(s.K):
            e = int(idx[t, k])
            if 0 <= e < s.E:
                slot[t, k] = per_expert[r, e]
                per_expert[r, e] += 1
                in_rank[t, e // s.L] = 1
    return {"num_tokens_per_rank": in_rank.sum(axis=0, dtype=np.int32),
            "num_tokens_per_expert": per_expert, "is_token_in_rank": in_rank,
            "send_token_idx_small": slot}


def notify(per_expert: list[np.ndarray], bs: list[int], s: Sizes) -> list[dict[str, np.ndarray]]:
    """notify_dispatch on every rank, from every rank's per-round expert counts."""
    W, L, R = s.W, s.L, s.round
    send_offset = [np.concatenate([np.zeros((R, 1), np.int64), np.cumsum(c, axis=1)[:, :-1]],
                                  axis=1).astype(np.int32) for c in per_expert]
    out = []
    for me in range(W):
        # cnt[r, le, src]: what src sends to my local expert le in round r
        cnt = np.stack([per_expert[src][:, me * L:(me + 1) * L] for src in range(W)], axis=2)
        flat = cnt.reshape(R, L * W)  # index le * W + src
        recv_offset = np.stack([send_offset[src][:, me * L:(me + 1) * L] for src in range(W)],
                               axis=2).reshape(R, L * W)
        per_pair = cnt.sum(axis=0)  # [le, src] over rounds
        per_le = per_pair.sum(axis=1)
        src_off = np.concatenate([np.zeros((L, 1), np.int64), np.cumsum(per_pair, axis=1)[:, :-1]],
                                 axis=1)
        r_off = np.concatenate([np.zeros((1, L, W), np.int64), np.cumsum(cnt, axis=0)[:-1]],
                               axis=0)  # [r, le, src]
        out.append({
            "send_data_offset": send_offset[me],
            "recv_count": np.cumsum(flat, axis=1).astype(np.int32),
            "recv_offset": recv_offset.astype(np.int32),
            "expert_global_offset": (np.cumsum(per_le) - per_le).astype(np.int32),
            "srcrank_in_expert_offset": src_off.reshape(-1).astype(np.int32),
            "r_in_srcrank_offset": np.transpose(r_off, (1, 2, 0)).reshape(-1).astype(np.int32),
            "total_recv_token": np.array([cnt.sum()], np.int32),
            "max_bs": np.array([max(bs)], np.int32),
            "recv_tokens_per_expert": cnt.sum(axis=2).reshape(-1).astype(np.int32),
        })
    return out


def int8_quantize(row: np.ndarray) -> tuple[np.ndarray, F32]:
    """Per-token dynamic INT8 of cam_moe_dispatch_normal: d = 127 / (max|x| + 1e-12) in fp32,
    q = rint(x d) (exact through the int32 and half casts), scale = 1 / d."""
    xf = row.astype(F32)
    d = F32(127.0) / (np.max(np.abs(xf)) + F32(1e-12))
    q = np.rint(xf * d).astype(np.int8)
    return q, F32(F32(1.0) / d)


def source_triples(idxs: list[np.ndarray], s: Sizes) -> list[np.ndarray]:
    """Every rank's received (source rank, token, k), ordered by (local expert, source rank,
    token): the handle's recv_src_idx, from the routing alone (the shared receive order)."""
    return [got.triples() for got in received(idxs, s.L)]


def dispatch(xs: list[np.ndarray], idxs: list[np.ndarray], s: Sizes, quant: str
             ) -> list[dict[str, np.ndarray]]:
    """Every rank's received rows in source_triples' order, each with its (source rank,
    token, k) and, for int8, its scale."""
    out = []
    h = xs[0].shape[1]
    for triple in source_triples(idxs, s):
        n = triple.shape[0]
        rows = np.zeros((n, h), np.int8 if quant == "int8" else xs[0].dtype)
        scales = np.zeros(n, F32)
        for i, (src, t, _k) in enumerate(triple):
            if quant == "int8":
                rows[i], scales[i] = int8_quantize(xs[src][t])
            else:
                rows[i] = xs[src][t]
        out.append({"recv_x": rows, "dynamic_scales": scales, "expand_idx": triple.reshape(-1)})
    return out


def _weighted_sums(rows: list[np.ndarray], triples: list[np.ndarray], idx: list[np.ndarray],
                   weights: list[np.ndarray], terms: Callable[[np.ndarray], list[int]]
                   ) -> list[np.ndarray]:
    """x[t] = cast(fp32 sum over k in terms(topk ids of t), in that order, of fp32(the row
    sent back for (t, k)) * w[t, k]), one multiply and one add per term."""
    W = len(rows)
    back: list[dict[tuple[int, int], np.ndarray]] = [{} for _ in range(W)]
    for r in range(W):
        for i, (src, t, k) in enumerate(triples[r].reshape(-1, 3)):
            back[int(src)][(int(t), int(k))] = rows[r][i]
    out = []
    for src in range(W):
        bs = idx[src].shape[0]
        h = rows[0].shape[1]
        x = np.zeros((bs, h), rows[0].dtype)
        for t in range(bs):
            acc = np.zeros(h, F32)
            for k in terms(idx[src][t]):
                acc = acc + back[src][(t, k)].astype(F32) * F32(weights[src][t, k])
            x[t] = acc.astype(rows[0].dtype)
        out.append(x)
    return out


def combine(rows: list[np.ndarray], triples: list[np.ndarray], idx: list[np.ndarray],
            weights: list[np.ndarray], E: int) -> list[np.ndarray]:
    """The valid k (an expert id in [0, E)) in k order."""
    return _weighted_sums(rows, triples, idx, weights,
                          lambda ids: [k for k, e in enumerate(ids) if 0 <= int(e) < E])


# ---- the A2 layered low-latency dispatch: the combine's reduce info in ep_recv_count
SERVER = 8  # ranks per A2 server


def _ranked(keys: list[tuple[int, ...]]) -> np.ndarray:
    """Each item's index in the order of `keys` (ties kept in list order)."""
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    rank = np.empty(len(keys), np.int64)
    rank[order] = np.arange(len(keys))
    return rank


def layered_reduce_info(idxs: list[np.ndarray], me: int, L: int, global_bs: int,
                        cores: int) -> np.ndarray:
    """ep_recv_count of rank `me` after its E counts (left 0 here), as int32 words.

    Per source server s (rank src = s * 8 + me % 8 relays to `me`) the tokens of src with an
    expert in me's server, in token order: innerCnt is the running count of their hits here,
    the tokens taken by their lowest expert here, then in order (int16, min(tokens + cores,
    global_bs) words); innerOffset is every hit's row in the combine's layout: the target
    rank's block (rank in server * global_bs * K) plus its place among that rank's hits from
    src ordered by (expert, token). Then of `me`'s own tokens: outerCnt, the running count
    of the servers each goes to; per (token, server) in that order the row in the combine's
    layout (server * BS * K plus the hits of server s's earlier (lowest expert, token)
    pairs) and the hits there."""
    W = len(idxs)
    S = W // SERVER
    bs, K = idxs[me].shape
    E = W * L
    per = SERVER * L
    mine = me // SERVER
    inner_cnt = E * 4
    inner_idx = inner_cnt + global_bs * S * 2
    outer_cnt = inner_idx + global_bs * K * S * 4
    outer_idx = outer_cnt + bs * 4
    per_server_at = outer_idx + bs * S * 4
    out = np.zeros(E + 2 * global_bs * K * S, np.int32)
    raw = out.view(np.uint8)

    def put(at: int, values: np.ndarray) -> None:
        b = np.ascontiguousarray(values).view(np.uint8)
        raw[at:at + b.size] = b

    for s in range(S):
        cnt, offs = _inner_reduce_info(idxs[s * SERVER + me % SERVER], mine, L, global_bs,
                                       cores)
        if offs.size:
            put(inner_idx + global_bs * K * s * 4, offs)
        put(inner_cnt + global_bs * s * 2, cnt)
    servers, rows, hits = _outer_reduce_info(idxs[me], S, per)
    put(outer_cnt, np.cumsum(servers).astype(np.int32))
    put(outer_idx, rows)
    put(per_server_at, hits)
    return out


def _inner_reduce_info(ids: np.ndarray, mine: int, L: int, global_bs: int, cores: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(innerCnt, innerOffset) of one source's tokens with an expert in server `mine`:
    the running hit count in (lowest expert here, token) order, and every hit's row in
    the combine's layout (empty without tokens)."""
    bs, K = ids.shape
    per = SERVER * L
    here = [t for t in range(bs) if any(mine * per <= int(e) < (mine + 1) * per
                                        for e in ids[t])]
    hits = [(j, k, int(ids[t, k])) for j, t in enumerate(here) for k in range(K)
            if mine * per <= int(ids[t, k]) < (mine + 1) * per]
    n = len(here)
    cnt = np.zeros(n + cores, np.int16)
    if not n:
        return cnt[:min(n + cores, global_bs)], np.zeros(0, np.int32)
    first = [min(e for jj, _, e in hits if jj == j) for j in range(n)]
    order = sorted(range(n), key=lambda j: (first[j], j))
    per_tok = np.array([sum(1 for jj, _, _ in hits if jj == j) for j in order])
    cnt[:n] = np.cumsum(per_tok)
    # place of each hit among its target rank's hits by (expert, token)
    place = {}
    for rr in range(SERVER):
        mine_hits = [h for h in hits if (h[2] % per) // L == rr]
        ranks = _ranked([(h[2], h[0]) for h in mine_hits])
        for h, r in zip(mine_hits, ranks, strict=True):
            place[h[:2]] = rr * global_bs * K + int(r)
    offs = np.zeros(n * K, np.int32)
    i = 0
    for j in order:
        for k in range(K):
            if (j, k) in place:
                offs[i] = place[(j, k)]
                i += 1
    return cnt[:min(n + cores, global_bs)], offs


def _outer_reduce_info(ids: np.ndarray, S: int, per: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of a rank's own tokens: the servers each goes to, then per (token, server) in that
    order its row in the combine's layout (server * BS * K plus the hits of the server's
    earlier (lowest expert, token) pairs) and its hits there."""
    bs, K = ids.shape
    pairs = [(t, s) for t in range(bs) for s in range(S)
             if any(int(e) // per == s for e in ids[t])]
    low = {p: min(int(e) for e in ids[p[0]] if int(e) // per == p[1]) for p in pairs}
    nhit = {p: sum(1 for e in ids[p[0]] if int(e) // per == p[1]) for p in pairs}
    row = {}
    for s in range(S):
        mine_pairs = sorted((p for p in pairs if p[1] == s), key=lambda p: (low[p], p[0]))
        acc = 0
        for p in mine_pairs:
            row[p] = s * bs * K + acc
            acc += nhit[p]
    servers = np.array([sum(1 for p in pairs if p[0] == t) for t in range(bs)], np.int32)
    return (servers, np.array([row[p] for p in pairs], np.int32),
            np.array([nhit[p] for p in pairs], np.int32))


def layered_combine(rows: list[np.ndarray], triples: list[np.ndarray], idx: list[np.ndarray],
                    weights: list[np.ndarray], L: int) -> list[np.ndarray]:
    """The A2 layered combine: the terms server by server (the servers of the experts
    ascending) and in k order inside a server, as the rows come back grouped by server."""
    per = SERVER * L
    return _weighted_sums(rows, triples, idx, weights,
                          lambda ids: sorted(range(len(ids)),
                                             key=lambda k: (int(ids[k]) // per, k)))
