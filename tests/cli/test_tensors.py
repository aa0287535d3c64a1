"""`npusim run --tensors DIR`: every op's inputs and outputs as .npy files under the names
the family declares. A dispatch_combine dump with identity experts satisfies, per
element, x_out = x * sum_k w_k within the token dtype's rounding (numpy on the files)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml

from npusim.cli import main
from tests.kernels.cann_sample.samplehelp import unit_roundoff

DISPATCH_IN = {"x", "expert_ids"}
DISPATCH_OUT = {"expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums",
                "ep_recv_count"}
COMBINE_IN = {"expand_x", "assist_info_for_combine", "ep_recv_count", "expert_ids",
              "expert_scales"}


def _tokens(path: Path, dtype: str) -> np.ndarray:
    """A token tensor; bfloat16 is dumped as its uint16 bits (.npy has no bfloat16)."""
    a = np.load(path)
    if dtype == "bfloat16":
        assert a.dtype == np.uint16
        return a.view(ml_dtypes.bfloat16)
    return a


def _names(d: Path) -> set[str]:
    return {p.stem for p in d.glob("*.npy")}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dump_of_dispatch_combine_is_x_times_the_weight_sum(tmp_path, dtype):
    W, BS, H, K = 4, 8, 1024, 4
    doc = {"name": "dump", "workload": {
        "op": "dispatch_combine", "bs": BS, "h": H, "k": K, "ep_world_size": W,
        "experts_per_rank": 2, "dtype": dtype, "routing": {"kind": "uniform", "seed": 5}}}
    sc = tmp_path / "dump.yaml"
    sc.write_text(yaml.safe_dump(doc))
    dump = tmp_path / "tensors"
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--tensors", str(dump),
                 "--workers", "1"]) == 0
    u = unit_roundoff(dtype)
    for r in range(W):
        d_in, d_out = (dump / "dispatch" / f"rank_{r}" / side for side in ("in", "out"))
        c_in, c_out = (dump / "combine" / f"rank_{r}" / side for side in ("in", "out"))
        assert (_names(d_in), _names(d_out)) == (DISPATCH_IN, DISPATCH_OUT)
        assert (_names(c_in), _names(c_out)) == (COMBINE_IN, {"x"})
        x, out = _tokens(d_in / "x.npy", dtype), _tokens(c_out / "x.npy", dtype)
        w = np.load(c_in / "expert_scales.npy")
        assert x.shape == out.shape == (BS, H) and w.shape == (BS, K)
        assert str(x.dtype) == str(out.dtype) == dtype
        assert np.array_equal(np.load(c_in / "expert_ids.npy"), np.load(d_in / "expert_ids.npy"))
        x64 = x.astype(np.float64)
        want = x64 * w.astype(np.float64).sum(axis=1, keepdims=True)
        # K fp32 products and sums (2^-24 each of sum |w| |x|), one cast to the token dtype
        mag = np.abs(x64) * np.abs(w.astype(np.float64)).sum(axis=1, keepdims=True)
        bound = u * np.abs(want) + (K + 1) * 2.0**-24 * mag * (1 + u) + 2.0**-24
        assert np.all(np.abs(out.astype(np.float64) - want) <= bound)
        assert np.any(out != 0)


def test_tensors_path_that_is_a_file_is_one_line_exit_2(tmp_path, capsys):
    sc = Path(__file__).resolve().parents[2] / "scenarios" / "dispatch_bs8_none.yaml"
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--tensors", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--tensors" in err and "not a directory" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option", ["--out", "--tensors"])
def test_a_folder_under_a_file_says_a_folder_is_allowed(option, tmp_path, capsys):
    """A folder output whose parent is a file: the line says what the option takes, a
    folder, not the file outputs' "a regular file"."""
    sc = Path(__file__).resolve().parents[2] / "scenarios" / "dispatch_bs8_none.yaml"
    f = tmp_path / "file"
    f.write_text("x")
    paths = {"--out": str(tmp_path / "o"), "--tensors": str(tmp_path / "t")}
    paths[option] = str(f / "sub")
    assert main(["run", str(sc), "--out", paths["--out"], "--tensors", paths["--tensors"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith(f"npusim: error: command line: {option}: {f / 'sub'}: ")
    assert err.endswith("; allowed: a folder or a new path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
