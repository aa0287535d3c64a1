"""Family shmem_classic: outputs against the numpy reference, the issue's --tensors checks,
the harness CSV and metrics, and the refusals. Expected values come from
npusim.kernels.shmem_classic.reference (plain numpy) fed with the examples' inputs, from
the routing itself, or from the harness's formulas restated here."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.kernels.shmem_classic.data_gen import example_inputs
from npusim.kernels.shmem_classic.harness import frame_us
from npusim.kernels.shmem_classic.layout import DTYPE_NAMES
from npusim.kernels.shmem_classic.reference import reference_combine, reference_dispatch
from npusim.scenario import load_scenario
from npusim.sim import simulate

SMALL = {"bs": 8, "h": 1024, "k": 4, "ep_world_size": 4, "experts_per_rank": 2}
# moe_perf_host.h MoeAppendPerfCsvRows' header, typed from the source
HARNESS_HEADER = ("DataSize/B,Npus,Blocks,UBsize/KB,Bandwidth/GB/s,CoreMaxTime/us,Metric,"
                  "GlobalDataSize/B,PerPeBandwidth/GB/s,BS,H,TopK,ExpertPerPe,Dtype,Warmup,"
                  "Loops,ProfPe,CaseId,SingleCoreTime/us")


def _scenario(tmp: Path, hardware: str = "atlas_a3", name: str = "sc", **workload) -> Path:
    w = {"kernel": "shmem_classic", "op": "dispatch_combine", **SMALL,
         "routing": {"kind": "uniform", "seed": 42}}
    w.update(workload)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "hardware": hardware, "workload": w}))
    return p


def _inputs(data_type: str, seed: int = 42, **shape):
    s = {**SMALL, **shape}
    return example_inputs(s["ep_world_size"], s["bs"], s["h"], s["k"], s["experts_per_rank"],
                          DTYPE_NAMES[data_type], seed)


@pytest.mark.parametrize("hardware,data_type,op,shape", [
    ("atlas_a3", "float16_t", "dispatch_combine", {}),
    ("ascend950", "float16_t", "dispatch_combine", {}),
    ("ascend950", "bfloat16_t", "dispatch", {}),
    ("atlas_a3", "int32_t", "dispatch_combine", {"ep_world_size": 2, "k": 2}),
    ("atlas_a2", "int32_t", "combine", {"ep_world_size": 3, "experts_per_rank": 3}),
])
def test_outputs_equal_the_numpy_reference(tmp_path, hardware, data_type, op, shape):
    sc = load_scenario(_scenario(tmp_path, hardware, op=op, data_type=data_type, **shape))
    result = simulate(sc, workers=1)
    s = {**SMALL, **shape}
    ex = _inputs(data_type, **shape)
    disp = reference_dispatch(ex.x, ex.expert_ids, s["experts_per_rank"])
    runs = {r.op: r for r in result.ops}
    if "dispatch" in runs:
        for r, want in enumerate(disp):
            got = runs["dispatch"].outputs[r]
            for name, arr in want.items():
                assert got[name].dtype == arr.dtype
                assert np.array_equal(got[name].view(np.uint8), arr.view(np.uint8)), (r, name)
    if "combine" in runs:
        E = s["ep_world_size"] * s["experts_per_rank"]
        want = reference_combine([d["expand_x"] for d in disp], [d["assist_info"] for d in disp],
                                 [d["ep_recv_count"] for d in disp], ex.expert_ids,
                                 ex.expert_scales, E)
        for r, arr in enumerate(want):
            assert np.array_equal(runs["combine"].outputs[r]["x_out"].view(np.uint8),
                                  arr.view(np.uint8)), r


def test_the_examples_inputs_follow_data_gen():
    ex = _inputs("int32_t")
    assert ex.x.dtype == np.int32 and ex.x.min() >= -5 and ex.x.max() <= 5
    assert ex.expert_ids.min() >= 0 and ex.expert_ids.max() < 8
    assert (ex.expert_scales == 1.0).all()  # int32: scales filled with 1
    f = _inputs("float16_t")
    assert f.x.dtype == np.float16 and np.abs(f.x).max() <= 1.0
    assert f.expert_scales.min() >= 0.05 and f.expert_scales.max() < 1.0
    # one stream for x then ids: the int32 draw and the fp16 draw share no ids
    assert not np.array_equal(ex.expert_ids, f.expert_ids)
    again = _inputs("float16_t")
    assert np.array_equal(f.x, again.x) and np.array_equal(f.expert_ids, again.expert_ids)


@pytest.mark.parametrize("data_type,hardware", [("float16_t", "atlas_a3"),
                                                ("int32_t", "ascend950")])
def test_tensors_dump_holds_the_issue_checks(tmp_path, capsys, data_type, hardware):
    """Per MoE rank, expert_token_nums adds up to the (token, k) pairs routed to it, and the
    identity round trip gives x_out = x * sum_k w_k."""
    path = _scenario(tmp_path, hardware, data_type=data_type)
    out = tmp_path / "t"
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--tensors", str(out),
                 "--quiet", "--workers", "1"]) == 0
    capsys.readouterr()
    W, L = SMALL["ep_world_size"], SMALL["experts_per_rank"]
    ids = np.stack([np.load(out / f"dispatch/rank_{r}/in/expert_ids.npy") for r in range(W)])
    for r in range(W):
        nums = np.load(out / f"dispatch/rank_{r}/out/expert_token_nums.npy")
        assert nums.sum() == np.count_nonzero(ids // L == r)
        for le in range(L):
            assert nums[le] == np.count_nonzero(ids == r * L + le)
        recv = np.load(out / f"dispatch/rank_{r}/out/ep_recv_count.npy")
        assert recv[-1] == nums.sum()
        x = np.load(out / f"dispatch/rank_{r}/in/x.npy")
        w = np.load(out / f"combine/rank_{r}/in/expert_scales.npy")
        x_out = np.load(out / f"combine/rank_{r}/out/x_out.npy")
        want = x.astype(np.float64) * w.astype(np.float64).sum(axis=1, keepdims=True)
        if data_type == "int32_t":
            assert np.array_equal(x_out, x * SMALL["k"])
        else:  # fp32 sums in k order, one fp16 rounding: within a few fp16 ulps
            assert np.allclose(x_out.astype(np.float64), want, rtol=4e-3, atol=2e-3)


def test_harness_csv_has_the_harness_columns_and_formulas(tmp_path, capsys):
    path = _scenario(tmp_path, "atlas_a3")
    csv_path = tmp_path / "perf.csv"
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--harness-csv",
                 str(csv_path), "--quiet"]) == 0
    capsys.readouterr()
    import json

    report = json.loads((tmp_path / "o" / "report.json").read_text())
    W, BS, H, K, L = (SMALL[k] for k in ("ep_world_size", "bs", "h", "k", "experts_per_rank"))
    for op in ("dispatch", "combine"):
        f = tmp_path / f"perf_{op}.csv"
        lines = f.read_text().splitlines()
        assert lines[0] == HARNESS_HEADER
        rows = list(csv.reader(lines[1:]))
        assert len(rows) == 2 * W  # per profiled PE: full_op, comm_only
        fields = next(o for o in report["ops"] if o["op"] == op)["family_fields"]
        for i, row in enumerate(rows):
            pe, metric = i // 2, ("full_op", "comm_only")[i % 2]
            assert row[6] == metric and row[16] == str(pe)
            per_pe = BS * K * H * 2
            assert row[0] == str(per_pe) and row[7] == str(per_pe * W)
            assert row[1:4] == [str(W), str(W), "190"]
            assert row[9:16] == [str(BS), str(H), str(K), str(L), "float16_t", "0", "1"]
            assert row[17] == f"shape_{BS}_{H}_{K}_{W * L}_{W}"
            cores = [float(v) for v in row[18:]]
            assert len(cores) == W  # block_dim = pe
            t = float(row[5])
            assert t == max(cores)
            assert float(row[4]) == pytest.approx(per_pe * W / t * 1e6 / 2**30, abs=1e-4)
            assert float(row[8]) == pytest.approx(per_pe / t * 1e6 / 2**30, abs=1e-4)
            assert cores == [pytest.approx(v, abs=5e-5)
                             for v in fields[f"{metric}_core_us"][pe]]
        for metric in ("full_op", "comm_only"):
            top = max(float(r[5]) for r in rows if r[6] == metric)
            assert fields[f"{metric}_us"] == pytest.approx(top, abs=5e-5)
            assert fields[f"{metric}_bandwidth_gbps"] == pytest.approx(
                BS * K * H * 2 * W / top * 1e6 / 2**30, rel=1e-4)
        assert fields["data_size_b"] == BS * K * H * 2
        assert fields["comm_only_us"] < fields["full_op_us"]
    assert "harness_perf:" in (tmp_path / "o" / "report.md").read_text()


def test_frames_are_read_in_system_counter_ticks():
    # A3: 50 ticks per us (20 ns each); 10 ns -> tick 0, 1000 ns -> tick 50: 1.0 us
    assert frame_us(10.0, 1000.0, 50.0) == 1.0
    assert frame_us(19.9, 40.1, 50.0) == 0.04  # ticks 0 and 2: two ticks of 0.02 us
    assert frame_us(10.0, 1000.0, 1000.0) == pytest.approx(0.99)  # 950: 1 ns ticks


@pytest.mark.parametrize("args,says", [
    (["--harness-csv", "{tmp}"], "is a directory"),
    (["--harness-csv", "{tmp}/no/such/f.csv"], "does not exist"),
])
def test_a_bad_harness_csv_path_is_one_line(tmp_path, capsys, args, says):
    path = _scenario(tmp_path)
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--quiet",
            *(a.format(tmp=tmp_path) for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err and "--harness-csv" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("workload,key,says", [
    ({"dtype": "bfloat16"}, "workload.dtype", "allowed with op combine or dispatch_combine: "
     "int32_t, float16_t"),
    ({"data_type": "bfloat16_t", "op": "combine"}, "workload.data_type", "int32_t, float16_t"),
    # one core per rank, and the core barrier's sync pool holds ACLSHMEM_MAX_AIV_PER_NPU = 48
    ({"ep_world_size": 64, "experts_per_rank": 1}, "workload.ep_world_size",
     "allowed: 2..48 (kernel limit)"),
])
def test_refusals_are_one_line_exit_2(tmp_path, capsys, workload, key, says):
    path = _scenario(tmp_path, **workload)
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and key in err and says in err
    assert not (tmp_path / "o").exists()


def test_bf16_dispatch_alone_runs(tmp_path, capsys):
    path = _scenario(tmp_path, dtype="bfloat16", op="dispatch")
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 0
