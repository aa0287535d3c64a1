"""Case directories: generation, reading with clear errors, atomic outputs, golden check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npusim.errors import InputError
from npusim.kernels.cann_sample.casedir import (
    chip_file,
    compare_with_golden,
    generate_case,
    read_case_inputs,
    write_outputs,
)
from npusim.kernels.cann_sample.reference import (
    expert_outputs_from_dispatch,
    reference_combine,
    reference_dispatch,
)
from npusim.workload.shape import MoeShape

W, BS, H, K, L = 2, 4, 64, 2, 2


@pytest.fixture()
def case(tmp_path: Path) -> Path:
    generate_case(tmp_path, MoeShape(W, BS, H, K, L), "mxfp8", "int8", seed=1)
    return tmp_path


def _run_reference(case: Path) -> list[dict[str, np.ndarray]]:
    """What a correct simulator would write: full-size buffers from the case inputs."""
    ins = read_case_inputs(case, MoeShape(W, BS, H, K, L), "dispatch_combine")
    disp = reference_dispatch([d["x"] for d in ins], [d["expert_ids"] for d in ins], L, "mxfp8")
    x = reference_combine(
        [d["expand_x"] for d in ins],
        [d["assist_info_for_combine"] for d in disp],
        [d["ep_recv_count"] for d in disp],
        [d["expert_ids"] for d in ins],
        [d["expert_scales"] for d in ins],
        MoeShape(W, BS, H, K, L),
        quant="int8",
    )
    return [dict(disp[r], x=x[r]) for r in range(W)]


def test_generated_files_and_sizes(case: Path):
    A = BS * W * min(K, L)
    for r in range(W):
        sizes = {p.name: p.stat().st_size for p in (case / "input" / f"chip_{r}").iterdir()}
        assert sizes == {
            f"x_{r}.bin": BS * H * 2,
            f"expert_ids_{r}.bin": BS * K * 4,
            f"expand_x_{r}.bin": A * H * 2,
            f"expert_scales_{r}.bin": BS * K * 4,
        }
        recv = np.fromfile(chip_file(case, "golden", r, "ep_recv_count"), np.int32)
        n = int(recv[-1])
        assert recv.size == W * L
        assert chip_file(case, "golden", r, "expand_x").stat().st_size == n * H
        assert chip_file(case, "golden", r, "dynamic_scales").stat().st_size == n * 2
        assert chip_file(case, "golden", r, "assist_info_for_combine").stat().st_size == n * 12
        assert chip_file(case, "golden", r, "expert_token_nums").stat().st_size == L * 8
        assert chip_file(case, "golden", r, "x").stat().st_size == BS * H * 2
        assert (case / "output" / f"chip_{r}").is_dir()
    ids = np.fromfile(chip_file(case, "input", 0, "expert_ids"), np.int32).reshape(BS, K)
    assert ids.tolist() == [[0, 1], [2, 3], [1, 2], [3, 0]]  # balanced round robin


def test_read_inputs(case: Path):
    ins = read_case_inputs(case, MoeShape(W, BS, H, K, L), "combine")
    assert set(ins[1]) == {"expert_ids", "expand_x", "expert_scales"}
    assert ins[1]["expand_x"].shape == (16, 64) and ins[1]["expand_x"].dtype == np.float16
    d = read_case_inputs(case, MoeShape(W, BS, H, K, L), "dispatch")
    assert set(d[0]) == {"x", "expert_ids"} and d[0]["x"].shape == (BS, H)


def test_outputs_pass_and_fail_the_sample_check(case: Path):
    outs = _run_reference(case)
    assert len(compare_with_golden(case, W)) == 12  # nothing written yet: all missing
    for r in range(W):
        write_outputs(case, r, outs[r])
    assert not list((case / "output").rglob("*.tmp"))
    assert compare_with_golden(case, W) == []
    # one flipped byte in a golden-covered prefix
    p = chip_file(case, "output", 1, "x")
    raw = bytearray(p.read_bytes())
    raw[10] ^= 0x01
    p.write_bytes(bytes(raw))
    (mm,) = compare_with_golden(case, W)
    assert mm.file == "chip_1/x_1.bin" and mm.reason == "bytes differ"
    assert (mm.first_diff, mm.diff_bytes) == (10, 1)
    # bytes beyond the golden length do not matter; a short output does
    write_outputs(case, 1, {"x": outs[1]["x"]})
    q = chip_file(case, "output", 0, "ep_recv_count")
    q.write_bytes(q.read_bytes()[:-1])
    (mm,) = compare_with_golden(case, W)
    assert mm.reason == "output too short" and "golden 16 B" in str(mm)


def test_dispatch_combine_chain_through_a_case(case: Path):
    ins = read_case_inputs(case, MoeShape(W, BS, H, K, L), "dispatch")
    disp = reference_dispatch([d["x"] for d in ins], [d["expert_ids"] for d in ins], L, "mxfp8")
    ex = expert_outputs_from_dispatch(disp[0], "mxfp8", H, "float16")
    assert ex.shape == (BS * W * min(K, L), H) and ex.dtype == np.float16


def test_errors_name_the_file(case: Path):
    with pytest.raises(InputError, match="found 2 chip_\\* directories but the run has W=4"):
        read_case_inputs(case, MoeShape(4, BS, H, K, L), "dispatch")
    p = chip_file(case, "input", 1, "x")
    p.write_bytes(p.read_bytes()[:-2])
    with pytest.raises(InputError) as e:
        read_case_inputs(case, MoeShape(W, BS, H, K, L), "dispatch")
    assert e.value.source == str(p)
    assert "expected 512 bytes for shape [4, 64] of float16, found 510 bytes" in str(e.value)
    p.unlink()
    with pytest.raises(InputError, match="file not found"):
        read_case_inputs(case, MoeShape(W, BS, H, K, L), "dispatch")
    ids_path = chip_file(case, "input", 0, "expert_ids")
    ids = np.fromfile(ids_path, np.int32)
    ids[3] = 4
    ids.tofile(ids_path)
    with pytest.raises(InputError, match="expert id 4 at token 1, k 1 is outside \\[0, 4\\)"):
        read_case_inputs(case, MoeShape(W, BS, H, K, L), "combine")


def test_generate_bf16_unquantised(tmp_path: Path):
    generate_case(tmp_path, MoeShape(2, 3, 40, 2, 1, dtype="bfloat16"), "none", "int8", seed=2,
                  routing="uniform")
    assert not chip_file(tmp_path, "golden", 0, "dynamic_scales").exists()
    n = int(np.fromfile(chip_file(tmp_path, "golden", 0, "ep_recv_count"), np.int32)[-1])
    assert chip_file(tmp_path, "golden", 0, "expand_x").stat().st_size == n * 40 * 2


def test_repeated_expert_ids_are_refused_as_in_a_routing_file(case: Path):
    # a token's K ids name K distinct experts; token 2 of rank 1 gets expert 3 twice
    ids_path = chip_file(case, "input", 1, "expert_ids")
    ids = np.fromfile(ids_path, np.int32).reshape(BS, K)
    ids[2] = [3, 3]
    ids.tofile(ids_path)
    with pytest.raises(InputError) as e:
        read_case_inputs(case, MoeShape(W, BS, H, K, L), "dispatch")
    assert e.value.source == str(ids_path)
    assert "token 2: expert 3 appears twice" in str(e.value)
    assert "\n" not in str(e.value)
