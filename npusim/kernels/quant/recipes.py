"""Quantisation maths of the MoE dispatch/combine kernels, as plain numpy.

Schemes, each vectorised over rows (pass one token as shape (1, H) or many as (N, H)):

* MXFP8 (E5M2 or E4M3) with E8M0 block scales (dispatch quant_mode 4, the CANN sample and
  ops-transformer's ``ComputeScale``). Bit-exact with the sample's golden script
  (``gen_data.py: mx_quantize_e5m2``) and, for fp16 input, with the kernel
  (``moe_distribute_dispatch_quant.h``): both reduce to the same integer recipe below.
  ``clip=True``: ops-transformer's MX-clip scale (quant_mode 5, ``ComputeScaleClip``).
* Per-group FP8 (ops-transformer quant_mode 3, ``ComputePerTileDynamic``): 128 elements per
  fp32 scale.
* Per-token dynamic INT8 (ops-transformer quant_mode 2).
* The combine's INT8 block round trip (8 fp32 elements per 32-byte block).

These functions define the *numbers*; what the vector unit pays for them is modelled elsewhere.
"""

from __future__ import annotations

import numpy as np

from npusim.formats import (
    E8M0_NAN,
    E8M0_PAD,
    FP4_E2M1_EMAX,
    FP4_E2M1_MAX,
    FP8_NAN_BYTE,
    MXFP8_BLOCK,
    POW2_F32,
    TOKEN_DTYPE_NAMES,
    e8m0_bytes,
    e8m0_values,
    fp8_format,
    fp8_values,
    tables,
    token_dtype,
)
from npusim.units import align_up, ceil_div

INT8_BLOCK = 8
"""fp32 elements per combine INT8 block: one 32-byte UB block (BlockReduceMax granule)."""

INT8_QMAX = 127.0
PERGROUP_BLOCK = 128
"""Elements sharing one fp32 scale in quant_mode 3 (PERGROUP_BLOCK_SIZE of the tiling)."""
MX_CLIP_FLOOR = np.float32(1e-4)
"""ComputeScaleClip's lower clamp of a block's max |x| (EPS_1E_4_FP32)."""
_F32_ONE_OVER_127 = np.float32(1.0) / np.float32(127.0)
_E8M0_F32 = POW2_F32[np.arange(-127, 128) + 149]
"""2^(s - 127) at index s, for the E8M0 bytes s < 255."""


def mxfp8_scale_count(h: int) -> int:
    """Scale bytes per token: Align2(ceil(H/32)) (the kernel stores an even number)."""
    return align_up(ceil_div(h, MXFP8_BLOCK), 2)


def int8_block_scale_count(h: int) -> int:
    """Combine INT8 scales per token: Align16(H)/8 (UB rows are 32-byte aligned in token dtype)."""
    return align_up(h, 16) // INT8_BLOCK


