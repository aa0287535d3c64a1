"""The number formats of the MoE kernels: token dtypes, FP8 (E5M2, E4M3) and E8M0.

One table for every family, the kernels' recipes and the goldens alike. It holds facts of
the formats (OCP MX v1.0, as ml_dtypes implements them), not a way of quantising: the
recipes (:mod:`.recipes`) and the goldens (:mod:`.golden`) both read it and nothing else
of each other.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
TOKEN_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16}

MXFP8_BLOCK = 32
"""Elements sharing one E8M0 exponent (OCP MX block size)."""
E8M0_NAN = 0xFF
E8M0_PAD = 0x00
"""E8M0 byte for 2^-127: the value the sample pads the scale row with to an even count."""

FP8_FORMATS: dict[str, tuple[np.dtype, float, int]] = {
    "e5m2": (np.dtype(ml_dtypes.float8_e5m2), 57344.0, 15),
    "e4m3": (np.dtype(ml_dtypes.float8_e4m3fn), 448.0, 8),
}
"""FP8 element format -> (ml_dtypes dtype, largest finite value, its unbiased exponent
emax: 57344 = 1.75 * 2^15, 448 = 1.75 * 2^8)."""
FP8_NAN_BYTE = {"e5m2": 0x7E, "e4m3": 0x7F}
"""The positive quiet NaN byte of each format (what ml_dtypes casts a +NaN to)."""

POW2_F32 = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
"""2^k for k in [-149, 127] (every power of two fp32 holds), at index k + 149: multiplying by
one is a single correctly rounded operation, the same result as ldexp and much faster."""
_FP8_F32 = {k: np.arange(256, dtype=np.uint8).view(v[0]).astype(np.float32)
            for k, v in FP8_FORMATS.items()}


def token_dtype(name: str | np.dtype | type) -> np.dtype:
    """Resolve "float16" / "bfloat16" (or a numpy dtype) to the numpy dtype of a token."""
    if isinstance(name, str):
        try:
            return TOKEN_DTYPES[name]
        except KeyError:
            raise ValueError(
                f"token dtype {name!r} not supported; allowed: {sorted(TOKEN_DTYPES)}"
            ) from None
    dt = np.dtype(name)
    if dt not in TOKEN_DTYPES.values():
        raise ValueError(f"token dtype {dt} not supported; allowed: {sorted(TOKEN_DTYPES)}")
    return dt


def dtype_name(dt: np.dtype | str) -> str:
    """Inverse of :func:`token_dtype` (for file names, reports)."""
    dt = token_dtype(dt)
    return next(k for k, v in TOKEN_DTYPES.items() if v == dt)


def fp8_format(name: str) -> tuple[np.dtype, float, int]:
    """(ml_dtypes dtype, largest finite value, its exponent) of "e5m2" or "e4m3"."""
    try:
        return FP8_FORMATS[name]
    except KeyError:
        raise ValueError(f"fp8 format {name!r}; allowed: {', '.join(FP8_FORMATS)}") from None


def fp8_values(name: str) -> np.ndarray:
    """fp32 value of every byte of the format: a table lookup instead of a conversion."""
    fp8_format(name)  # a clear error for an unknown name
    return _FP8_F32[name]


def e8m0_bytes(s: np.ndarray) -> np.ndarray:
    """E8M0 bytes of biased exponents s in [0, 255] (255: NaN), by the ml_dtypes cast of
    2^(s - 127) (every such power of two is an fp32 value, so the cast is exact)."""
    s = np.asarray(s, dtype=np.int64)
    pow2 = POW2_F32[np.minimum(s, 254) - 127 + 149]
    pow2 = np.where(s == E8M0_NAN, np.float32(np.nan), pow2).astype(np.float32)
    return pow2.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)


def e8m0_values(b: np.ndarray) -> np.ndarray:
    """fp32 value of E8M0 bytes (0xFF: NaN), by the ml_dtypes cast."""
    return np.ascontiguousarray(b, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(
        np.float32)
