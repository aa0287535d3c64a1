"""Ceil and Align of the Ascend C kernels: byte counts rounded up to a block or a row."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """Ceil(a, b): how many b-sized pieces cover a."""
    return -(-a // b)


def align_up(x: int, a: int) -> int:
    """Align(x, a): x rounded up to a multiple of a."""
    return -(-x // a) * a


def align32(x: int) -> int:
    """UB_ALIGN: a UB block, a status entry."""
    return -(-x // 32) * 32


def align256(x: int) -> int:
    """A vector repeat: 256 B."""
    return -(-x // 256) * 256


def align512(x: int) -> int:
    """WIN_ADDR_ALIGN: a window slot."""
    return -(-x // 512) * 512
