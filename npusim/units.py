"""Ceil, Align and byte units: the integer arithmetic every layer sizes things with.

Named as the Ascend C kernels name them (Ceil, Align, UB_ALIGN, WIN_ADDR_ALIGN); the
hardware model, the runtime and the kernels all round with these, so a size computed in
two layers is computed one way.
"""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def ceil_div(a: int, b: int) -> int:
    """Ceil(a, b): how many b-sized pieces cover a."""
    return -(-a // b)


def align_up(x: int, a: int) -> int:
    """Align(x, a): x rounded up to a multiple of a."""
    return -(-x // a) * a


def align32(x: int) -> int:
    """UB_ALIGN: a UB block, a status entry."""
    return align_up(x, 32)


def align256(x: int) -> int:
    """A vector repeat: 256 B."""
    return align_up(x, 256)


def align512(x: int) -> int:
    """WIN_ADDR_ALIGN: a window slot."""
    return align_up(x, 512)
