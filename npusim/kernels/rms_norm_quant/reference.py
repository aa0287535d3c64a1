"""RmsNormQuant references.

`golden` is gen_data.py's rms_norm_quant_numpy: y = int8(clip(x / sqrt(mean(x^2) + eps)
* gamma * scale + offset)), the product by 1/std, truncation toward zero. The sample
accepts a kernel whose output is within 1 of it.

`reference` is the same formula in the arithmetic each step's source prescribes, so a
faithful kernel matches it exactly: float32 throughout; steps 0-5 divide x by the RMS,
step 6 multiplies by an rstd from Div + Sqrt refined by one Newton and one Halley step;
steps 0-2 round to float16 and int8 to nearest even (CAST_NONE, CAST_RINT), steps 3-6
truncate (CAST_TRUNC); int8 saturates. The sum of squares is taken in float64 and rounded
once, which equals the kernels' float32 sums whenever those are exact (integer-valued x
with sum(x^2) < 2^24, as the exactness tests use)."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def golden(x: np.ndarray, gamma: np.ndarray, scale: np.ndarray, offset: np.ndarray,
           eps: float = 1e-6) -> np.ndarray:
    """gen_data.py, line by line in meaning."""
    x = x.astype(F32)
    variance = np.mean(np.power(x, 2), axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(variance + eps)
    y = (x * rstd) * gamma.astype(F32)
    y = y * scale.astype(F32) + offset.astype(F32)
    return y.clip(-128, 127).astype(np.int8)


def _to_f16(v: np.ndarray, trunc: bool) -> np.ndarray:
    h = v.astype(np.float16)
    if trunc:
        h = np.where(np.abs(h.astype(F32)) > np.abs(v), np.nextafter(h, np.float16(0)), h)
    return h.astype(np.float16)


def _rstd_halley(var: np.ndarray) -> np.ndarray:
    """The README's rstd: y0 = sqrt(1/var); y1 = y0 (1.5 - 0.5 var y0^2);
    e = 1 - var r + var (r - y1^2) with r = 1/var; rstd = y1 + 0.5 y1 e."""
    r = F32(1) / var
    y0 = np.sqrt(r)
    y1 = y0 * (F32(1.5) + ((var * F32(-0.5)) * y0) * y0)
    e = F32(1) + (var * F32(-1)) * r
    r2 = r + (y1 * F32(-1)) * y1
    e = (e + var * r2) * y1
    return y1 + e * F32(0.5)


def reference(x: np.ndarray, gamma: np.ndarray, scale: np.ndarray, offset: np.ndarray,
              step: int, eps: float = 1e-6) -> np.ndarray:
    xf = x.astype(F32)
    r = x.shape[-1]
    total = np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True).astype(F32)
    var = total * F32(1.0 / r) + F32(eps)
    if step == 6:
        norm = xf * _rstd_halley(var)
    else:
        norm = xf / np.sqrt(var)
    v = norm * gamma.astype(F32) * F32(scale.reshape(-1)[0]) + F32(offset.reshape(-1)[0])
    trunc = step >= 3
    h = _to_f16(v, trunc).astype(F32)
    q = np.trunc(h) if trunc else np.rint(h)
    return np.clip(q, -128, 127).astype(np.int8)
