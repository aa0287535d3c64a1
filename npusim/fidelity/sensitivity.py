"""Which assumed preset values an op's time depends on most, found by perturbing them."""

from __future__ import annotations

from npusim.fidelity.ledger import Assumed


def assumed_of(family: str, preset: str, op: str) -> tuple[Assumed, ...]:
    """The assumed values `op` of `family` on the shipped `preset` moves with most, largest
    effect first, from the shipped sensitivity record (() when there is none)."""
    return ()
