"""Family deepep on the Atlas A2 (csrc/deepep/ops2 inside one server): outputs byte for byte
against the numpy reference (npusim/kernels/deepep/reference.py, written from DeepEP's
semantics), the A2 window layout and HCCL_BUFFSIZE check by hand, and the one-line refusals
(exit 2). Small shapes only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npusim.cli import main
from npusim.kernels.deepep import reference as ref
from npusim.kernels.deepep.window import needed_buffsize
from npusim.scenario import load_scenario
from npusim.sim import simulate
from npusim.units import MiB
from tests.kernels.deepep.deepephelp import bf16, refused, sizes, write_scenario

# one A2 server: 8 ranks, 2 experts each
SMALL = {"bs": 16, "h": 1024, "k": 4, "ep_world_size": 8, "experts_per_rank": 2}
W, E = 8, 16


def _write(tmp: Path, name: str = "a2", **workload: Any) -> Path:
    return write_scenario(tmp, SMALL, "atlas_a2", name, 5, **workload)


def _scenario(tmp: Path, **workload: Any):
    return load_scenario(_write(tmp, **workload))


def _inputs(sc) -> list[dict[str, np.ndarray]]:
    from npusim.kernels.deepep.family import FAMILY
    w = sc.workload
    return FAMILY.make_inputs(w.shape, w.options, w.op, {"routing": "uniform", "seed": 5}, True)


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_a2_outputs_match_reference(tmp_path: Path, quant: str) -> None:
    sc = _scenario(tmp_path, quant=quant)
    inputs = _inputs(sc)
    res = simulate(sc, workers=1)
    s = sizes(sc)
    lay, note, disp, comb = (r.outputs for r in res.ops)
    want_lay = [ref.layout(a["topk_idx"], s) for a in inputs]
    want_note = ref.notify([o["num_tokens_per_expert"] for o in want_lay], [16] * W, s)
    want_disp = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs], s, quant)
    for r in range(W):
        for name, want in want_lay[r].items():
            assert np.array_equal(lay[r][name], want), (r, name)
        for name, want in want_note[r].items():
            assert np.array_equal(note[r][name].reshape(-1), want.reshape(-1)), (r, name)
        n = want_disp[r]["recv_x"].shape[0]
        assert disp[r]["recv_x"][:n].tobytes() == want_disp[r]["recv_x"].tobytes(), r
        assert np.array_equal(disp[r]["expand_idx"][:3 * n], want_disp[r]["expand_idx"])
        if quant == "int8":
            assert disp[r]["recv_x"].dtype == np.int8
            want_s = want_disp[r]["dynamic_scales"]
            assert disp[r]["dynamic_scales"][:n].tobytes() == want_s.tobytes()
    rows = [(d["recv_x"].astype(np.float32) * d["dynamic_scales"][:, None]).astype(bf16())
            if quant == "int8" else d["recv_x"] for d in want_disp]
    want_x = ref.combine(rows, [d["expand_idx"] for d in want_disp],
                         [a["topk_idx"] for a in inputs], [a["topk_weights"] for a in inputs], E)
    for r in range(W):
        assert comb[r]["combined_x"].tobytes() == want_x[r].tobytes(), r


def test_a2_token_index_survives_dispatch_combine(tmp_path: Path) -> None:
    """The test scripts' check on one A2 server: x[:, -128:] = token index; with weights
    1/K the K returned copies sum back to it exactly (BF16 dispatch)."""
    from unittest import mock

    sc = _scenario(tmp_path)
    inputs = _inputs(sc)
    for a in inputs:
        a["x"][:, -128:] = np.arange(16, dtype=np.float32)[:, None].astype(a["x"].dtype)
        a["topk_weights"][:] = np.float32(0.25)
    with mock.patch.object(sc.workload.family, "make_inputs", lambda *a, **k: inputs):
        res = simulate(sc, workers=1)
    want = np.repeat(np.arange(16, dtype=np.float32)[:, None], 128, 1)
    for out in res.ops[-1].outputs:
        assert np.array_equal(out["combined_x"][:, -128:].astype(np.float32), want)


def test_a2_rounds_dispatch_matches_reference(tmp_path: Path) -> None:
    """Two long-sequence rounds: the A2 puts its round flags at dataState (not a per-round
    magic) and reads every round's offsets at once; the rows land the same."""
    kw = {"op": "dispatch", "bs": 48, "long_seq_round": 2, "per_round_tokens": 32}
    sc = _scenario(tmp_path, **kw)
    inputs = _inputs(sc)
    res = simulate(sc, workers=1)
    want = ref.dispatch([a["x"] for a in inputs], [a["topk_idx"] for a in inputs],
                        sizes(sc), "bf16")
    for r, out in enumerate(res.ops[-1].outputs):
        n = want[r]["recv_x"].shape[0]
        assert out["recv_x"][:n].tobytes() == want[r]["recv_x"].tobytes()
        assert np.array_equal(out["expand_idx"][:3 * n], want[r]["expand_idx"])


