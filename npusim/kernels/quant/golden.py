"""Goldens of the quantisation schemes: each written from its definition, for checking.

The rule: a golden never imports :mod:`.recipes` (what the kernels run) and a recipe never
imports this module; both read only the format table (:mod:`.formats`: dtypes, largest
values, emax, NaN bytes). So each golden is independent of the kernels it checks:

* :func:`mx_quantize` (OCP MX: floor(log2 amax) - emax, float64, ml_dtypes casts) checks
  the MegaMoE kernel's bf16 exponent-bit recipe (``recipes.mx_quantize_bf16``) through the
  mega_moe reference layer;
* :func:`mx_row` and :func:`pergroup_row` (one token, block by block, frexp and fp32
  scalars) check ``recipes.mxfp8_quantize`` (quant_mode 4 and 5) and
  ``recipes.pergroup_quantize`` (quant_mode 3) through the mc2 reference and
  tests/kernels/mc2/test_mc2_quant_modes.py; :func:`mx_combine_row` the 950's MX combine round trip.

The CANN sample's reference (npusim/kernels/cann_sample/reference.py) does not use a golden
here: it reproduces the sample's own golden script, which ``recipes.mxfp8_quantize`` equals
bit for bit (tests/kernels/test_quant.py checks it against a float64 re-derivation of the script).
"""

from __future__ import annotations

import numpy as np

from npusim.formats import FP8_NAN_BYTE, MXFP8_BLOCK, fp8_format, tables
from npusim.units import ceil_div


def fp8_max(mode: str) -> float:
    return fp8_format(mode)[1]


def emax(mode: str) -> int:
    """Exponent of the format's largest normal: 8 (448 = 1.75 * 2^8), 15 (57344)."""
    return fp8_format(mode)[2]


