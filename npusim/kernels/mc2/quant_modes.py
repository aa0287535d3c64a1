"""The 950's dispatch quantisation modes of family ``mc2`` (quant_mode 3, 4, 5), per mode:
its record layout in the window, its numbers and its vector instructions.

Step functions any comm_alg's send calls for one token (``moe_distribute_dispatch_v2_quant.h``
``QuantInit`` / ``QuantProcess``, ``quantize_functions.h``; docs/kernels/mc2.md, "Quantisation
modes"):

* ``pergroup`` (3, ``QuantDynamicPerGroup``): FP8 per 128 elements, one fp32 scale each;
  record [Align128(H) fp8][ceil(H/128) fp32 scales].
* ``mxfp8`` (4, ``QuantDynamicMx``): E8M0 scale per 32 elements (``ComputeScale``), FP8
  elements with saturation; record [Align256(H) fp8][Align2(ceil(H/32)) E8M0].
* ``mxfp8_clip`` (5, ``QuantDynamicMxClip``): the same record, the cuBLAS-style scale of
  ``ComputeScaleClip`` (max |x| clamped at 1e-4, exponent rounded up).

The element format (``quant_dtype``) is e5m2 or e4m3 (the expand_x dtype of the operator).
* ``mxfp4_e2m1`` (4 with an fp4x2_e2m1 expand_x, :data:`MXFP4`): QuantDynamicMx with
  ``ComputeFp4Data``; record [Align256(ceil(H/2)) packed E2M1, two per byte][Align2(ceil(H/32))
  E8M0]. ops-transformer's QuantInit / QuantDynamicMx and DeepEP's 950 kernels (its
  low-latency fork, quantMode 4, and its normal dispatch) place it alike and call the same
  quantize_functions.h functions with the same template arguments, all three setting the
  overflow mode to saturation, so the numbers are DeepEP's normal dispatch's
  (recipes.mxfp4_quantize_bf16). bf16 tokens only: fp16's FP16Convert pass is not
  modelled; ``mxfp4_e1m2`` is refused (:data:`NOT_MODELLED`).

One record only DeepEP's 950 low-latency fork (``moe_distribute_dispatch_v2_a5.h``, family
``deepep``) asks these programs for, ops-transformer's operator having no such quant_mode
(``deepep`` passes it to ``dispatch_quant`` itself; the family's options do not list it):
``pertoken_fp8`` (DeepEP's quantMode 5, :data:`PERTOKEN_FP8`): QuantDynamicPerToken to FP8
e4m3 (d = 448 / max, 1 for a zero row); the INT8 record [Align32(H) codes][fp32 1/d].
The VFs are the kernel's ``__VEC_SCOPE__`` loops as register instructions, timed by the
RegBase model (hw/vf.py, docs/model.md "The 950's vector functions").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npusim.formats import tables
from npusim.hw.vf import VF, VLoop, vi
from npusim.kernels.quant import (
    MXFP8_BLOCK,
    PERGROUP_BLOCK,
    e8m0_values,
    fp8_format,
    fp8_token_quantize,
    mxfp4_quantize_bf16,
    mxfp8_quantize,
    mxfp8_scale_count,
    pergroup_quantize,
    pergroup_scale_count,
)
from npusim.units import align_up, ceil_div

FP8_MODES = ("pergroup", "mxfp8", "mxfp8_clip")
"""The modes this module models (arch35 only)."""
MX_MODES = ("mxfp8", "mxfp8_clip")
FP4_MODES = ("mxfp4_e2m1", "mxfp4_e1m2")
QUANT_MODE = {"none": 0, "static_int8": 1, "int8": 2, "pergroup": 3, "mxfp8": 4,
              "mxfp8_clip": 5, "mxfp4_e2m1": 4, "mxfp4_e1m2": 4}
"""The operator's quant_mode of each ``dispatch_quant`` name."""
A3_MODES = ("none", "int8")
"""What the A3 tiling accepts (moe_distribute_dispatch_v2_tiling_arch22.cpp: NON_QUANT or
PERTOKEN_DYNAMIC_QUANT); npusim also runs static_int8 on A3, as before."""
NOT_MODELLED = ("MX FP4 E1M2 is not modelled: ml_dtypes has no e1m2 type")
FP16_FP4 = ("with float16 tokens ComputeFp4Data first runs FP16Convert (a mantissa "
            "adjustment) and a TRUNC cast to bf16, which npusim does not model")


