"""Quantisation of the MoE kernels, in three parts (one concept each):

- :mod:`.formats`: the one table of number formats (token dtypes, BF16, FP8 E5M2/E4M3 with
  their largest values and emax, E8M0 bytes);
- :mod:`.recipes`: what the kernels compute, the way their vector units compute it
  (MXFP8 of the CANN sample and ops-transformer, per-group FP8, per-token and block INT8,
  the MegaMoE kernel's bf16 MXFP8);
- :mod:`.golden`: the schemes written from their definitions, to check the recipes.

Which golden is independent of which kernel is written in :mod:`.golden`: goldens and
recipes share only the format table. The names below are the package's API.
"""

from typing import Any

from npusim import formats
from npusim.formats import (
    E8M0_NAN,
    E8M0_PAD,
    MXFP8_BLOCK,
    TOKEN_DTYPE_NAMES,
    dtype_name,
    e8m0_bytes,
    e8m0_values,
    fp8_format,
    fp8_values,
    token_dtype,
)
from npusim.kernels.quant.recipes import (
    INT8_BLOCK,
    INT8_QMAX,
    MX_CLIP_FLOOR,
    PERGROUP_BLOCK,
    fp8_token_quantize,
    int8_block_dequantize,
    int8_block_quantize,
    int8_block_round_trip,
    int8_block_scale_count,
    int8_token_dequantize,
    int8_token_quantize,
    mx_quantize_bf16,
    mx_values,
    mxfp4_quantize_bf16,
    mxfp8_dequantize,
    mxfp8_quantize,
    mxfp8_scale_count,
    pergroup_dequantize,
    pergroup_quantize,
    pergroup_scale_count,
)

__all__ = [
    "BF16", "E8M0_NAN", "E8M0_PAD", "FP8_FORMATS", "INT8_BLOCK", "INT8_QMAX", "MXFP8_BLOCK",
    "MX_CLIP_FLOOR", "PERGROUP_BLOCK", "TOKEN_DTYPES", "dtype_name", "e8m0_bytes",
    "e8m0_values", "fp8_format", "fp8_token_quantize", "fp8_values", "int8_block_dequantize",
    "int8_block_quantize", "int8_block_round_trip", "int8_block_scale_count",
    "int8_token_dequantize", "int8_token_quantize", "mx_quantize_bf16", "mx_values",
    "mxfp4_quantize_bf16", "mxfp8_dequantize", "mxfp8_quantize", "mxfp8_scale_count",
    "pergroup_dequantize", "pergroup_quantize", "pergroup_scale_count", "token_dtype",
    "TOKEN_DTYPE_NAMES",
]


def __getattr__(name: str) -> Any:
    """BF16, TOKEN_DTYPES and FP8_FORMATS: ml_dtypes types, built on first use
    (:func:`.formats.tables`)."""
    return getattr(formats, name)