def mx_quantize(x: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of x (any float dtype) along the last axis -> (fp8 codes as uint8, E8M0 bytes).

    A block of 32 with amax > 0 gets shared exponent floor(log2 amax) - emax (clamped to
    E8M0's [-127, 127]); an all-zero block 2^-127. Elements x / 2^e saturated to +-max
    and cast round-to-nearest-even by ml_dtypes."""
    x = np.asarray(x, np.float64)
    *lead, n = x.shape
    if n % MXFP8_BLOCK:
        raise ValueError(f"the quantised axis ({n}) must be a multiple of {MXFP8_BLOCK}")
    b = x.reshape(*lead, n // MXFP8_BLOCK, MXFP8_BLOCK)
    amax = np.abs(b).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - emax(mode),
                     -127)
    e = np.clip(e, -127, 127)
    scaled = np.clip(b / np.exp2(e)[..., None], -fp8_max(mode), fp8_max(mode))
    codes = scaled.astype(fp8_format(mode)[0]).view(np.uint8).reshape(*lead, n)
    return codes, (e + 127).astype(np.uint8)


def mx_dequantize(codes: np.ndarray, scales: np.ndarray, mode: str) -> np.ndarray:
    """(fp8 codes, E8M0 bytes) -> float64 values (exact)."""
    v = np.asarray(codes, np.uint8).view(fp8_format(mode)[0]).astype(np.float64)
    *lead, n = v.shape
    s = np.exp2(np.asarray(scales, np.float64) - 127)
    return (v.reshape(*lead, n // MXFP8_BLOCK, MXFP8_BLOCK) * s[..., None]).reshape(*lead, n)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 (RNE, through fp32 as the hardware's fp32 -> bf16 casts do)."""
    return np.asarray(x, np.float32).astype(tables().bf16)


def mx_dequantize_k(codes: np.ndarray, scales: np.ndarray, mode: str) -> np.ndarray:
    """A weight [K, N] of fp8 codes with E8M0 scales [K/32, N] (per 32 along K) -> float64."""
    v = np.asarray(codes, np.uint8).view(fp8_format(mode)[0]).astype(np.float64)
    return v * np.repeat(np.exp2(np.asarray(scales, np.float64) - 127), MXFP8_BLOCK, axis=0)


def pergroup_row(x: np.ndarray, fp8: str, smooth: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """quant_mode 3 for one token: per group of 128 (the last one shorter) xf = fp32(x)
    [* smooth]; d = fp32(fp8max) / max|xf|; bytes of fp8(xf * d) (round to nearest even);
    scale fp32(1 / d). An all-zero group: NaN bytes and scale 0 (d is inf)."""
    ty, fmax, _ = fp8_format(fp8)
    xf = np.asarray(x).astype(np.float32).reshape(-1)
    if smooth is not None:
        xf = xf * np.asarray(smooth, np.float32).reshape(-1)
    h = xf.size
    groups = ceil_div(h, 128)
    q = np.zeros(h, np.uint8)
    scales = np.zeros(groups, np.float32)
    for g in range(groups):
        seg = xf[128 * g:128 * (g + 1)]
        amax = np.float32(np.abs(seg).max())
        if amax == 0:
            q[128 * g:128 * g + seg.size] = FP8_NAN_BYTE[fp8]
            continue
        d = np.float32(fmax) / amax
        q[128 * g:128 * g + seg.size] = (seg * d).astype(ty).view(np.uint8)
        scales[g] = np.float32(1.0) / d
    return q, scales


def mx_row(x: np.ndarray, fp8: str, clip: bool) -> tuple[np.ndarray, np.ndarray]:
    """quant_mode 4 (``clip`` False) or 5 for one finite token: per block of 32 a power of
    two P (mode 4: 2^(floor(log2 amax) - emax), at least 2^-127, and a block with amax <
    2^-126 is all zeros; mode 5: the smallest power of two >= fp32(max(amax, 1e-4) *
    fp32(1 / fp8max)), 2^-127 for amax = 0); elements fp8(clip(x / P, +-fp8max)); the
    scale byte is E8M0(P). Returns (bytes (H,), scale bytes (Align2(ceil(H/32)),))."""
    ty, fmax, emax = fp8_format(fp8)
    xf = np.asarray(x).astype(np.float32).reshape(-1)
    if not np.isfinite(xf).all():
        raise ValueError("mx_row models finite tokens only")
    h = xf.size
    blocks = ceil_div(h, 32)
    q = np.zeros(h, np.uint8)
    scales = np.zeros(blocks + blocks % 2, np.uint8)  # the pad scale byte: 0 (2^-127)
    tiny = np.float32(2.0 ** -126)
    for b in range(blocks):
        seg = xf[32 * b:32 * (b + 1)]
        amax = np.float32(np.abs(seg).max())
        zero = amax == 0 if clip else amax < tiny
        if zero:
            p = -127
        elif clip:
            v = np.float32(max(amax, np.float32(1e-4)) * np.float32(1.0 / fmax))
            m, e = np.frexp(v)
            p = int(e) - 1 if m == 0.5 else int(e)
        else:
            p = max(int(np.frexp(amax)[1]) - 1 - emax, -127)
        big = np.float32(np.ldexp(np.float64(1.0), p))
        if not zero:
            y = np.clip(seg / big, -fmax, fmax)
            q[32 * b:32 * b + seg.size] = y.astype(ty).view(np.uint8)
        scales[b] = np.array([big], np.float32).astype(tables().e8m0).view(np.uint8)[0]
    return q, scales


def mx_combine_row(x: np.ndarray, fp8: str) -> np.ndarray:
    """The 950's MXFP8 combine round trip of one row, in fp32: :func:`mx_row` (mode 4), then
    fp32(fp8) * 2^(b - 127) for scale byte b, except b = 0, which the receiver reads as 0
    (it shifts the byte into an fp32 exponent field)."""
    q, sc = mx_row(x, fp8, clip=False)
    b = sc[:ceil_div(q.size, 32)].astype(np.int64)
    scale = np.where(b == 0, 0.0, np.ldexp(1.0, b - 127)).astype(np.float32)
    return q.view(fp8_format(fp8)[0]).astype(np.float32) * np.repeat(scale, 32)[:q.size]


def pertoken_row(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.float32]:
    """Per-token dynamic quantisation of one finite, nonzero token to ``fmt`` ("int8",
    "e4m3", "e5m2"): d = fp32(qmax) / max|fp32(x)| with qmax 127 or the format's largest
    value, each element fp32(x) * d rounded to the nearest even code (FP8 saturated at
    +-qmax), the scale fp32(1 / d). -> (codes as bytes, scale)."""
    xf = np.asarray(x).astype(np.float32).reshape(-1)
    qmax = 127.0 if fmt == "int8" else fp8_max(fmt)
    d = np.float32(qmax) / np.float32(np.abs(xf).max())
    y = np.float32(d) * xf
    if fmt == "int8":
        codes = np.rint(y).astype(np.int8).view(np.uint8)
    else:
        codes = np.clip(y, -qmax, qmax).astype(fp8_format(fmt)[0]).view(np.uint8)
    return codes, np.float32(np.float32(1.0) / d)


def mxfp4_row(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OCP MXFP4 (E2M1) of one finite token: per block of 32 the power of two P =
    2^(floor(log2 amax) - 2) (at least 2^-127; a block with amax < 2^-126 all zeros),
    elements E2M1(clip(x / P, +-6)) nearest even, two per byte, the first in the low
    nibble; scale byte E8M0(P). -> (packed (H/2,), scale bytes (H/32,))."""
    xf = np.asarray(x).astype(np.float32).reshape(-1)
    fp4 = tables().fp4_e2m1
    h = xf.size
    codes = np.zeros(h, np.uint8)
    scales = np.zeros(h // MXFP8_BLOCK, np.uint8)
    for b in range(h // MXFP8_BLOCK):
        seg = xf[MXFP8_BLOCK * b:MXFP8_BLOCK * (b + 1)]
        amax = float(np.abs(seg).max())
        p = -127 if amax < 2.0 ** -126 else max(int(np.frexp(amax)[1]) - 1 - 2, -127)
        if amax >= 2.0 ** -126:
            y = np.clip(seg.astype(np.float64) / 2.0 ** p, -6.0, 6.0)
            codes[MXFP8_BLOCK * b:MXFP8_BLOCK * (b + 1)] = y.astype(fp4).view(np.uint8)
        scales[b] = p + 127
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8), scales
