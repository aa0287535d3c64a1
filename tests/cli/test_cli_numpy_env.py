"""What the CLI sets before numpy loads, unless the user chose otherwise: one BLAS thread,
and numpy's large arrays in 4 KiB pages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npusim.numpy_pages import ENV, _switch

PROBE = ("import os, sys\n"
         "from npusim.cli import main\n"
         "main(['presets'])\n"
         "import numpy\n"
         "from npusim.numpy_pages import _switch\n"
         "sys.stderr.write(f\"{os.environ['OPENBLAS_NUM_THREADS']} "
         "{os.environ['NUMPY_MADVISE_HUGEPAGE']} {_switch()(False)}\")\n")


def _probe(**env: str) -> list[str]:
    """The BLAS threads, numpy's huge-page switch in the environment and in numpy, as the
    CLI left them."""
    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS") and k != ENV}
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env={**base, **env}, check=True)
    return p.stderr.strip().split()


def test_one_blas_thread_by_default() -> None:
    assert _probe()[0] == "1"


def test_the_users_choice_stays() -> None:
    assert _probe(OPENBLAS_NUM_THREADS="3")[0] == "3"


@pytest.mark.skipif(_switch() is None, reason="this numpy has no huge-page switch")
def test_numpy_starts_in_small_pages_unless_the_user_chose() -> None:
    assert _probe()[1:] == ["0", "False"]
    assert _probe(NUMPY_MADVISE_HUGEPAGE="1")[1:] == ["1", "True"]
