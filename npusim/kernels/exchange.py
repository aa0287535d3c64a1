"""ExchangeFamily: what a MoE dispatch / combine family is, once for every such family.

A MoE exchange family runs `dispatch` (each rank sends its tokens' rows to the ranks holding
their experts), `combine` (the expert outputs go back and are summed per token) or both in
one run. What that means is the same for the CANN sample, ops-transformer's mc2, the SHMEM
ports, DeepEP and a user's own family, so it lives here:

- the MoE shape (`MoeShape`) and the ranges the family declares it takes (`shape_limits`);
- the three runs (`EXCHANGE_RUNS`) and the quantisations `npusim advise` may ask for;
- the chain from dispatch's outputs to combine's inputs (`Chain`), from which `op_inputs`
  and the digest of what combine reads (`next_reads`) follow without family code;
- seeded inputs from the scenario's `Routing` (`make_inputs`);
- the receive order every family's dispatch writes (`received`), on which each family's
  own reference builds its outputs;
- the memory estimate per token-expert pair.

A family on it keeps only its tiling, window, programs, misfits and its own reference
(`reference_dispatch`), and overrides a hook where its kernels really differ (a combine
that reads dequantised rows, a standalone combine that reads a case directory's rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from npusim.kernels.common.chain import last_count, next_reads_digest
from npusim.kernels.common.limits import DEFAULT_LIMITS
from npusim.kernels.family import Family, Touched
from npusim.kernels.kernel import Arrays
from npusim.workload.inputs import generate_inputs
from npusim.workload.routing import Routing
from npusim.workload.shape import MoeShape, ShapeLimits

DISPATCH, COMBINE = "dispatch", "combine"
EXCHANGE_RUNS: Mapping[str, tuple[str, ...]] = {
    DISPATCH: (DISPATCH,), COMBINE: (COMBINE,), "dispatch_combine": (DISPATCH, COMBINE)}
"""`workload.op` -> the kernels it runs, in order."""

QUANTS = ("none", "int8", "mxfp8")
"""The quantisation names `npusim advise` asks families for: none, INT8 (dispatch: per
token; combine: the family's INT8 communication quantisation), MXFP8 (dispatch)."""
PAIR_OF_RANKS_BYTES = 512  # a route and a flow group per pair of ranks (cached paths)


@dataclass(frozen=True)
class Chain:
    """What combine reads of dispatch's outputs, as data.

    `links` maps each of combine's input names to the dispatch output it is (the rest of
    combine's inputs are the run's own: x, expert_ids, expert_scales); `counts` names the
    dispatch output holding the running row count, whose entry `received_rows` picks says
    how many rows of each other linked output combine reads."""

    links: Mapping[str, str]
    counts: str
    dispatch: str = DISPATCH  # the kernel that writes them (a family's own name for it)
    combine: str = COMBINE  # the kernel that reads them
    # dispatch outputs combine reads only through `chained`, row by row (the scales a
    # combine that reads dequantised rows dequantises with)
    also: tuple[str, ...] = ()

    @property
    def rows(self) -> tuple[str, ...]:
        """The dispatch outputs combine reads row by row, up to the count."""
        return tuple(out for out in self.links.values() if out != self.counts) + self.also


@dataclass(frozen=True)
class Received:
    """What one rank receives in a dispatch, in the order its receive buffer holds it: by
    local expert, then by source rank, then in the source's (token, k) order. Every
    family's expand_x / assist rows are this order; the families differ in names, dtypes,
    capacities and what a row carries."""

    src: np.ndarray  # int64 [n]: the source rank of each received row
    token: np.ndarray  # int64 [n]: its token on the source
    k: np.ndarray  # int64 [n]: which of the token's K experts
    counts: np.ndarray  # int64 [L, W]: rows per (local expert, source)

    @property
    def n(self) -> int:
        return int(self.src.size)

    def triples(self, dtype: Any = np.int32) -> np.ndarray:
        """[n, 3] (source rank, token, k): the assist info of every row."""
        return np.stack([self.src, self.token, self.k], axis=1).astype(dtype)

    def running(self, dtype: Any = np.int32) -> np.ndarray:
        """[L * W] the running row count after each (local expert, source) entry."""
        return np.cumsum(self.counts.reshape(-1)).astype(dtype)

    def per_expert(self, dtype: Any = np.int64) -> np.ndarray:
        """[L] rows of each local expert."""
        return self.counts.sum(axis=1).astype(dtype)

    def rows(self, x: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """[n, H] the received token rows, taken from every source's x ([BS_r, H]), into
        `out` if given. Source by source: no copy of every source's x joined, which each
        rank's call would make again (29 MB at W 8 BS 256, H 7168)."""
        xs = [np.asarray(a) for a in x]
        if out is None:
            out = np.empty((self.n, *xs[0].shape[1:]), dtype=np.result_type(*xs))
        for s in np.unique(self.src).tolist():
            sel = self.src == s
            out[sel] = xs[s][self.token[sel]]
        return out


def received(ids: Sequence[np.ndarray], L: int, S_r: int = 0) -> list[Received]:
    """Per rank what a dispatch delivers, from every source's expert ids ([BS_r, K] each):
    expert e (0 <= e < E = (W - S_r) L) lives on rank S_r + e // L as its local expert
    e % L; ids outside [0, E) are sent nowhere. Ranks below S_r (shared-expert ranks)
    receive nothing here: their families route them on their own rule."""
    W = len(ids)
    E = (W - S_r) * L
    src, tok, kk, e = (np.concatenate(parts) if parts else np.zeros(0, np.int64)
                       for parts in zip(*(_pairs(s, np.asarray(a)) for s, a in enumerate(ids)),
                                        strict=True))
    ok = (e >= 0) & (e < E)
    src, tok, kk, e = src[ok], tok[ok], kk[ok], e[ok]
    order = np.argsort(e * W + src, kind="stable")  # (token, k) order kept inside an entry
    src, tok, kk, e = src[order], tok[order], kk[order], e[order]
    bounds = np.searchsorted(S_r + e // L, np.arange(W + 1))
    counts = np.bincount(e * W + src, minlength=E * W).reshape(W - S_r, L, W)
    out = []
    for d in range(W):
        lo, hi = bounds[d], bounds[d + 1]
        mine = counts[d - S_r] if d >= S_r else np.zeros((L, W), np.int64)
        out.append(Received(src[lo:hi], tok[lo:hi], kk[lo:hi], mine.astype(np.int64)))
    return out


def _pairs(src: int, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """(source, token, k, expert) of every pair of one source, in (token, k) order."""
    tok, kk = np.indices(ids.shape).reshape(2, -1)
    return (np.full(ids.size, src, np.int64), tok.astype(np.int64), kk.astype(np.int64),
            ids.reshape(-1).astype(np.int64))


class ExchangeFamily(Family):
    """A MoE dispatch / combine family: subclass, declare `chain`, `ops` (kernels named
    as the chain names them) and the tiling, window, programs and misfits, and give the
    family's own `reference_dispatch`."""

    uses_moe_shape = True
    shape_limits: ClassVar[ShapeLimits] = DEFAULT_LIMITS
    runs = EXCHANGE_RUNS
    # with a reference_dispatch: references = True; with a chain as well: chains = True
    # (the driver may then simulate combine ahead on the reference, npusim/sim.py)
    chain: ClassVar[Chain | None] = None
    # per name in QUANTS the options that select that quantisation on the dispatch and on
    # the combine side (a name it lacks: it cannot run that quantisation)
    dispatch_quants: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    combine_quants: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    # ---- inputs
    def make_inputs(self, shape: MoeShape, options: Mapping[str, Any], op: str,
                    routing: Routing, payload: bool) -> list[Arrays]:
        """The CANN sample's gen_data draw (npusim.workload.inputs): x, expert_ids from the
        routing, expert_scales, and a standalone combine's expand_x."""
        standalone = self.runs_of(options)[op][0] == COMBINE
        return generate_inputs(shape, **routing, with_combine=standalone,
                               payload=payload).per_rank()

    def op_inputs(self, kernel: str, tiling: Any, inputs: list[Arrays],
                  previous: list[Arrays] | None) -> list[Arrays]:
        """Dispatch reads the run's inputs; combine reads them plus what the chain links
        of dispatch's outputs (the reference's, when combine runs alone); without a chain
        every kernel reads the run's inputs."""
        if self.chain is None or kernel != self.chain.combine:
            return inputs
        if previous is None:
            previous = self.reference_dispatch(tiling, inputs)
        return [{**a, **linked} for a, linked
                in zip(inputs, self.chained(tiling, previous), strict=True)]

    def chained(self, tiling: Any, outputs: list[Arrays]) -> list[Arrays]:
        """Per rank combine's linked inputs from dispatch's outputs: the chain's renaming
        (a family whose combine reads them transformed overrides this)."""
        return [{into: o[out] for into, out in self.chain.links.items()} for o in outputs]

    # ---- reference and digest
    def reference_dispatch(self, tiling: Any, inputs: list[Arrays]) -> list[Arrays]:
        """What a correct dispatch writes on every rank (numpy), built on `received`."""
        raise NotImplementedError

    def reference_outputs(self, kernel: str, tiling: Any, inputs: list[Arrays]
                          ) -> list[Arrays] | None:
        first = self.chain.dispatch if self.chain is not None else DISPATCH
        return self.reference_dispatch(tiling, inputs) if kernel == first else None

    def received_rows(self, tiling: Any, rank: int, counts: np.ndarray) -> int:
        """Rows combine reads on `rank`: the running count's last entry."""
        return last_count(rank, counts)

    def next_reads(self, kernel: str, tiling: Any, inputs: list[Arrays],
                   outputs: list[Arrays]) -> bytes:
        assert self.chain is not None  # the registry holds chains = True to a chain
        return next_reads_digest(outputs, self.chain.counts, self.chain.rows,
                                 lambda r, c: self.received_rows(tiling, r, c))

    # ---- memory
    def pair_bytes(self, tiling: Any, op: str, timing_only: bool, workers: int) -> int:
        """Host memory per token-expert pair the run touches (window slots, output rows);
        0: not estimated."""
        return 0

    def touched(self, tiling: Any, shape: MoeShape, options: Mapping[str, Any], op: str,
                timing_only: bool, workers: int) -> Touched:
        """The MoE terms: every token-expert pair put by all ranks (W BS (K + S)) at the
        family's pair_bytes, a route per rank pair, and per rank x in, combine's x out and
        the reference (functional runs); a timing-only run is not held to it."""
        world = shape.W
        sends = world * shape.BS * (shape.K + shape.S)
        per_rank = 0 if timing_only else 3 * shape.BS * shape.token_bytes
        return Touched(pairs=sends * self.pair_bytes(tiling, op, timing_only, workers)
                       + world * world * PAIR_OF_RANKS_BYTES, ranks=world * per_rank,
                       sized_by="W or BS", binding=not timing_only)