def test_a2_buffsize_check_by_hand() -> None:
    """ops2's check: (maxBs K (disp + comb) + 8 MiB + 404 MiB) * 2 + 4 * 2 MiB.
    H 1024: comb = Align512(2048) = 2048, disp = Align512(Align32(2048) + 44) = 2560;
    16 * 4 * 4608 = 294912 B; (294912 + 432013312) * 2 + 8388608 = 873005056 B = 832.6 MiB."""
    assert needed_buffsize(16, 1024, 4, 1, "a2") == 873005056
    # the A3 form for the same shape: (294912 + 4 MiB + 102 MiB) * 2 = 222887936 B
    assert needed_buffsize(16, 1024, 4, 1, "a3") == 222887936


def test_a2_window_layout_by_hand(tmp_path: Path) -> None:
    """Status inside windowsIn's last 8 MiB, halves of (total - 8 MiB) / 2, the combine area
    at 202 MiB of a half with an 8 MiB status area."""
    sc = _scenario(tmp_path)
    t = sc.workload.family.tiling(sc.workload.shape, sc.workload.options, sc.hardware)
    win = t.window
    total = 833 * MiB  # the smallest HCCL_BUFFSIZE the check accepts (832.6 MiB, above)
    assert t.buffsize_mb == 833 and win.total == total
    assert win.half == (total - 8 * MiB) // 2
    assert win.combine_status(1, 3) == win.half + 202 * MiB + 3 * 32
    assert win.combine_data(0, 2) == 210 * MiB + 2 * 2048
    assert win.dispatch_data(0, 1) == 210 * MiB + 16 * 4 * 2048 + 2560
    assert win.notify_magic(2) == total - 6 * MiB + 900 * 1024 + 2 * 256
    assert win.dispatch_status(1, 5) == total - 4 * MiB + 500 * 1024 + 5 * 32
    assert win.round_status(1, 3) == total - 4 * MiB + 450 * 1024 + 4096 + 3 * 32
    assert win.dispatch_state(4) == total - 4 * MiB + 950 * 1024 + 4 * 512
    assert win.combine_magic(47) == total - 2 * MiB + 975 * 1024 + 47 * 512
    assert win.end == total  # no windowsExp beyond HCCL_BUFFSIZE
    assert win.round_flags_by_state


def _refused(tmp: Path, **workload: Any) -> str:
    return refused(_scenario, tmp, **workload)


def test_a2_refusals(tmp_path: Path) -> None:
    msg = _refused(tmp_path, ep_world_size=16)
    assert "internode" in msg and "not modelled" in msg and "at most 8" in msg
    assert "AICPU side is not public" in msg and "comm_alg hierarchy" in msg
    assert "please use int8 or bf16" in _refused(tmp_path, quant="mx_fp8_e4m3")
    assert "please use int8 or bf16" in _refused(tmp_path, quant="pertoken_fp8_e4m3")
    assert "65536" in _refused(tmp_path, op="dispatch", bs=65537, long_seq_round=9,
                               per_round_tokens=8192)
    assert "MOE_EXPERT_MAX_NUM" in _refused(tmp_path, experts_per_rank=128)
    assert "H_MAX" in _refused(tmp_path, h=8192)
    msg = _refused(tmp_path, hccl_buffsize=800)
    assert "= 833MB" in msg and "404MB) * 2 + 4 * 2MB" in msg
    assert "no SHMEM" in _refused(tmp_path, context="shmem")


def test_a2_refusal_exits_2_in_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    scen = _write(tmp_path, quant="mx_fp8_e5m2")
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "workload.quant" in err, err
    assert not out.exists()
