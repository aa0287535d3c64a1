"""`npusim run --tensors DIR`: every kernel's GM input and output tensors as .npy files.

    DIR/<op>/rank_<r>/in/<name>.npy     what the kernel read (as placed in GM)
    DIR/<op>/rank_<r>/out/<name>.npy    what it wrote (full buffers, as declared)

Names, dtypes and shapes are the ones the kernel family declares (for cann_sample the
CANN sample's file names), so a dump can be diffed against a device dump of the same
tensors. Each file is written atomically (numpy's .npy format, no pickles). The .npy
format has no bfloat16: such a tensor is stored as its uint16 bit patterns, the same
bytes (read it back with `np.load(f).view(ml_dtypes.bfloat16)`).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from npusim.report.io import write_bytes_atomic
from npusim.result import RunResult


def _npy(arr: np.ndarray) -> bytes:
    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":  # ml_dtypes' (numpy has none of its own)
        a = a.view(np.uint16)
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def write_tensors(out: str | Path, result: RunResult) -> list[Path]:
    """Write every op's per-rank inputs and outputs under `out`; the paths written."""
    root = Path(out)
    paths = []
    for op in result.ops:
        for side, per_rank in (("in", op.inputs), ("out", op.outputs)):
            for r, arrays in enumerate(per_rank):
                for name, arr in arrays.items():
                    p = root / op.op / f"rank_{r}" / side / f"{name}.npy"
                    paths.append(write_bytes_atomic(p, _npy(arr)))
    return paths
