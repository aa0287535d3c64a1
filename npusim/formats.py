"""The number formats of the MoE kernels: token dtypes, FP8 (E5M2, E4M3), FP4 (E2M1) and E8M0.

One table for every family, the kernels' recipes and the goldens alike. It holds facts of
the formats (OCP MX v1.0, as ml_dtypes implements them), not a way of quantising: the
recipes (:mod:`.recipes`) and the goldens (:mod:`.golden`) both read it and nothing else
of each other.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

TOKEN_DTYPE_NAMES = ("float16", "bfloat16")
"""Token dtypes by name; "bfloat16" is ml_dtypes' (the table below, built on first use)."""

MXFP8_BLOCK = 32
"""Elements sharing one E8M0 exponent (OCP MX block size)."""
E8M0_NAN = 0xFF
E8M0_PAD = 0x00
"""E8M0 byte for 2^-127: the value the sample pads the scale row with to an even count."""

FP4_E2M1_MAX = 6.0
FP4_E2M1_EMAX = 2
"""FP4 E2M1's largest value (1.5 * 2^2) and its exponent; it has no inf or NaN."""

FP8_NAN_BYTE = {"e5m2": 0x7E, "e4m3": 0x7F}
"""The positive quiet NaN byte of each format (what ml_dtypes casts a +NaN to)."""

POW2_F32 = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
"""2^k for k in [-149, 127] (every power of two fp32 holds), at index k + 149: multiplying by
one is a single correctly rounded operation, the same result as ldexp and much faster."""

_F16 = np.dtype(np.float16)


class Tables(NamedTuple):
    """The formats that are ml_dtypes types. Importing ml_dtypes costs a process over a
    second of CPU (it registers its casts and ufunc loops with numpy), as much as a small
    run's whole simulation, so the table is built on first use: a float16 run without
    quantisation never pays it."""

    ml: Any  # the ml_dtypes module
    bf16: np.dtype
    token_dtypes: dict[str, np.dtype]
    fp8_formats: dict[str, tuple[np.dtype, float, int]]
    """FP8 element format -> (ml_dtypes dtype, largest finite value, its unbiased exponent
    emax: 57344 = 1.75 * 2^15, 448 = 1.75 * 2^8)."""
    fp8_f32: dict[str, np.ndarray]  # fp32 value of every byte of each FP8 format
    e8m0: np.dtype
    fp4_e2m1: np.dtype  # one element per byte, the code in the low nibble


@functools.cache
def tables() -> Tables:
    """The ml_dtypes formats, built once per process (fork after it to share the work)."""
    ml = importlib.import_module("ml_dtypes")
    bf16 = np.dtype(ml.bfloat16)
    fp8 = {"e5m2": (np.dtype(ml.float8_e5m2), 57344.0, 15),
           "e4m3": (np.dtype(ml.float8_e4m3fn), 448.0, 8)}
    f32 = {k: np.arange(256, dtype=np.uint8).view(v[0]).astype(np.float32)
           for k, v in fp8.items()}
    return Tables(ml, bf16, {"float16": _F16, "bfloat16": bf16}, fp8, f32,
                  np.dtype(ml.float8_e8m0fnu), np.dtype(ml.float4_e2m1fn))


def may_need_tables(dtype: str, options: Mapping[str, Any]) -> bool:
    """Whether a run of this token dtype and these options may build :func:`tables`:
    bfloat16 tokens, or any quantisation option (an option named *_quant) other than
    "none". A caller that forks builds the table first when this holds, so that the
    processes share it instead of each paying for it."""
    return dtype == "bfloat16" or any(
        k.endswith("_quant") and v not in (None, "none") for k, v in options.items())


_LAZY = {"BF16": "bf16", "TOKEN_DTYPES": "token_dtypes", "FP8_FORMATS": "fp8_formats"}


def __getattr__(name: str) -> Any:
    """BF16, TOKEN_DTYPES and FP8_FORMATS, from the table built on first use."""
    if name in _LAZY:
        return getattr(tables(), _LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def token_dtype(name: str | np.dtype | type) -> np.dtype:
    """Resolve "float16" / "bfloat16" (or a numpy dtype) to the numpy dtype of a token."""
    if isinstance(name, str):
        if name == "float16":
            return _F16
        if name == "bfloat16":
            return tables().bf16
        raise ValueError(f"token dtype {name!r} not supported; allowed: "
                         f"{sorted(TOKEN_DTYPE_NAMES)}")
    dt = np.dtype(name)
    if dt == _F16:
        return dt
    if dt != tables().bf16:
        raise ValueError(f"token dtype {dt} not supported; allowed: {sorted(TOKEN_DTYPE_NAMES)}")
    return dt


def dtype_name(dt: np.dtype | str) -> str:
    """Inverse of :func:`token_dtype` (for file names, reports)."""
    return "float16" if token_dtype(dt) == _F16 else "bfloat16"


def fp8_format(name: str) -> tuple[np.dtype, float, int]:
    """(ml_dtypes dtype, largest finite value, its exponent) of "e5m2" or "e4m3"."""
    try:
        return tables().fp8_formats[name]
    except KeyError:
        raise ValueError(f"fp8 format {name!r}; allowed: {', '.join(FP8_NAN_BYTE)}") from None


def fp8_values(name: str) -> np.ndarray:
    """fp32 value of every byte of the format: a table lookup instead of a conversion."""
    fp8_format(name)  # a clear error for an unknown name
    return tables().fp8_f32[name]


def e8m0_bytes(s: np.ndarray) -> np.ndarray:
    """E8M0 bytes of biased exponents s in [0, 255] (255: NaN), by the ml_dtypes cast of
    2^(s - 127) (every such power of two is an fp32 value, so the cast is exact)."""
    s = np.asarray(s, dtype=np.int64)
    pow2 = POW2_F32[np.minimum(s, 254) - 127 + 149]
    pow2 = np.where(s == E8M0_NAN, np.float32(np.nan), pow2).astype(np.float32)
    return pow2.astype(tables().e8m0).view(np.uint8)


def e8m0_values(b: np.ndarray) -> np.ndarray:
    """fp32 value of E8M0 bytes (0xFF: NaN), by the ml_dtypes cast."""
    return np.ascontiguousarray(b, dtype=np.uint8).view(tables().e8m0).astype(
        np.float32)
