"""The kernel's own cube arithmetic, step by step as the cube unit does it (the effects
of the program's instructions; the reference computes the same numbers its own way). The
MXFP8 quantisation (ComputeMaxExp, ComputeScale, ComputeFp8Data) is
``npusim.kernels.quant.recipes.mx_quantize_bf16``.

- MmadMx: an L0 K chunk's fp32 products of codes times 2^(s - 127), added to L0C;
- FixPipe: L0C fp32 to bf16 (RNE).
"""

from __future__ import annotations

import numpy as np

from npusim.formats import BF16
from npusim.kernels.quant.recipes import mx_values


def mmad(acc: np.ndarray, a: np.ndarray, a_s: np.ndarray, b: np.ndarray, b_s: np.ndarray,
         mode: str) -> None:
    """acc [m, n] fp32 += A [m, k] x B^T, B stored [n, k] (ColumnMajor), one L0 K chunk."""
    acc += mx_values(a, a_s, mode) @ mx_values(b, b_s, mode).T


def fixpipe_bf16(acc: np.ndarray) -> np.ndarray:
    return acc.astype(np.float32).astype(BF16)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(g) * u in fp32 (MicroAPI Exp, Div), to bf16."""
    g = gate.astype(np.float32)
    with np.errstate(over="ignore"):
        a = g / (np.float32(1.0) + np.exp(-g)) * up.astype(np.float32)
    return a.astype(BF16)