def _as_2d(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 1:
        return x[None, :]
    if x.ndim != 2:
        raise ValueError(f"expected a (rows, H) array, got shape {x.shape}")
    return x


def _blocks_f32(x: np.ndarray, block: int, n_blocks: int) -> np.ndarray:
    """fp32 copy of x zero-padded to n_blocks*block columns, shaped (rows, n_blocks, block)."""
    rows, h = x.shape
    if h == n_blocks * block:
        return x.astype(np.float32).reshape(rows, n_blocks, block)
    out = np.zeros((rows, n_blocks * block), dtype=np.float32)
    out[:, :h] = x
    return out.reshape(rows, n_blocks, block)


def _round_to_fp16_grid(y: np.ndarray) -> np.ndarray:
    """fp32 values rounded (nearest even) to fp16 precision, in fp32: what fp16(y) holds,
    without numpy's slow fp16 conversions. Adding and removing 1.5 * 2^(e + 13) leaves y
    rounded to a multiple of 2^(e - 10), fp16's spacing at y's exponent e (clamped at
    fp16's smallest normal exponent, so subnormals round on their 2^-24 grid). Beyond
    fp16's range the result stays finite where fp16 would be inf; callers clip."""
    e = y.view(np.uint32) & np.uint32(0x7F800000)
    np.maximum(e, np.uint32(113 << 23), out=e)
    e += np.uint32(13 << 23)
    m = e.view(np.float32)
    m *= np.float32(1.5)
    out = y + m
    out -= m
    return out


def _block_absmax(blocks: np.ndarray) -> np.ndarray:
    """max |x| over the last axis (NaN propagates), shaped (rows, n_blocks).

    numpy reduces the leading axis of a transposed copy several times faster than a short
    trailing axis; the maxima are the same. A NaN maximum is made the canonical quiet NaN:
    which NaN of a block wins is the reduction order's business (and the hardware's)."""
    rows, nb, block = blocks.shape
    cols = np.ascontiguousarray(np.abs(blocks).reshape(rows * nb, block).T)
    m = np.maximum.reduce(cols, axis=0).reshape(rows, nb)
    m[np.isnan(m)] = np.float32(np.nan)
    return m


# --------------------------------------------------------------------------- MXFP8


def _clip_scale_exponent(amax: np.ndarray, fmax: float) -> np.ndarray:
    """ComputeScaleClip's biased scale exponent per block: v = fp32(max(amax, 1e-4) *
    fp32(1 / fmax)); v's exponent field, plus one where v is a normal number with a nonzero
    mantissa or a subnormal above 2^-127 (the smallest power of two >= v); 0 for amax = 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = (np.maximum(amax, MX_CLIP_FLOOR) * np.float32(1.0 / fmax)).astype(np.float32)
    bits = v.view(np.uint32)
    e = (bits >> np.uint32(23)).astype(np.int32) & 0xFF
    man = bits & np.uint32(0x7FFFFF)
    up = ((e > 0) & (e < 254) & (man > 0)) | ((e == 0) & (man > 0x400000))
    return np.where(amax == 0, 0, e + up.astype(np.int32))


def mxfp8_quantize(x: np.ndarray, saturate: bool = False, fp8: str = "e5m2",
                   clip: bool = False, zero_subnormal_blocks: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Quantise fp16/bf16 rows to fp8 bytes plus E8M0 scale bytes, one per 32 elements.

    Per block: amax = max |x|; E = its biased (fp32/bf16) exponent field; scale byte
    s = 0xFF if amax is inf/NaN, else max(E - emax, 0), emax = 15 (e5m2) or 8 (e4m3) (the
    golden's floor(log2 amax) - emax clamped at 2^-127; the kernel gets E from the
    bf16-truncated exponent bits, the same number). ``clip=True``: s from
    :func:`_clip_scale_exponent` (quant_mode 5). Elements: fp8(x * 2^(127 - s))
    round-to-nearest-even. The product is exact in fp32, so this is a single rounding,
    identical to the golden's log2/rint construction.
    ``saturate=False`` (the sample) lets magnitudes beyond the format's range become inf
    (e5m2) or NaN (e4m3); ``True`` (ops-transformer, FLOAT_OVERFLOW_MODE 0 and SAT casts)
    clamps them to +-max. ``zero_subnormal_blocks``: a block whose E is 0 gets zero
    elements (ops-transformer's ComputeScale selects a zero multiplier for it).

    Returns ``(data uint8 (rows, H), scales uint8 (rows, Align2(ceil(H/32))))``; the pad
    scale byte is 0 (= 2^-127, as the golden pads).

    Non-finite blocks (scale 0xFF) become NaN bytes as the golden produces them on x86:
    0x7E, or 0xFE where the input element is itself a negative NaN (e5m2). The hardware's
    NaN encoding is not documented in the sample; neither case occurs with finite inputs.
    Known kernel difference (bf16 only, CANN sample): a block whose amax is a bf16 subnormal
    (< 2^-126) is zeroed by the kernel (scale multiplier 0) but quantised by the golden
    (x * 2^127); the default follows the golden.
    """
    x = _as_2d(x)
    rows, h = x.shape
    dt8, fmax, emax = fp8_format(fp8)
    nb = ceil_div(h, MXFP8_BLOCK)
    blocks = _blocks_f32(x, MXFP8_BLOCK, nb)
    amax = _block_absmax(blocks)  # NaN propagates
    exp_field = (amax.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    nonfinite = exp_field == 0xFF
    if clip:
        s = _clip_scale_exponent(amax, fmax)
    else:
        s = np.maximum(exp_field.astype(np.int32) - emax, 0)
    s = np.where(nonfinite, E8M0_NAN, s).astype(np.int32)

    shift = np.where(nonfinite, 0, 127 - s)
    mult = POW2_F32[shift + 149]
    if zero_subnormal_blocks:
        mult = np.where(exp_field == 0, np.float32(0), mult)
    scaled = blocks * mult[:, :, None]  # exact: x * 2^(127 - s)
    if nonfinite.any():
        # golden: x / 2**nan -> NaN carrying the sign of a NaN input, else positive NaN
        nan_in = np.isnan(blocks) & np.signbit(blocks)
        fill = np.where(nan_in, np.float32(-np.nan), np.float32(np.nan))
        scaled = np.where(nonfinite[:, :, None], fill, scaled)
    if saturate:
        scaled = np.clip(scaled, -fmax, fmax)
    with np.errstate(over="ignore", invalid="ignore"):
        data = scaled.astype(dt8).view(np.uint8).reshape(rows, nb * MXFP8_BLOCK)
    data = np.ascontiguousarray(data[:, :h])

    scales = np.full((rows, mxfp8_scale_count(h)), E8M0_PAD, dtype=np.uint8)
    scales[:, :nb] = e8m0_bytes(s)
    return data, scales


def mxfp8_dequantize(
    data: np.ndarray, scales: np.ndarray, out_dtype: np.dtype | str = np.float32,
    fp8: str = "e5m2",
) -> np.ndarray:
    """Inverse of :func:`mxfp8_quantize`: fp32(fp8) * 2^(s - 127), cast RNE to ``out_dtype``.

    Scale byte 0xFF gives NaN. The fp32 product is exact; only the final cast rounds.
    """
    data = _as_2d(np.asarray(data, dtype=np.uint8))
    scales = _as_2d(np.asarray(scales, dtype=np.uint8))
    rows, h = data.shape
    nb = ceil_div(h, MXFP8_BLOCK)
    if scales.shape[0] != rows or scales.shape[1] < nb:
        raise ValueError(f"scales shape {scales.shape} does not cover data shape {data.shape}")
    out_dt = _out_dtype(out_dtype)
    table_f32 = fp8_values(fp8)
    if out_dt.itemsize == 2 and h == nb * MXFP8_BLOCK:  # one table lookup per element
        idx = data.reshape(rows, nb, MXFP8_BLOCK).astype(np.uint16)
        idx |= (scales[:, :nb].astype(np.uint16) << 8)[:, :, None]
        return _mxfp8_table(out_dt, fp8)[idx].reshape(rows, h)
    if h == nb * MXFP8_BLOCK:
        vals = table_f32[data].reshape(rows, nb, MXFP8_BLOCK)
    else:
        vals = np.zeros((rows, nb * MXFP8_BLOCK), dtype=np.float32)
        vals[:, :h] = table_f32[data]
        vals = vals.reshape(rows, nb, MXFP8_BLOCK)
    factor = e8m0_values(scales[:, :nb])  # 0xFF: NaN
    with np.errstate(invalid="ignore", over="ignore"):
        prod = vals * factor[:, :, None]  # exact: fp8 * 2^(s - 127)
    return prod.reshape(rows, nb * MXFP8_BLOCK)[:, :h].astype(out_dt)


_MXFP8_TABLES: dict[tuple[np.dtype, str], np.ndarray] = {}


def _mxfp8_table(dt: np.dtype, fp8: str = "e5m2") -> np.ndarray:
    """Every (scale byte, element byte) pair dequantised to `dt`, indexed by scale << 8 |
    element: the general path's own arithmetic, evaluated once."""
    table = _MXFP8_TABLES.get((dt, fp8))
    if table is None:
        codes = np.arange(256, dtype=np.uint8)
        data = np.tile(codes, 256).reshape(256, 256)  # row = scale byte, column = element
        scales = np.repeat(codes, 256).reshape(256, 256)[:, ::MXFP8_BLOCK]
        with np.errstate(over="ignore", invalid="ignore"):  # large scales give inf
            table = mxfp8_dequantize(data, scales, np.float32, fp8).astype(dt).reshape(-1)
        _MXFP8_TABLES[(dt, fp8)] = table
    return table


# --------------------------------------------------------------------------- per-group FP8


def pergroup_scale_count(h: int) -> int:
    """fp32 scales per token in quant_mode 3: ceil(H / 128)."""
    return ceil_div(h, PERGROUP_BLOCK)


def pergroup_quantize(x: np.ndarray, fp8: str = "e5m2", smooth: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """quant_mode 3 (``ComputePerTileDynamic``): per group of 128 elements of xf = fp32(x)
    (* smooth, per channel fp32), d = fp32(fmax) / max |xf| (fp32 division), q =
    fp8(xf * d) round-to-nearest-even, scale = fp32(1 / d). Elements past H count as zeros.

    A zero group gives d = inf, xf * d = NaN and scale 0 on the device; here its bytes are
    the format's positive NaN (0x7E e5m2, 0x7F e4m3; the hardware's NaN sign is not
    documented) and its scale 0.0. Returns ``(q uint8 (rows, H), scales fp32 (rows,
    ceil(H/128)))``."""
    x = _as_2d(x)
    rows, h = x.shape
    dt8, fmax, _ = fp8_format(fp8)
    ng = pergroup_scale_count(h)
    g = _blocks_f32(x, PERGROUP_BLOCK, ng)
    if smooth is not None:
        sm = np.zeros(ng * PERGROUP_BLOCK, np.float32)
        sm[:h] = np.asarray(smooth, np.float32).reshape(-1)
        g = g * sm.reshape(ng, PERGROUP_BLOCK)
    amax = _block_absmax(g)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = np.float32(fmax) / amax
        q = (g * d[:, :, None]).astype(dt8).view(np.uint8)
        scale = (np.float32(1.0) / d).astype(np.float32)
    q = np.where((amax == 0)[:, :, None], np.uint8(FP8_NAN_BYTE[fp8]), q)
    return np.ascontiguousarray(q.reshape(rows, ng * PERGROUP_BLOCK)[:, :h]), scale


def pergroup_dequantize(q: np.ndarray, scales: np.ndarray, out_dtype: np.dtype | str,
                        fp8: str = "e5m2") -> np.ndarray:
    """fp32(fp8) * the group's fp32 scale, cast RNE to ``out_dtype``."""
    q = _as_2d(np.asarray(q, dtype=np.uint8))
    rows, h = q.shape
    s = np.repeat(_as_2d(np.asarray(scales, np.float32)), PERGROUP_BLOCK, axis=1)[:, :h]
    with np.errstate(invalid="ignore", over="ignore"):
        return (fp8_values(fp8)[q] * s).astype(_out_dtype(out_dtype))


def _out_dtype(dt: np.dtype | str) -> np.dtype:
    if isinstance(dt, str) and dt in TOKEN_DTYPE_NAMES:
        return token_dtype(dt)
    return np.dtype(dt)


# --------------------------------------------------------------------------- per-token INT8


def int8_token_quantize(
    x: np.ndarray, smooth: np.ndarray | None = None, zero_guard: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token dynamic INT8 (ops-transformer quant_mode 2).

    xf = fp32(x) (* smooth, optional per-channel fp32); d = 127 / max|xf| (fp32 division);
    q = int8(rint(xf * d)) (the kernel's fp32->int32 CAST_RINT, exact after that);
    scale = fp32(1 / d). Returns ``(q int8 (rows, H), scale fp32 (rows,))``.

    Zero rows: the kernel computes d = 127/0 = inf, so scale = 1/inf = 0 and xf*d = 0*inf = NaN,
    whose int8 cast is hardware defined. We return q = 0 and scale = 0.0 (what the kernel
    stores for the scale; dequantises to exact zeros) and never produce NaN. Rows with inf/NaN
    inputs give unspecified q (NaN products are mapped to 0). ``zero_guard``: d = 1 for a
    zero row (DeepEP's A5 kernels: max > 0 ? 127 / max : 1), so its scale is 1.0.
    """
    x = _as_2d(x)
    xf = x.astype(np.float32)
    if smooth is not None:
        xf = xf * np.asarray(smooth, dtype=np.float32)
    amax = np.max(np.abs(xf), axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = np.float32(INT8_QMAX) / amax  # inf for zero rows, as on the device
        if zero_guard:
            d = np.where(amax > 0, d, np.float32(1.0)).astype(np.float32)
        prod = xf * d[:, None]
        prod = np.where(np.isnan(prod), np.float32(0), prod)
        q = np.clip(np.rint(prod), -128, 127).astype(np.int8)
        scale = (np.float32(1.0) / d).astype(np.float32)
    return q, scale


def int8_token_dequantize(
    q: np.ndarray, scale: np.ndarray, out_dtype: np.dtype | str = np.float32
) -> np.ndarray:
    """fp32(q) * scale per row, cast RNE to ``out_dtype``."""
    q = _as_2d(q)
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    return (q.astype(np.float32) * scale[:, None]).astype(_out_dtype(out_dtype))


# --------------------------------------------------------------------------- combine INT8 block


def int8_block_quantize(
    x: np.ndarray, recip: bool = False, scale_dtype: np.dtype | str = np.float16
) -> tuple[np.ndarray, np.ndarray]:
    """The combine's INT8 block quantisation (8 fp32 elements = one 32-byte block).

    f = fp32(x); m = max |f| per block (tail zero-padded); s = m / 127 in fp32
    (``recip=True``: m * fp32(1/127), what the kernel's Muls does; ``False``: the golden's
    division); s == 0 -> 1.0 (golden; the kernel would divide 0/0, and its stored scale 0
    dequantises to 0 as well); q = int8(rint(fp16(f / s))) dividing by the fp32 s;
    the stored scale is ``scale_dtype``(s) RNE. The sample's golden and kernel store the scale
    in the *token* dtype (fp16 in the sample; bf16 for bf16 tokens), so pass that.

    recip vs divide: the fp32 scales differ by an ulp for ~4.5% of fp16 maxima, but the stored
    scale and every q are identical for all fp16 inputs (checked exhaustively, see tests). For
    bf16 inputs exactly two (max, element) pairs differ in q, both with max < 2^-119 where
    the fp32 scale is subnormal.

    Returns ``(q int8 (rows, Align32(H)), scales (rows, Align16(H)/8))``; q's pad bytes are 0
    (the kernel leaves them unwritten); pad blocks get scale 1.0.
    """
    x = _as_2d(x)
    rows, h = x.shape
    ns = int8_block_scale_count(h)
    blocks = _blocks_f32(x, INT8_BLOCK, ns)
    m = _block_absmax(blocks)[:, :, None]
    s = m * _F32_ONE_OVER_127 if recip else m / np.float32(INT8_QMAX)
    s[s == 0] = np.float32(1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        qf = _round_to_fp16_grid(blocks / s)  # fp16(f / s), kept in fp32
        np.rint(qf, out=qf)
        np.clip(qf, -128, 127, out=qf)
        qf[np.isnan(qf)] = 0
    q = qf.astype(np.int8)
    qout = np.zeros((rows, align_up(h, 32)), dtype=np.int8)
    qout[:, :h] = q.reshape(rows, ns * INT8_BLOCK)[:, :h]
    scales = s[:, :, 0].astype(_out_dtype(scale_dtype))
    return qout, scales


def int8_block_dequantize(
    q: np.ndarray, scales: np.ndarray, h: int, out_dtype: np.dtype | str = np.float16
) -> np.ndarray:
    """out_dtype(fp32(q) * fp32(scale)) per 8-element block (kernel and golden agree)."""
    q = _as_2d(q)
    scales = _as_2d(scales)
    rows = q.shape[0]
    nb = ceil_div(h, INT8_BLOCK)
    if q.shape[1] < h or scales.shape[0] != rows or scales.shape[1] < nb:
        raise ValueError(f"q {q.shape} / scales {scales.shape} do not cover H={h}")
    s = scales[:, :nb].astype(np.float32)
    if h == nb * INT8_BLOCK:
        vals = q[:, :h].astype(np.float32).reshape(rows, nb, INT8_BLOCK) * s[:, :, None]
        return vals.reshape(rows, h).astype(_out_dtype(out_dtype))
    s = np.repeat(s, INT8_BLOCK, axis=1)[:, :h]
    return (q[:, :h].astype(np.float32) * s).astype(_out_dtype(out_dtype))


def int8_block_round_trip(
    x: np.ndarray, recip: bool = False, scale_dtype: np.dtype | str | None = None
) -> np.ndarray:
    """Quantise + dequantise as the combine does; result and scale dtype default to x's dtype."""
    x = _as_2d(x)
    sd = x.dtype if scale_dtype is None else scale_dtype
    q, s = int8_block_quantize(x, recip=recip, scale_dtype=sd)
    return int8_block_dequantize(q, s, x.shape[1], out_dtype=x.dtype)


# --------------------------------------------------------------------------- MXFP8 of bf16 rows


def _mx_bf16_blocks(x: np.ndarray, emax: int, zero_subnormal_blocks: bool
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ComputeMaxExp and ComputeScale of bf16 rows [n, D] (D % 32 == 0): per 32 elements
    the largest bf16 exponent field (bits & 0x7F80), the E8M0 byte s = max(maxexp - emax,
    0) and the multiplier 2^(127 - s) as bf16 bits (254 - s) << 7 (0 for a block whose
    exponent field is 0 when ``zero_subnormal_blocks``). -> (fp32 blocks [n, D/32, 32],
    s, multiplier)."""
    n, d = x.shape
    bf16 = tables().bf16
    bits = np.ascontiguousarray(x, bf16).view(np.uint16).reshape(n, d // 32, 32)
    maxexp = ((bits & np.uint16(0x7F80)) >> np.uint16(7)).max(axis=-1).astype(np.int32)
    s = np.clip(maxexp - emax, 0, 253)
    inverse = ((254 - s).astype(np.uint16) << np.uint16(7)).view(bf16).astype(np.float32)
    if zero_subnormal_blocks:
        inverse[maxexp == 0] = 0
    return x.astype(np.float32).reshape(n, d // 32, 32), s, inverse


def mx_quantize_bf16(x: np.ndarray, mode: str, zero_subnormal_blocks: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The MegaMoE kernel's MXFP8 of bf16 rows [n, D] (D % 32 == 0), step by step as its
    vector unit does it: ComputeMaxExp, ComputeScale (:func:`_mx_bf16_blocks`);
    ComputeFp8Data (x * inverse in fp32, saturated, cast to FP8 round-to-nearest-even).
    ``zero_subnormal_blocks``: the 950 DeepEP dispatch's quant::ComputeScale, whose
    multiplier is 0 for a block of bf16 subnormals. -> (codes [n, D] uint8, E8M0 [n, D/32])."""
    dt8, fmax, emax = fp8_format(mode)
    n, d = x.shape
    blocks, s, inverse = _mx_bf16_blocks(x, emax, zero_subnormal_blocks)
    scaled = blocks * inverse[..., None]
    np.clip(scaled, -np.float32(fmax), np.float32(fmax), out=scaled)
    codes = scaled.astype(dt8).view(np.uint8).reshape(n, d)
    return codes, s.astype(np.uint8)


def mxfp4_quantize_bf16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 (E2M1) of bf16 rows [n, D] (D % 32 == 0) as the 950 DeepEP dispatch's
    quant::ComputeFp4Data does it: the scales of :func:`_mx_bf16_blocks` with E2M1's emax
    2 (a subnormal block zeroed), x * multiplier (exact), cast round-to-nearest-even and
    saturated to +-6 (overflow mode 0), element 2i in the low nibble of byte i, 2i + 1 in
    the high. -> (packed [n, D/2] uint8, E8M0 [n, D/32])."""
    n, d = x.shape
    blocks, s, inverse = _mx_bf16_blocks(x, FP4_E2M1_EMAX, True)
    scaled = blocks * inverse[..., None]
    np.clip(scaled, -np.float32(FP4_E2M1_MAX), np.float32(FP4_E2M1_MAX), out=scaled)
    codes = scaled.astype(tables().fp4_e2m1).view(np.uint8).reshape(n, d)
    return codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4)), s.astype(np.uint8)


def fp8_token_quantize(x: np.ndarray, fp8: str, zero_guard: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Per-token dynamic FP8 (the 950 DeepEP dispatch's quant_mode 5): xf = fp32(x);
    d = fp8max / max|xf| in fp32; q = fp8(xf * d) round-to-nearest-even, saturated to
    +-fp8max; scale = fp32(1 / d). -> (codes uint8 (rows, H), scale fp32 (rows,)). A zero
    row makes d inf and its products NaN on the device (the normal dispatch); finite rows
    only. ``zero_guard``: d = 1 for a zero row (the low-latency A5 kernel's
    QuantDynamicPerToken: max > 0 ? 448 / max : 1), so its codes are 0 and its scale 1."""
    x = _as_2d(x)
    dt8, fmax, _ = fp8_format(fp8)
    xf = x.astype(np.float32)
    amax = np.max(np.abs(xf), axis=1)
    with np.errstate(divide="ignore"):
        d = np.float32(fmax) / amax
    if zero_guard:
        d = np.where(amax > 0, d, np.float32(1.0)).astype(np.float32)
    prod = xf * d[:, None]
    np.clip(prod, -np.float32(fmax), np.float32(fmax), out=prod)
    return prod.astype(dt8).view(np.uint8), (np.float32(1.0) / d).astype(np.float32)


def mx_values(codes: np.ndarray, scales: np.ndarray, mode: str) -> np.ndarray:
    """fp32 values of codes [.., D] with E8M0 scales [.., D/32] (exact products)."""
    v = fp8_values(mode)[codes]
    *lead, d = v.shape
    return (v.reshape(*lead, d // 32, 32) * _E8M0_F32[scales][..., None]).reshape(*lead, d)
