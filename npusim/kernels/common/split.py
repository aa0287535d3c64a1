"""SplitToCore: how the MoE kernels cut a range of items over cores."""

from __future__ import annotations


def split_to_core(n: int, parts: int, index: int) -> tuple[int, int]:
    """Items [start, end) of part ``index`` when n items go over ``parts``: the first
    n % parts parts take one more."""
    q, r = divmod(n, parts)
    if index < r:
        start = index * (q + 1)
        return start, start + q + 1
    start = index * q + r
    return start, start + q


def split_share(n: int, parts: int, index: int) -> tuple[int, int]:
    """The same split as (start, count): how the TileLang kernels and MegaMoE's
    SplitWorkAcrossVectorCores name a core's share."""
    start, end = split_to_core(n, parts, index)
    return start, end - start
