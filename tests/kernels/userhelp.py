"""What the tests of a user's kernel file share: the head of a file that subclasses the
tutorial's family (examples/kernels/toy_moe.py, as `toy`), with the exceptions of odd
kinds they raise (a BaseException that is no Exception; one whose __str__ raises)."""

from __future__ import annotations

from pathlib import Path

TOY = Path(__file__).resolve().parents[2] / "examples" / "kernels" / "toy_moe.py"

HEAD = f'''
import sys
import numpy as np
from npusim.kernels import registry
toy = sys.modules[type(registry.from_file(registry.resolve_file({str(TOY)!r}, None))).__module__]


class Odd(BaseException):
    pass


class Mute(Exception):
    def __str__(self):
        raise RuntimeError("no text")
'''
