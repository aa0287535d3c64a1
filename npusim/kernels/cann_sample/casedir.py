"""CANN-sample case directories: read inputs, write outputs, check against goldens, generate.

Layout (raw little-endian arrays, no header; r = rank):
    CASE/input/chip_{r}/{x,expert_ids,expand_x,expert_scales}_{r}.bin
    CASE/golden/chip_{r}/{expand_x,dynamic_scales,assist_info_for_combine,
                          expert_token_nums,ep_recv_count,x}_{r}.bin
    CASE/output/chip_{r}/<same names as golden>
The sample's check (scripts/verify_result.py) compares each golden file byte for byte with the
same-length prefix of the output file, so outputs may be full buffers ([A, H] etc.).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npusim.errors import InputError
from npusim.kernels.cann_sample.reference import reference_combine, reference_dispatch
from npusim.outputs import refuse_special
from npusim.workload.inputs import RunInputs, generate_inputs
from npusim.workload.routing_file import repeated_id
from npusim.workload.shape import MoeShape

INPUT_DIR, GOLDEN_DIR, OUTPUT_DIR = "input", "golden", "output"
OPS = ("dispatch", "combine", "dispatch_combine")


def chip_file(case_dir: str | Path, kind: str, rank: int, name: str) -> Path:
    """CASE/<kind>/chip_{rank}/<name>_{rank}.bin"""
    return Path(case_dir) / kind / f"chip_{rank}" / f"{name}_{rank}.bin"


def _chips_dir(case_dir: str | Path, kind: str, W: int, what: str) -> Path:
    """CASE/<kind>, which must exist and hold one chip_<r> directory per rank (InputError
    naming the directory otherwise)."""
    d = Path(case_dir) / kind
    if not d.is_dir():
        raise InputError(source=str(d), key=None, message=f"{what} not found")
    chips = sum(1 for p in d.glob("chip_*") if p.is_dir() and p.name[5:].isdigit())
    if chips != W:
        raise InputError(source=str(d), key=None,
                         message=f"found {chips} chip_* directories but the run has W={W} ranks")
    return d


def read_bin(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Read a raw array, raising InputError (naming the file) if it is missing or mis-sized."""
    dtype = np.dtype(dtype)
    if not path.is_file():
        raise InputError(source=str(path), key=None, message="file not found")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise InputError(
            source=str(path),
            key=None,
            message=(
                f"expected {expected} bytes for shape {list(shape)} of {dtype.name}, "
                f"found {actual} bytes"
            ),
        )
    arr = np.fromfile(path, dtype=np.uint8).view(dtype)
    if sys.byteorder == "big" and dtype.itemsize > 1:
        arr = arr.byteswap()
    return arr.reshape(shape)


def read_case_inputs(case_dir: str | Path, shape: MoeShape, op: str
                     ) -> list[dict[str, np.ndarray]]:
    """Per-rank input arrays of a case: x and expert_ids for dispatch; expand_x [A, H],
    expert_ids and expert_scales for combine; all four for dispatch_combine.

    Expert ids must lie in [0, W*L) (the sample has no special experts).
    """
    if op not in OPS:
        raise ValueError(f"op {op!r} not one of {OPS}")
    W, BS, H, K, L = shape.W, shape.BS, shape.H, shape.K, shape.L
    dt = shape.np_dtype
    _chips_dir(case_dir, INPUT_DIR, W, "case input directory")
    A, E = shape.A, W * L
    out = []
    for r in range(W):
        d: dict[str, np.ndarray] = {}
        ids_path = chip_file(case_dir, INPUT_DIR, r, "expert_ids")
        ids = read_bin(ids_path, (BS, K), np.dtype(np.int32))
        bad = (ids < 0) | (ids >= E)
        if bad.any():
            t, k = (int(v[0]) for v in np.nonzero(bad))
            raise InputError(
                source=str(ids_path),
                key=None,
                message=(
                    f"expert id {int(ids[t, k])} at token {t}, k {k} is outside [0, {E}) "
                    f"(E = W*L = {W}*{L})"
                ),
            )
        repeated = repeated_id(ids)
        if repeated:
            (t,), e, times = repeated
            raise InputError(str(ids_path), None, f"token {t}: expert {e} appears {times}; "
                             f"a token's {K} expert ids must be distinct")
        d["expert_ids"] = ids
        if op in ("dispatch", "dispatch_combine"):
            d["x"] = read_bin(chip_file(case_dir, INPUT_DIR, r, "x"), (BS, H), dt)
        if op in ("combine", "dispatch_combine"):
            d["expand_x"] = read_bin(chip_file(case_dir, INPUT_DIR, r, "expand_x"), (A, H), dt)
            d["expert_scales"] = read_bin(
                chip_file(case_dir, INPUT_DIR, r, "expert_scales"), (BS, K), np.dtype(np.float32)
            )
        out.append(d)
    return out


def _atomic_write(path: Path, arr: np.ndarray) -> None:
    refuse_special(path)  # a regular file or a new path, never a device node or FIFO
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.ascontiguousarray(arr)
    if sys.byteorder == "big" and a.dtype.itemsize > 1:
        a = a.byteswap()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(a.tobytes())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_outputs(case_dir: str | Path, rank: int, outputs: dict[str, np.ndarray]) -> list[Path]:
    """Write CASE/output/chip_{rank}/<name>_{rank}.bin for each array (temp file + os.replace)."""
    paths = []
    for name, arr in outputs.items():
        p = chip_file(case_dir, OUTPUT_DIR, rank, name)
        _atomic_write(p, arr)
        paths.append(p)
    return paths