MXFP4 = "mxfp4_e2m1"
PERTOKEN_FP8 = "pertoken_fp8"
VF_MODES = (*FP8_MODES, MXFP4)
"""The modes whose record :func:`record_layout` gives and whose quantiser is VFs."""
PER_TOKEN_MODES = ("int8", PERTOKEN_FP8)
"""QuantDynamicPerToken's modes: the codes, one fp32 scale at Align32(H)."""


def fp8_mode(quant: str) -> bool:
    return quant in FP8_MODES


def vf_mode(quant: str) -> bool:
    """A mode of the 950's VFs (FP8 and MXFP4): zero fill, Align128(H) input, record."""
    return quant in VF_MODES


def out_bytes(h: int, quant: str) -> int:
    """hOutSize_: the expand_x bytes of one row (bf16 / fp16: 2H; FP4: two per byte)."""
    if quant == "none":
        return 2 * h
    return ceil_div(h, 2) if quant == MXFP4 else h


# --------------------------------------------------------------------------- layout


def record_layout(h: int, quant: str) -> tuple[int, int, int]:
    """(data bytes in the record, scale offset, scale bytes) of QuantInit: hOutSizeAlign_
    before its Align32 is scale offset + scale bytes."""
    if quant == "pergroup":
        data = align_up(h, PERGROUP_BLOCK)
        return data, data, 4 * pergroup_scale_count(h)
    if quant in MX_MODES or quant == MXFP4:
        data = align_up(out_bytes(h, quant), 256)
        return data, data, mxfp8_scale_count(h)
    raise ValueError(f"dispatch_quant {quant!r} is not a VF mode; allowed: "
                     f"{', '.join(VF_MODES)}")


def input_bytes(h: int) -> int:
    """hAlignSize_ of the VF modes: Align128(H) elements of 2 B (the scale VFs read 128 or
    256 elements at a time, over the zero fill)."""
    return 2 * align_up(h, PERGROUP_BLOCK)


def scale_dtype(quant: str) -> np.dtype:
    """dynamic_scales' element: fp32 (per group) or E8M0 bytes (MX)."""
    return np.dtype(np.float32) if quant == "pergroup" else np.dtype(np.uint8)


def scale_count(h: int, quant: str) -> int:
    """dynamic_scales' columns (scaleOutBytes_ / element size)."""
    return pergroup_scale_count(h) if quant == "pergroup" else mxfp8_scale_count(h)


# --------------------------------------------------------------------------- numbers


def quantise_record(row: np.ndarray, quant: str, fp8: str, record: np.ndarray,
                    smooth: np.ndarray | None = None) -> None:
    """Write one token's quantised bytes and scales into ``record`` (the UB row, uint8),
    at the offsets of :func:`record_layout`; the pad between is left as it is."""
    h = row.shape[-1]
    _, off, nbytes = record_layout(h, quant)
    if quant == MXFP4:
        q, scale_bytes = mxfp4_record(row)
        record[:q.size] = q
        record[off:off + nbytes] = scale_bytes
        return
    if quant == "pergroup":
        q, s = pergroup_quantize(row[None, :], fp8, smooth)
        scale_bytes = s.view(np.uint8).reshape(-1)
    else:
        q, scales = mxfp8_quantize(row[None, :], saturate=True, fp8=fp8,
                                   clip=quant == "mxfp8_clip", zero_subnormal_blocks=True)
        scale_bytes = scales.reshape(-1)
    record[:h] = q[0]
    record[off:off + nbytes] = scale_bytes


