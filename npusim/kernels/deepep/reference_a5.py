"""What the 950's normal dispatch sends, in numpy, from the quantisation modes' definitions
(the goldens of npusim.kernels.quant.golden, not the recipes the simulated kernel runs):
every received row in reference.py's order, quantised per token (int8 without an epsilon,
pertoken_fp8_e4m3: 448 / max) or per 32 elements (OCP MX: E8M0 2^(floor(log2 amax) -
emax), MXFP4 two codes per byte, the first in the low nibble); and the test script's
per_token_cast_back, which turns the rows back into the combine's BF16 input."""

from __future__ import annotations

import numpy as np

from npusim.formats import e8m0_values, fp8_format, tables
from npusim.kernels.deepep import reference as ref
from npusim.kernels.quant import golden

F32 = np.float32
FP8 = {"mx_fp8_e4m3": "e4m3", "mx_fp8_e5m2": "e5m2", "pertoken_fp8_e4m3": "e4m3"}
MX = 32
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)  # E2M1 magnitudes by code & 7


def out_dtype(quant: str) -> np.dtype:
    """recv_x's dtype: int8, the FP8 format, uint8 holding FP4 pairs, or BF16."""
    if quant in FP8:
        return fp8_format(FP8[quant])[0]
    return np.dtype({"int8": np.int8, "mx_fp4_e2m1": np.uint8}.get(quant, tables().bf16))


def quantize(row: np.ndarray, quant: str) -> tuple[np.ndarray, np.ndarray]:
    """One token -> (its recv_x row as bytes, its dynamic_scales bytes)."""
    if quant == "int8":
        q, s = golden.pertoken_row(row, "int8")
    elif quant == "pertoken_fp8_e4m3":
        q, s = golden.pertoken_row(row, "e4m3")
    elif quant == "mx_fp4_e2m1":
        return golden.mxfp4_row(row)
    else:
        q, sc = golden.mx_row(row, FP8[quant], clip=False)
        return q, sc[:row.size // MX]
    return q, np.array([s], F32).view(np.uint8)


def dispatch(xs: list[np.ndarray], idxs: list[np.ndarray], s: ref.Sizes, quant: str
             ) -> list[dict[str, np.ndarray]]:
    """Every rank's received rows (reference.source_triples' order), quantised."""
    if quant == "bf16":
        return ref.dispatch(xs, idxs, s, quant)
    out = []
    for triple in ref.source_triples(idxs, s):
        got = [quantize(xs[src][t], quant) for src, t, _k in triple]
        rows = np.array([g[0] for g in got], np.uint8).reshape(len(got), -1)
        scales = np.array([g[1] for g in got], np.uint8).reshape(-1)
        mx = quant.startswith("mx_")
        out.append({"recv_x": rows.view(out_dtype(quant)),
                    "dynamic_scales": scales.view(tables().e8m0 if mx else F32),
                    "expand_idx": triple.reshape(-1)})
    return out


def cast_back(quant: str, rows: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """per_token_cast_back (tests/python/deepep/utils.py): fp32(code) * scale per token or
    per 32 (E8M0 2^(b - 127); FP4 unpacked low nibble first), cast to BF16."""
    n = rows.shape[0]
    bf16 = tables().bf16
    if not quant.startswith("mx_"):
        return (rows.astype(F32) * np.asarray(scales, F32).reshape(n)[:, None]).astype(bf16)
    if quant == "mx_fp4_e2m1":
        b = np.asarray(rows).view(np.uint8)
        codes = np.stack([b & 15, b >> 4], axis=-1).reshape(n, -1)
        vals = np.where(codes & 8, -1, 1) * E2M1[codes & 7]
    else:
        vals = np.asarray(rows).astype(F32)
    sc = e8m0_values(np.asarray(scales).view(np.uint8)).reshape(n, -1, 1)
    return (vals.astype(F32).reshape(n, -1, MX) * sc).reshape(n, -1).astype(bf16)
