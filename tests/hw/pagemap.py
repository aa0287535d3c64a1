"""The /proc/self/pagemap entries of an array's pages, for tests of what memory backs."""

from __future__ import annotations

import mmap
import struct

import numpy as np

PAGE = mmap.PAGESIZE


def entries(arr: np.ndarray) -> list[int] | None:
    """One 64-bit entry per page of arr (bit 63: present; bit 56: mapped only here, which
    the kernel's shared zero page never is); None where the file is not readable."""
    first, last = arr.ctypes.data // PAGE, (arr.ctypes.data + arr.nbytes - 1) // PAGE
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            raw = f.read((last - first + 1) * 8)
    except OSError:
        return None
    return [e for (e,) in struct.iter_unpack("<Q", raw)]
