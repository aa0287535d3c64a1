"""The format table built on first use: ml_dtypes stays unimported in a float16 run without
quantisation, and the table it builds holds the encodings the formats define."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _fresh(code: str) -> str:
    """stdout of `code` in a new interpreter (sys.modules as a run starts)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    return done.stdout.strip()


def test_float16_run_without_quant_never_imports_ml_dtypes():
    out = _fresh(
        "import sys\n"
        "from npusim.scenario import load_scenario\n"
        "from npusim.sim import simulate\n"
        "r = simulate(load_scenario('scenarios/dispatch_bs8_none.yaml'))\n"
        "print(r.events > 0, 'ml_dtypes' in sys.modules)\n"
    )
    assert out == "True False"


def test_quant_package_import_is_lazy_and_builds_on_use():
    out = _fresh(
        "import sys\n"
        "import npusim.kernels.quant as q\n"
        "before = 'ml_dtypes' in sys.modules\n"
        "f16 = q.token_dtype('float16')\n"
        "still = 'ml_dtypes' in sys.modules\n"
        "bf = q.BF16\n"
        "print(before, still, f16, bf, 'ml_dtypes' in sys.modules)\n"
    )
    assert out == "False False float16 bfloat16 True"


def test_bf16_encodings():
    from npusim.kernels.quant import BF16, TOKEN_DTYPES, dtype_name, token_dtype

    # bf16 is the top half of fp32: sign 1, exponent 8 (bias 127), mantissa 7
    x = np.array([1.0, -2.0, 0.5, 3.0], np.float32).astype(BF16).view(np.uint16)
    assert [int(v) for v in x] == [0x3F80, 0xC000, 0x3F00, 0x4040]
    assert BF16.itemsize == 2 and token_dtype("bfloat16") == BF16
    assert dtype_name(BF16) == "bfloat16" and dtype_name(np.float16) == "float16"
    assert set(TOKEN_DTYPES) == {"float16", "bfloat16"}


def test_fp8_tables():
    from npusim.kernels.quant import FP8_FORMATS, fp8_format, fp8_values

    assert fp8_format("e4m3")[1:] == (448.0, 8) and fp8_format("e5m2")[1:] == (57344.0, 15)
    assert FP8_FORMATS["e4m3"][0].itemsize == 1
    e4m3, e5m2 = fp8_values("e4m3"), fp8_values("e5m2")
    # E4M3 (bias 7): 0x38 = 0 0111 000 -> 1.0; 0x7E = 0 1111 110 -> 1.75 * 2^8 = 448;
    # 0x01 -> the smallest subnormal 2^-6 * 1/8 = 2^-9; 0x7F is NaN (no infinities)
    assert (e4m3[0x38], e4m3[0x7E], e4m3[0x01], e4m3[0xB8]) == (1.0, 448.0, 2.0**-9, -1.0)
    assert math.isnan(e4m3[0x7F])
    # E5M2 (bias 15): 0x3C = 0 01111 00 -> 1.0; 0x7B = 0 11110 11 -> 1.75 * 2^15 = 57344;
    # 0x01 -> 2^-14 * 1/4 = 2^-16; 0x7C is +inf
    assert (e5m2[0x3C], e5m2[0x7B], e5m2[0x01], e5m2[0x7C]) == (1.0, 57344.0, 2.0**-16,
                                                               math.inf)


def test_e8m0_bytes_and_values():
    from npusim.kernels.quant import e8m0_bytes, e8m0_values

    # E8M0 byte s is 2^(s - 127); 0xFF is NaN
    assert [int(b) for b in e8m0_bytes(np.array([0, 127, 130, 254, 255]))] == [
        0, 127, 130, 254, 255]
    v = e8m0_values(np.array([127, 128, 126, 0, 255], np.uint8))
    assert list(v[:4]) == [1.0, 2.0, 0.5, 2.0**-127] and math.isnan(v[4])


def test_which_runs_build_the_table_before_a_fork():
    from npusim.formats import may_need_tables

    none = {"dispatch_quant": "none", "combine_quant": "none", "mxfp8_saturate": False}
    assert not may_need_tables("float16", none)
    assert may_need_tables("bfloat16", none)
    assert may_need_tables("float16", dict(none, dispatch_quant="mxfp8"))
    assert may_need_tables("float16", dict(none, combine_quant="int8"))
