"""Family shmem_doubleplane end to end on the atlas_a3: the outputs are classic's (the
numpy reference of their semantics), the --tensors dumps are consistent, and the plane
accounting is the segment rule's, worked out by hand for a routing built to exercise it.

The routing (W 3, L 1, BS 128, K 2, H 8192 int32_t: 32 KiB rows, 64 rows = 2 MiB), per
rank the rows sent to experts (ranks) 0, 1, 2:
  rank 0: 96, 120, 40  remote 160 over 2 remote segments (80 avg): 120 rows to rank 1 SDMA
  rank 1: 60, 96, 100  remote 160 (80 avg): 100 rows to rank 2 SDMA, 60 (< 2 MiB) MTE
  rank 2: 85, 85, 86   remote 170 (85 avg): 85 rows is 2.66 MiB but not above: MTE
Combine sends each rank's received segments back; on rank r (rows from 0, 1, 2):
  rank 0 holds 96, 60, 85   remote 145 (72.5 avg): the 85 rows from rank 2 SDMA
  rank 1 holds 120, 96, 85  remote 205 (102.5): the 120 from rank 0 SDMA, 85 MTE
  rank 2 holds 40, 100, 86  remote 140 (70): the 100 from rank 1 SDMA
So dispatch moves 220 rows by SDMA and combine 305, one SQE each (a row is < 1 MiB).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.kernels.shmem_classic.reference import reference_combine, reference_dispatch

W, BS, K, H, L = 3, 128, 2, 8192, 1
ROW = H * 4


def _rank(own: int, x: int, y: int, a: int, b: int, c: int) -> list[list[int]]:
    """a tokens pick {own, x}, b {own, y}, c {x, y}."""
    return [[own, x]] * a + [[own, y]] * b + [[x, y]] * c


IDS = np.array([_rank(0, 1, 2, 88, 8, 32), _rank(1, 2, 0, 68, 28, 32),
                _rank(2, 0, 1, 43, 43, 42)], np.int32)


def _scenario(tmp: Path, **workload) -> Path:
    np.save(tmp / "ids.npy", IDS)
    doc = {"name": "dp_test", "hardware": "atlas_a3",
           "workload": {"kernel": "shmem_doubleplane", "op": "dispatch_combine", "bs": BS,
                        "h": H, "k": K, "ep_world_size": W, "experts_per_rank": L,
                        "dtype": "float16", "data_type": "int32_t",
                        "routing": {"kind": "file", "path": "ids.npy"}, **workload}}
    p = tmp / "dp.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `npusim run --tensors` of the routing: (tensors by op/rank/side/name, report)."""
    tmp = tmp_path_factory.mktemp("dp")
    out, tdir = tmp / "out", tmp / "tensors"
    assert main(["run", str(_scenario(tmp)), "--out", str(out), "--tensors", str(tdir),
                 "--quiet"]) == 0
    tensors = {op: [{side: {p.stem: np.load(p) for p in (tdir / op / f"rank_{r}" / side)
                            .glob("*.npy")} for side in ("in", "out")} for r in range(W)]
               for op in ("dispatch", "combine")}
    return tensors, json.loads((out / "report.json").read_text())


def test_the_routing_is_the_one_the_docstring_works_out():
    assert [np.bincount(IDS[r].ravel(), minlength=3).tolist() for r in range(W)] == \
        [[96, 120, 40], [60, 96, 100], [85, 85, 86]]


def test_dispatch_outputs_are_classics_reference(run):
    t, _ = run
    d = t["dispatch"]
    assert all(np.array_equal(d[r]["in"]["expert_ids"], IDS[r]) for r in range(W))
    want = reference_dispatch(np.stack([d[r]["in"]["x"] for r in range(W)]), IDS, L)
    for r in range(W):
        for name, arr in want[r].items():
            assert np.array_equal(d[r]["out"][name], arr), (r, name)


def test_combine_outputs_are_classics_reference_and_the_identity_round_trip(run):
    t, _ = run
    ins = [t["combine"][r]["in"] for r in range(W)]
    scales = np.stack([ins[r]["expert_scales"] for r in range(W)])
    want = reference_combine([ins[r]["expand_x"] for r in range(W)],
                             [ins[r]["assist_info"] for r in range(W)],
                             [ins[r]["ep_recv_count"] for r in range(W)], IDS, scales, W * L)
    for r in range(W):
        x_out = t["combine"][r]["out"]["x_out"]
        assert np.array_equal(x_out, want[r])
        # identity experts: x_out = x * sum_k w_k (int32_t: every weight 1, so 2 x)
        x = t["dispatch"][r]["in"]["x"]
        assert np.array_equal(x_out, (x * scales[r].sum(axis=1)[:, None]).astype(np.int32))


def test_expert_token_nums_add_up_to_the_pairs_routed_to_each_rank(run):
    t, _ = run
    for r in range(W):
        nums = t["dispatch"][r]["out"]["expert_token_nums"]
        assert nums.tolist() == [int((IDS == r * L + le).sum()) for le in range(L)]


def test_the_planes_carry_what_the_rule_picks(run):
    _, report = run
    dispatch, combine = (op["family_fields"] for op in report["ops"])
    total = W * BS * K * ROW  # every routed pair's row crosses exactly once
    for ff, sdma_rows in ((dispatch, 120 + 100), (combine, 85 + 120 + 100)):
        planes = ff["plane_payload_bytes"]
        assert planes["sdma"] == sdma_rows * ROW
        assert planes["mte"] + planes["sdma"] == ff["payload_bytes"] == total
        assert ff["plane_payload_bytes_remote"]["sdma"] == planes["sdma"]  # never local
        assert ff["sdma_sqes"] == sdma_rows
    # the local rows (96 + 96 + 86) stay on MTE to the own window
    local = (96 + 96 + 86) * ROW
    assert dispatch["plane_payload_bytes"]["mte"] - \
        dispatch["plane_payload_bytes_remote"]["mte"] == local


def test_the_sdma_bytes_cross_the_same_links_as_the_mte_puts(run):
    _, report = run
    op = report["ops"][0]
    # every remote payload byte (either plane) goes out of its rank: bytes_sent counts
    # puts and SQEs alike, plus the control words
    ff = op["family_fields"]
    remote = ff["plane_payload_bytes_remote"]["mte"] + ff["plane_payload_bytes_remote"]["sdma"]
    assert op["bytes_sent_total"] >= remote
    assert op["bytes_sent_total"] - remote < W * BS * K * 3 * 64 + W * W * 64  # control only


def test_the_report_has_the_harness_frames(run):
    _, report = run
    for op in report["ops"]:
        ff = op["family_fields"]
        assert 0 < ff["comm_only_us"] < ff["full_op_us"] <= op["latency_us"]


def test_refused_on_the_950_with_one_line_exit_2(tmp_path, capsys):
    p = _scenario(tmp_path, data_type="auto")
    doc = yaml.safe_load(p.read_text())
    doc["hardware"] = "ascend950"
    p.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["run", str(p), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "SDMA" in err and "Ascend950" in err
    assert not out.exists()