def mxfp4_record(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QuantDynamicMx to E2M1 of one bf16 token: the row zero-filled to a whole block (the
    kernel's Duplicate before the load), the 950 normal dispatch's quantiser, then the
    ceil(H/2) payload bytes and Align2(ceil(H/32)) scale bytes (the pad scale 0)."""
    h = row.shape[-1]
    padded = np.zeros((1, align_up(h, MXFP8_BLOCK)), tables().bf16)
    padded[0, :h] = row
    packed, scales = mxfp4_quantize_bf16(padded)
    out = np.zeros(mxfp8_scale_count(h), np.uint8)
    out[:scales.shape[1]] = scales[0]
    return packed[0, :ceil_div(h, 2)], out


def pertoken_fp8_row(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QuantDynamicPerToken to e4m3 of one token, the zero guard on: (codes, fp32 1/d);
    the 950 normal dispatch's per-token FP8 (recipes.fp8_token_quantize) with d = 1 for
    a zero row, where the normal kernel has none."""
    q, s = fp8_token_quantize(row[None, :], "e4m3", zero_guard=True)
    return q[0], s


def per_token_fp8_instrs(h: int) -> list[tuple[str, int, Any]]:
    """QuantDynamicPerToken's second half to FP8: Muls by 448 / max, one fp32 -> fp8 cast
    (CAST_RINT, saturating)."""
    return [("muls", h, np.float32), ("cast_fp8", h, np.float32)]


# --------------------------------------------------------------------------- instructions


def zero_fill_vf(h: int) -> VF:
    """ProcessToken's Duplicate(QUANT_PADDING_VALUE) over the Align128(H) input bytes (one
    MemBase call: one register broadcast, a store per 256 B)."""
    return VF("Duplicate", (VLoop((vi("dup", "z"),)),
                            VLoop((vi("store", None, "z"),), ceil_div(input_bytes(h), 256))))


def zero_fill(ctx: Any, src: Any, h: int, timing_only: bool) -> None:
    """Duplicate(QUANT_PADDING_VALUE) of the input buffer before the token's load, as
    ProcessToken (dispatch) and the MXFP8 combine send issue it: the scale VFs read
    Align128(H) elements, so the tail past H must be zeros. Any comm_alg calls it."""
    ctx.vf("zero_fill", zero_fill_vf(h), writes=[src],
           fn=None if timing_only else lambda: src.bytes_at(0, src.nbytes).fill(0))


def per_tile_vf(h: int, smooth: bool) -> VF:
    """ComputePerTileDynamic: per 128 elements one iteration (load, two casts to fp32,
    [smooth], interleave, |.|, max, ReduceMax, broadcast, d = max / amax, two Muls, two
    casts to fp8, two packed stores, 1 / d, a first-element store)."""
    body = [vi("load", "x"), vi("cast", "f0", "x"), vi("cast", "f1", "x")]
    if smooth:
        body += [vi("load", "sm"), vi("mul", "f0", "f0", "sm"), vi("mul", "f1", "f1", "sm")]
    body += [vi("select", "v0", "f0", "f1"),  # Interleave (a lane permute, paired like Select)
             vi("abs", "a0", "v0"), vi("abs", "a1", "v0"), vi("max", "m", "a0", "a1"),
             vi("reduce_max", "m", "m"), vi("dup", "m", "m"), vi("div", "d", "fmax", "m"),
             vi("mul", "y0", "v0", "d"), vi("mul", "y1", "v0", "d"),
             vi("cast", "q0", "y0"), vi("cast", "q1", "y1"),
             vi("store_pack", None, "q0"), vi("store_pack", None, "q1"),
             vi("div", "r", "one", "d"), vi("store_first", None, "r")]
    return VF("ComputePerTileDynamic", (VLoop((vi("dup", "fmax"), vi("dup", "one"))),
                                        VLoop(tuple(body), ceil_div(h, PERGROUP_BLOCK))))


def max_exp_vf(h: int, fp16: bool, clip: bool) -> VF:
    """ComputeMaxExp (bf16: exponent bits; fp16: invalid check, cast to bf16 first) or
    ComputeMaxExpClip (|x| bits): per 256 elements a deinterleaving load, the bits, a Max,
    ReduceMaxWithDataBlock (one value per 32 elements) and an unaligned store."""
    if clip:
        pre = (vi("dup", "mask"),)
        body = (vi("load", "x"), vi("and", "a0", "x", "mask"), vi("and", "a1", "x", "mask"),
                vi("max", "m", "a0", "a1"), vi("reduce_max", "m", "m"), vi("store", None, "m"))
    elif fp16:
        pre = (vi("dup", "mask"), vi("dup", "inv"))
        body = (vi("load", "x"), vi("and", "s0", "x", "inv"), vi("and", "s1", "x", "inv"),
                vi("cmps", "k0", "s0", "inv"), vi("cmps", "k1", "s1", "inv"),
                vi("cast", "b0", "x"), vi("cast", "b1", "x"),
                vi("and", "e0", "b0", "mask"), vi("and", "e1", "b1", "mask"),
                vi("select", "e0", "e0", "k0"), vi("select", "e1", "e1", "k1"),
                vi("max", "m", "e0", "e1"), vi("reduce_max", "m", "m"), vi("store", None, "m"))
    else:
        pre = (vi("dup", "mask"),)
        body = (vi("load", "x"), vi("and", "e0", "x", "mask"), vi("and", "e1", "x", "mask"),
                vi("max", "m", "e0", "e1"), vi("reduce_max", "m", "m"), vi("store", None, "m"))
    name = "ComputeMaxExpClip" if clip else "ComputeMaxExp"
    return VF(name, (VLoop(pre), VLoop(body, ceil_div(h, 256)), VLoop((vi("store", None),))))


def scale_vf(h: int, clip: bool) -> VF:
    """ComputeScale (128 exponents per iteration: three compares, clamp, subtract, shift,
    two selects, packed E8M0 store; the 1/scale in bf16: compare, subtract, three selects,
    store) or ComputeScaleClip (64 per iteration, in fp32: unpacking load, cast, compares,
    floor clamp, * 1/max, exponent and mantissa, the round-up masks, selects, two packs)."""
    n = mxfp8_scale_count(h)
    if clip:
        pre = tuple(vi("dup", f"c{i}") for i in range(9))
        body = (vi("load_unpack", "m16"), vi("cast", "m", "m16"),
                vi("cmps", "fin", "m", "c0"), vi("cmps", "nz", "m", "c1"),
                vi("max", "m", "m", "c2"), vi("mul", "m", "m", "c3"),
                vi("and", "e", "m"), vi("and", "man", "m", "c4"),
                vi("cmps", "p0", "e"), vi("cmps", "p1", "e"), vi("cmps", "p2", "man"),
                vi("and", "p0", "p0", "p1"), vi("and", "p0", "p0", "p2"),
                vi("cmps", "p1", "e"), vi("cmps", "p2", "man"), vi("and", "p1", "p1", "p2"),
                vi("or", "p0", "p0", "p1"), vi("adds", "e1", "e"),
                vi("select", "x", "e1", "p0"), vi("select", "x", "x", "fin"),
                vi("select", "x", "x", "nz"), vi("select", "o", "x"),
                vi("store_pack", None, "o"), vi("and", "x2", "x"),
                vi("sub", "hs", "c5", "x2"), vi("select", "hs", "hs", "fin"),
                vi("select", "hs", "hs", "nz"), vi("select", "ho", "hs"),
                vi("store", None, "ho"))
        return VF("ComputeScaleClip", (VLoop(pre), VLoop(body, ceil_div(n, 64))))
    pre = tuple(vi("dup", f"c{i}") for i in range(7))
    body = (vi("load", "m"), vi("cmps", "fin", "m", "c0"), vi("cmps", "nz", "m", "c1"),
            vi("cmps", "le", "m", "c2"), vi("select", "m", "c2", "le"),
            vi("sub", "sh", "m", "c2"), vi("and", "s", "sh"),
            vi("select", "s", "s", "fin"), vi("select", "s", "s", "nz"),
            vi("store_pack", None, "s"), vi("cmps", "sp", "sh", "c3"),
            vi("sub", "hs", "c3", "sh"), vi("select", "hs", "hs", "fin"),
            vi("select", "hs", "hs", "nz"), vi("select", "hs", "c4", "sp"),
            vi("store", None, "hs"))
    return VF("ComputeScale", (VLoop(pre), VLoop(body, ceil_div(n, 128))))


def fp8_data_vf(h: int, fp16: bool) -> VF:
    """ComputeFp8Data: per 256 elements a deinterleaving load and a broadcast load of the
    1/scale values; bf16: two bf16 Muls, interleaves, casts to fp32 and to fp8; fp16: casts
    to fp32 first (and of the scale), four fp32 Muls; four packed stores."""
    ld = (vi("load", "x"), vi("load_brc", "hs"))
    st = tuple(vi("store_pack", None, f"q{i}") for i in range(4))
    if fp16:
        mid = (vi("cast", "a0", "x"), vi("cast", "a1", "x"), vi("cast", "f", "hs"),
               vi("mul", "a0", "a0", "f"), vi("mul", "a1", "a1", "f"),
               vi("select", "a0", "a0", "a1"), vi("cast", "b0", "x"), vi("cast", "b1", "x"),
               vi("mul", "b0", "b0", "f"), vi("mul", "b1", "b1", "f"),
               vi("select", "b0", "b0", "b1"), vi("select", "a0", "a0", "b0"),
               vi("select", "a1", "a1", "b1"),
               *(vi("cast", f"q{i}", "a0" if i < 2 else "a1") for i in range(4)))
    else:
        mid = (vi("mul", "x0", "x", "hs"), vi("mul", "x1", "x", "hs"),
               vi("select", "x0", "x0", "x1"), vi("cast", "a0", "x0"), vi("cast", "a1", "x0"),
               vi("select", "a0", "a0", "a1"), vi("cast", "q0", "a0"), vi("cast", "q1", "a1"),
               vi("cast", "b0", "x1"), vi("cast", "b1", "x1"), vi("select", "b0", "b0", "b1"),
               vi("cast", "q2", "b0"), vi("cast", "q3", "b1"))
    return VF("ComputeFp8Data", (VLoop(ld + mid + st, ceil_div(h, 256)),))


def fp4_data_vf(h: int) -> VF:
    """ComputeFp4Data of bf16 tokens: per 256 elements a deinterleaving load and a
    broadcast load of the 1/scale values, two bf16 Muls, an interleave, two casts to FP4
    and two packed stores."""
    body = (vi("load", "x"), vi("load_brc", "hs"), vi("mul", "x0", "x", "hs"),
            vi("mul", "x1", "x", "hs"), vi("select", "x0", "x0", "x1"),
            vi("cast", "q0", "x0"), vi("cast", "q1", "x1"),
            vi("store_pack", None, "q0"), vi("store_pack", None, "q1"))
    return VF("ComputeFp4Data", (VLoop(body, ceil_div(h, 256)),))


def quant_vfs(h: int, quant: str, fp16: bool, smooth: bool) -> Sequence[VF]:
    """QuantProcess's VFs for one token, in issue order (after the load; the zero fill
    before it is :func:`zero_fill_vf`)."""
    if quant == "pergroup":
        return (per_tile_vf(h, smooth),)
    if quant == MXFP4:  # bf16 tokens only: DeepEP's dispatch takes bf16
        return (max_exp_vf(h, False, False), scale_vf(h, False), fp4_data_vf(h))
    clip = quant == "mxfp8_clip"
    return (max_exp_vf(h, fp16, clip), scale_vf(h, clip), fp8_data_vf(h, fp16))


# --------------------------------------------------------------------------- combine MXFP8

COMBINE_MX = {"mxfp8_e5m2": "e5m2", "mxfp8_e4m3": "e4m3"}
"""The 950's combine comm_quant_mode 3 and 4 (MXFP8_E5M2 / _E4M3_COMM_QUANT) -> format."""
COMBINE_MODE = {"none": 0, "int8": 2, "mxfp8_e5m2": 3, "mxfp8_e4m3": 4}


def combine_mx_bytes(h: int) -> int:
    """commDataBytes_ of the MXFP8 combine: tokenScaleCnt_ (Align256(H) / 2 + Align2(ceil(H /
    32))) token-dtype elements, i.e. Align256(H) fp8 bytes and twice the E8M0 count (the
    second half is the quantisation buffer's unwritten tail)."""
    return align_up(h, 256) + 2 * mxfp8_scale_count(h)


def combine_quantise(row: np.ndarray, fp8: str, out: np.ndarray) -> None:
    """QuantMxFp8 of one expert row into ``out`` (uint8): [fp8 bytes][pad to Align256(H)]
    [E8M0 scales]; ComputeScale and ComputeFp8Data as the dispatch's mode 4."""
    h = row.shape[-1]
    q, scales = mxfp8_quantize(row[None, :], saturate=True, fp8=fp8, zero_subnormal_blocks=True)
    out[:h] = q[0]
    off = align_up(h, 256)
    out[off:off + scales.shape[1]] = scales[0]


def combine_dequantise(raw: np.ndarray, h: int, fp8: str) -> np.ndarray:
    """DeQuantMxFp8's fp32 row: fp32(fp8) * the block's scale, the scale being the E8M0 byte
    shifted into an fp32 exponent field (ShiftLefts by 23: byte 0 is +0.0, 0xFF +inf; the
    rest 2^(b - 127), what the ml_dtypes cast gives)."""
    off = align_up(h, 256)
    b = raw[off:off + ceil_div(h, MXFP8_BLOCK)]
    scale = np.where(b == 0, np.float32(0), np.where(b == 0xFF, np.float32(np.inf),
                                                      e8m0_values(np.minimum(b, 254))))
    vals = raw[:h].view(fp8_format(fp8)[0]).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return vals * np.repeat(scale.astype(np.float32), MXFP8_BLOCK)[:h]


def combine_quant_vfs(h: int, fp16: bool) -> Sequence[VF]:
    """QuantMxFp8's VFs: ComputeMaxExp, ComputeScale, ComputeFp8Data (the dispatch's)."""
    return (max_exp_vf(h, fp16, False), scale_vf(h, False), fp8_data_vf(h, fp16))


def combine_dequant_vf(h: int, weighted: bool) -> VF:
    """DeQuantMxFp8: per 64 scales an unpacking load, the shift, an interleaving store; then
    per 128 elements a broadcast load of the scales, an unpacking load of the fp8, a
    deinterleaving load of the fp32 sum, two casts, two Muls, [two Muls by the expert
    scale], two Adds and an interleaving store."""
    first = VLoop((vi("load_unpack", "e"), vi("and", "f", "e"), vi("store", None, "f")),
                  ceil_div(mxfp8_scale_count(h), 64))
    body = [vi("load_brc", "s"), vi("load_unpack", "q"), vi("load", "acc"),
            vi("cast", "a", "q"), vi("cast", "b", "q"), vi("mul", "a", "s", "a"),
            vi("mul", "b", "s", "b")]
    if weighted:
        body += [vi("muls", "a", "a"), vi("muls", "b", "b")]
    body += [vi("add", "acc", "acc", "a"), vi("add", "acc", "acc", "b"),
             vi("store", None, "acc")]
    return VF("DeQuantMxFp8", (first, VLoop(tuple(body), ceil_div(h, 128))))


__all__ = ["COMBINE_MODE", "COMBINE_MX", "combine_dequant_vf", "combine_dequantise",
           "combine_mx_bytes", "combine_quant_vfs", "combine_quantise",
           "A3_MODES", "FP4_MODES", "FP8_MODES", "MXFP4", "MXFP8_BLOCK", "MX_MODES",
           "NOT_MODELLED", "PERTOKEN_FP8", "PER_TOKEN_MODES", "QUANT_MODE", "VF_MODES",
           "fp4_data_vf", "fp8_mode", "input_bytes", "mxfp4_record", "out_bytes",
           "per_token_fp8_instrs", "pertoken_fp8_row", "quant_vfs", "vf_mode",
           "quantise_record", "record_layout", "scale_count", "scale_dtype", "zero_fill",
           "zero_fill_vf"]
