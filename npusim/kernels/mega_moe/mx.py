"""The kernel's own MXFP8 arithmetic, step by step as the vector and cube units do it
(the effects of the program's instructions; the reference computes the same numbers its
own way, from the OCP definition):

- ComputeMaxExp: per 32 bf16 elements the largest exponent field (bits & 0x7F80);
- ComputeScale: E8M0 byte s = max(maxexp - emax, 0) and the inverse scale 2^(127 - s)
  as bf16 bits (254 - s) << 7;
- ComputeFp8Data: x * inverse in fp32, saturated, cast to FP8 round-to-nearest-even;
- MmadMx: an L0 K chunk's fp32 products of codes times 2^(s - 127), added to L0C;
- FixPipe: L0C fp32 to bf16 (RNE).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}
EMAX = {"e4m3": 8, "e5m2": 15}
MAXV = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}
_VALUE = {m: np.arange(256, dtype=np.uint8).view(dt).astype(np.float32) for m, dt in FP8.items()}
_POW2 = np.ldexp(np.float32(1.0), np.arange(-127, 128)).astype(np.float32)  # index s


def quantize_rows(x: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """bf16 rows [n, D] (D % 32 == 0) -> (FP8 codes [n, D] uint8, E8M0 [n, D/32] uint8)."""
    n, d = x.shape
    bits = np.ascontiguousarray(x, BF16).view(np.uint16).reshape(n, d // 32, 32)
    maxexp = ((bits & np.uint16(0x7F80)) >> np.uint16(7)).max(axis=-1).astype(np.int32)
    s = np.clip(maxexp - EMAX[mode], 0, 253)
    inverse = ((254 - s).astype(np.uint16) << np.uint16(7)).view(BF16).astype(np.float32)
    scaled = x.astype(np.float32).reshape(n, d // 32, 32) * inverse[..., None]
    np.clip(scaled, -MAXV[mode], MAXV[mode], out=scaled)
    codes = scaled.astype(FP8[mode]).view(np.uint8).reshape(n, d)
    return codes, s.astype(np.uint8)


def mx_values(codes: np.ndarray, scales: np.ndarray, mode: str) -> np.ndarray:
    """fp32 values of codes [.., D] with scales [.., D/32] (exact products)."""
    v = _VALUE[mode][codes]
    *lead, d = v.shape
    return (v.reshape(*lead, d // 32, 32) * _POW2[scales][..., None]).reshape(*lead, d)


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
