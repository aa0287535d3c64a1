"""Expert ids read from a .npy file (routing captured from a real model).

The file holds one int32 array of shape [W, BS, K]: ids[r, t, k] is the k-th expert of token
t on rank r, an MoE expert id in 0..E-1 (E = (W - S_r) * L; shared experts are not named).
It is read from its bytes once, with numpy's pickle support off (a scenario is data: no
user file is ever unpickled), and checked completely, so a bad file is one InputError naming
the first bad element. The SHA-256 of those same bytes identifies the file in reports.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npusim.errors import InputError

NPY_MAGIC = b"\x93NUMPY"
HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
           (2, 0): np.lib.format.read_array_header_2_0}


@dataclass(frozen=True)
class RoutingFile:
    """The checked ids of a routing file and the digest of the bytes they came from."""

    ids: np.ndarray  # [W, BS, K] int32
    sha256: str


def read_routing_file(path: Path, shown: str, src: str, key: str,
                      W: int, BS: int, K: int, E: int) -> RoutingFile:
    """Read and check `path` (named `shown` in errors, as the scenario wrote it); every
    problem is an InputError of `src` at `key`."""

    def bad(message: str) -> InputError:
        return InputError(src, key, message)

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise bad(f"{shown} not found (looked for {path})") from None
    except IsADirectoryError:
        raise bad(f"{shown} is a directory; allowed: a .npy file of expert ids") from None
    except OSError as exc:
        raise bad(f"cannot read {shown}: {exc.strerror or exc}") from None
    ids = _array(data, shown, bad)
    need = (W, BS, K)
    if ids.dtype.kind != "i" or ids.dtype.itemsize != 4:
        raise bad(f"{shown} holds {ids.dtype} ids; allowed: int32 "
                  "(save ids.astype(numpy.int32))")
    if ids.shape != need:
        raise bad(f"{shown} has shape {list(ids.shape)}; the workload needs [W, BS, K] = "
                  f"{list(need)} (ep_world_size, bs, k)")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    out = np.flatnonzero((ids < 0) | (ids >= E))
    if out.size:
        at = np.unravel_index(out[0], need)
        raise bad(f"{shown}{_index(at)} = {ids[at]} is out of range; allowed: 0..{E - 1} "
                  "(num_experts)")
    repeated = repeated_id(ids)
    if repeated:
        at, e, times = repeated
        raise bad(f"{shown}{_index(at)}: expert {e} appears {times}; a token's "
                  f"{K} expert ids must be distinct")
    return RoutingFile(ids, hashlib.sha256(data).hexdigest())


def repeated_id(ids: np.ndarray) -> tuple[tuple[int, ...], int, str] | None:
    """The first token (index of ids[..., K]) whose K expert ids are not distinct, the
    repeated expert and how often it appears ("twice", "3 times"); None if all are."""
    if ids.shape[-1] < 2:
        return None
    s = np.sort(ids, axis=-1)
    twice = (s[..., 1:] == s[..., :-1]).any(axis=-1)
    if not twice.any():
        return None
    at = tuple(int(i) for i in np.unravel_index(np.flatnonzero(twice)[0], twice.shape))
    row = s[at]
    e = int(row[1:][row[1:] == row[:-1]][0])
    n = int((row == e).sum())
    return at, e, "twice" if n == 2 else f"{n} times"


def _array(data: bytes, shown: str, bad: Callable[[str], InputError]) -> np.ndarray:
    """The one array of a .npy file's bytes; never unpickles (object arrays are refused)."""
    if not data.startswith(NPY_MAGIC):
        what = "a .npz archive" if data.startswith(b"PK") else "not a .npy file"
        raise bad(f"{shown} is {what} (no \\x93NUMPY header); allowed: one array saved "
                  "with numpy.save")
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version not in HEADERS:
            raise ValueError(f"format version {version[0]}.{version[1]}; allowed: 1.0, 2.0")
        _shape, _fortran, dtype = HEADERS[version](f)
    except Exception as exc:  # numpy's header parser raises assorted types on bad bytes
        raise bad(f"{shown} has a malformed .npy header ({exc})") from None
    if dtype.hasobject:
        raise bad(f"{shown} holds Python objects (a pickled array), which npusim never "
                  "loads; allowed: a plain int32 array")
    f.seek(0)
    try:
        return np.load(f, allow_pickle=False)
    except Exception as exc:  # a header that lies about the data (short, or bad sizes)
        raise bad(f"{shown} is truncated or corrupt ({exc})") from None


def _index(at: tuple[np.intp | int, ...]) -> str:
    return "[" + ", ".join(str(int(i)) for i in at) + "]"
