"""A dispatch's outputs as the SHMEM ports write them, in plain numpy (their goldens).

The hicann/shmem classic examples and the article's TileLang and pyPTO kernels all write
what a rank receives (npusim.kernels.exchange.received: by local expert, then source, then
the source's (token, k) order) into a fixed-capacity buffer whose rows past the received
ones stay zero, a (source rank, token, k) triple per row and the running count per
(local expert, source) entry; their combines send each row back to the triple's slot.
Only the names, the capacity and the per-expert dtype differ, so the families name the
fields of `Padded` and the sums of `returned` their own way. The three move the tokens as
they are, with one kernel each way: `PaddedExchange` is what their families declare alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from npusim.kernels.exchange import Chain, ExchangeFamily, received
from npusim.kernels.family import Variant
from npusim.kernels.kernel import Kernel, TensorSpec, const


@dataclass(frozen=True)
class Padded:
    """One rank's dispatch outputs."""

    rows: np.ndarray  # [capacity, H] the received token rows, zero past the count
    triples: np.ndarray  # [capacity, 3] int32 (source rank, token, k) of each row
    running: np.ndarray  # [W * L] int32 running row count after entry le * W + src
    per_expert: np.ndarray  # [L] int64 rows of each local expert


def padded_specs(dtype: Any, names: tuple[str, str, str], capacity: str
                 ) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    """The rows, triples and running counts of `Padded` as a family's tensors: its names for
    them, the rows' dtype, and how its capacity (the tiling's max_recv) is written."""
    rows, triples, running = names
    return (TensorSpec(rows, dtype, lambda t, r: (t.max_recv, t.H),
                       f"[{capacity}, H] received rows by (local expert, source)"),
            TensorSpec(triples, const(np.int32), lambda t, r: (t.max_recv, 3),
                       f"[{capacity}, 3] (source rank, token, k) of each row"),
            TensorSpec(running, const(np.int32), lambda t, r: (t.W * t.L,),
                       "[W*L] running row count after entry le*W + src"))


def per_expert_spec(name: str, dtype: Any, help: str) -> TensorSpec:
    """`Padded.per_expert` as a family's [L] tensor of the integer `dtype`."""
    return TensorSpec(name, const(dtype), lambda t, r: (t.L,), help)


def padded_chain(dispatch: Kernel, combine: Kernel) -> Chain:
    """Combine reads dispatch's `Padded` back: its first three inputs are dispatch's first
    three outputs (the rows, the triples, the running counts, as `padded_specs` declares
    them), up to the last running count."""
    outs = [spec.name for spec in dispatch.outputs[:3]]
    return Chain({spec.name: out for spec, out in zip(combine.inputs[:3], outs, strict=True)},
                 counts=outs[2])


class PaddedExchange(ExchangeFamily):
    """A SHMEM port's family: it moves the tokens as they are (one variant, no
    quantisation either way), its reference_dispatch gives `Padded`'s fields, its combine
    reads them back (`padded_chain`) and its tiling holds its window."""

    references = True  # reference_dispatch
    chains = True
    variants = (Variant(""),)
    dispatch_quants = {"none": {}}
    combine_quants = {"none": {}}

    def window(self, tiling: Any) -> Any:
        return tiling.window


def padded_dispatch(x: Sequence[np.ndarray], ids: Sequence[np.ndarray], L: int,
                    capacity: int) -> list[Padded]:
    """Per rank what the dispatch writes, from every source's x [BS, H] and expert ids
    [BS, K] (expert e on rank e // L)."""
    H, dtype = x[0].shape[1], x[0].dtype
    out = []
    for got in received(ids, L):
        rows = np.zeros((capacity, H), dtype)
        triples = np.zeros((capacity, 3), np.int32)
        rows[:got.n] = got.rows(x)
        triples[:got.n] = got.triples()
        out.append(Padded(rows, triples, got.running(), got.per_expert()))
    return out


def returned(rows: Sequence[np.ndarray], triples: Sequence[np.ndarray],
             counts: Sequence[np.ndarray], BS: int, K: int) -> np.ndarray:
    """[W, BS, K, H] fp32: the row that comes back to each (source rank, token, k) slot in
    a combine, from every rank's combine inputs (its first counts[-1] rows and triples);
    zero where none does."""
    back = np.zeros((len(rows), BS, K, rows[0].shape[1]), np.float32)
    for x, tri, c in zip(rows, triples, counts, strict=True):
        n = int(c[-1]) if len(c) else 0
        src, tok, k = np.asarray(tri[:n], np.int64).T
        back[src, tok, k] = x[:n].astype(np.float32)
    return back