def _write(case_dir: str | Path, kind: str, rank: int, arrays: dict[str, np.ndarray]) -> None:
    for name, arr in arrays.items():
        _atomic_write(chip_file(case_dir, kind, rank, name), arr)


@dataclass
class Mismatch:
    """One golden file the outputs do not reproduce."""

    file: str  # path relative to CASE/golden, e.g. chip_0/x_0.bin
    reason: str  # "missing output" | "output too short" | "bytes differ"
    golden_bytes: int
    output_bytes: int
    first_diff: int | None = None  # byte offset of the first difference
    diff_bytes: int = 0  # bytes that differ within the compared prefix

    def __str__(self) -> str:
        s = f"{self.file}: {self.reason} (golden {self.golden_bytes} B, "
        s += f"output {self.output_bytes} B"
        if self.first_diff is not None:
            s += f", {self.diff_bytes} bytes differ, first at byte {self.first_diff}"
        return s + ")"


def compare_with_golden(case_dir: str | Path, W: int) -> list[Mismatch]:
    """The sample's accuracy rule: every golden byte equals the output file's prefix byte.

    Golden files of chips 0..W-1 are checked; an empty list means "accuracy test success".
    """
    gdir = _chips_dir(case_dir, GOLDEN_DIR, W, "golden directory")
    odir = Path(case_dir) / OUTPUT_DIR
    result = []
    for r in range(W):
        for g in sorted((gdir / f"chip_{r}").glob("*.bin")):
            rel = g.relative_to(gdir)
            golden = g.read_bytes()
            o = odir / rel
            if not o.is_file():
                result.append(Mismatch(str(rel), "missing output", len(golden), 0))
                continue
            with o.open("rb") as f:
                out = f.read(len(golden))
            out_size = o.stat().st_size
            if len(out) < len(golden):
                result.append(Mismatch(str(rel), "output too short", len(golden), out_size))
                continue
            if out != golden:
                d = np.nonzero(np.frombuffer(out, np.uint8) != np.frombuffer(golden, np.uint8))[0]
                result.append(
                    Mismatch(str(rel), "bytes differ", len(golden), out_size, int(d[0]), d.size)
                )
    return result


def generate_case(
    case_dir: str | Path,
    shape: MoeShape,
    dispatch_quant: str = "mxfp8",
    combine_quant: str = "int8",
    seed: int = 0,
    routing: str = "balanced",
    expert_token_nums_type: str = "count",
    saturate: bool = False,
    recip: bool = False,
) -> None:
    """Write a sample-style case (inputs and goldens) computed with the family's reference.

    Like gen_data.py: previous input/, golden/ and output/ of the case are removed, empty
    output/chip_* directories are created; the dispatch goldens hold only the received rows
    (expand_x, dynamic_scales for quantised modes, assist info), the combine input expand_x
    is random U(-10, 10) rows padded with zeros to A rows, and its golden x uses
    ``combine_quant`` (the sample always uses int8). Scale rows have Align2(ceil(H/32))
    bytes, the kernel's row stride (the sample's golden only works when ceil(H/32) is even).
    """
    case = Path(case_dir)
    for sub in (INPUT_DIR, GOLDEN_DIR, OUTPUT_DIR):
        if (case / sub).exists():
            shutil.rmtree(case / sub)
    W, L = shape.W, shape.L
    inp = generate_inputs(shape, routing=routing, seed=seed)
    disp = reference_dispatch(
        inp.x, inp.expert_ids, L, dispatch_quant, expert_token_nums_type, saturate=saturate
    )
    comb = reference_combine(
        inp.expand_x,
        [d["assist_info_for_combine"] for d in disp],
        [d["ep_recv_count"] for d in disp],
        inp.expert_ids,
        inp.expert_scales,
        shape,
        quant=combine_quant,
        recip=recip,
    )
    for r in range(W):
        _write_rank(case, r, inp, disp[r], comb[r], dispatch_quant != "none")


def _write_rank(case: Path, r: int, inp: RunInputs, disp: dict[str, np.ndarray], x: np.ndarray,
                scaled: bool) -> None:
    """Rank r's input/ files, its golden/ files (dispatch's received rows only, their
    scales when quantised, combine's x) and its empty output/chip_r directory."""
    _write(case, INPUT_DIR, r, {"x": inp.x[r], "expert_ids": inp.expert_ids[r],
                                "expand_x": inp.expand_x[r],
                                "expert_scales": inp.expert_scales[r]})
    n = int(disp["ep_recv_count"][-1])
    golden = {
        "expand_x": disp["expand_x"][:n],
        "assist_info_for_combine": disp["assist_info_for_combine"][:n],
        "expert_token_nums": disp["expert_token_nums"],
        "ep_recv_count": disp["ep_recv_count"],
        "x": x,
    }
    if scaled:
        golden["dynamic_scales"] = disp["dynamic_scales"][:n]
    _write(case, GOLDEN_DIR, r, golden)
    (case / OUTPUT_DIR / f"chip_{r}").mkdir(parents=True, exist_ok=True)
