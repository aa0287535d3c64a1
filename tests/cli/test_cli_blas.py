"""The CLI runs numpy with one BLAS thread unless the user chose a number."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import os, sys\n"
         "from npusim.cli import main\n"
         "main(['presets'])\n"
         "import numpy\n"
         "sys.stderr.write(os.environ['OPENBLAS_NUM_THREADS'])\n")


def _threads(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env={**base, **env}, check=True)
    return p.stderr.strip()


def test_one_blas_thread_by_default() -> None:
    assert _threads() == "1"


def test_the_users_choice_stays() -> None:
    assert _threads(OPENBLAS_NUM_THREADS="3") == "3"
