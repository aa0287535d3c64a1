"""The memory estimate of a functional run and the stop before allocating."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.footprint import BASE_BYTES, CORE_BYTES, GIB, estimate, limit_bytes
from npusim.scenario import load_scenario


def scenario_file(tmp_path: Path, w: int, bs: int, timing_only: bool = False) -> Path:
    doc = {"name": f"mem_w{w}_bs{bs}", "hardware": "atlas_a3",
           "workload": {"op": "dispatch_combine", "bs": bs, "h": 7168, "k": 8,
                        "ep_world_size": w, "experts_per_rank": 1, "dtype": "bfloat16",
                        "dispatch_quant": "mxfp8", "combine_quant": "int8",
                        "timing_only": timing_only}}
    p = tmp_path / f"w{w}_bs{bs}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_the_estimate_counts_slots_rows_cores_by_hand(tmp_path):
    """W 8, BS 8, K 8 at H 7168: 512 token-expert pairs, each an 8192 B MXFP8 dispatch slot
    (16 blocks of 512), an expand_x row of 7168 B + 224 B scales + 12 B assist info, a
    14336 B combine slot (Align512(2H)) and a 14336 B combine input row; 8 x 48 cores.
    With 2 workers the forked combine holds the reference dispatch's rows too."""
    sc = load_scenario(scenario_file(tmp_path, 8, 8))
    fp = estimate(sc, workers=2)
    row = 7168 + 224 + 12
    assert fp.data.pairs == 512 * (8192 + row + row + 14336 + 14336) + 8 * 8 * 512
    assert fp.cores == 8 * 48 * CORE_BYTES and fp.base == BASE_BYTES
    assert fp.data.ranks == 8 * 3 * 8 * 7168 * 2  # x in, x out, the reference: BS rows of 2H
    one = estimate(sc, workers=1)  # combine's phase: kept rows + its slot + its input row
    assert one.data.pairs == 512 * (row + 14336 + 14336) + 8 * 8 * 512


def test_a_functional_run_beyond_the_limit_stops_in_one_line_before_allocating(tmp_path,
                                                                                  capsys):
    """W 768, BS 80: 491520 pairs of about 50 KiB (both machines) is over 24 GiB."""
    p = scenario_file(tmp_path, 768, 80)
    assert estimate(load_scenario(p)).total > 24 * GIB
    out = tmp_path / "out"
    assert main(["run", str(p), "--out", str(out), "--workers", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "W=768, BS=80" in err and "24 GiB (the default)" in err
    assert not out.exists()


def test_timing_only_runs_are_not_gated(tmp_path, capsys):
    p = scenario_file(tmp_path, 8, 8, timing_only=True)
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--memory", "0.01",
                 "--workers", "1"]) == 0


def test_the_limit_can_be_raised_or_taken_from_the_machine(tmp_path, capsys):
    p = scenario_file(tmp_path, 8, 8)
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--memory", "0.05"]) == 1
    assert "0.05 GiB (--memory)" in capsys.readouterr().err
    assert limit_bytes("48") == (48 * GIB, "48 GiB (--memory)")
    auto, how = limit_bytes("auto")
    assert auto > 0 and ("MemAvailable" in how)
    with pytest.raises(InputError, match="allowed: a number of GiB"):
        limit_bytes("lots")


def _shmem_host(tmp_path: Path, **w) -> Path:
    doc = {"name": "host", "hardware": "atlas_a3",
           "workload": {"kernel": "shmem_host", "pes": 2, "elements": 1000, "blocks": 2, **w}}
    p = tmp_path / "host.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_a_family_without_the_moe_shape_is_estimated_from_its_declared_tensors(tmp_path):
    """shmem_host, 2 PEs of 1000 int32: put writes host_dst (2 segments, 8000 B) on each
    of the 2 dies and reads device_src (4000 B), held twice while it runs; `all` adds
    get's device_dst (8000 B) and reads host_src (8000 B) instead."""
    put = estimate(load_scenario(_shmem_host(tmp_path, op="put")))
    assert put.data.tensors == 2 * 8000 + 2 * 2 * 4000
    both = estimate(load_scenario(_shmem_host(tmp_path, op="all")))
    assert both.data.tensors == 2 * 8000 + 2 * 8000 + 2 * 2 * 8000
    assert put.data.pairs == put.data.ranks == 0
    assert put.cores == 2 * 48 * CORE_BYTES  # two dies of the A3's 48 AIV cores


def test_32_gib_per_pe_is_refused_before_allocating(tmp_path, capsys):
    # elements 2^31 - 1 int64: a 16 GiB segment, two of them in every PE's HOST_SIDE heap
    p = _shmem_host(tmp_path, op="put", elements=(1 << 31) - 1, data_type="int64")
    out = tmp_path / "o"
    assert main(["run", str(p), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    segment = ((1 << 31) - 1) * 8
    tensors = 2 * 2 * segment + 2 * 2 * segment  # host_dst on 2 dies, device_src twice
    need = (tensors + BASE_BYTES + 2 * 48 * CORE_BYTES) / GIB
    assert err.startswith(f"npusim: error: {p}: a functional run of shmem_host needs about "
                          f"{need:.3g} GiB ({tensors / GIB:.3g} GiB of its GM tensors, ")
    assert err.endswith("but the limit is 24 GiB (the default); allowed: smaller "
                        "workload.pes, workload.elements or workload.blocks, "
                        "workload.timing_only: true, or --memory GIB|auto on a larger "
                        "machine\n")


@pytest.mark.parametrize("scenario, family", [
    ("hixl/a3_16pairs_put", "hixl"), ("kv_offload/a3_bs16_64k_hbm", "kv_offload"),
    ("examples/rms_norm_quant_step5", "rms_norm_quant"), ("examples/gelu_vf", "cann_gelu")])
def test_every_family_is_held_to_the_limit(tmp_path, capsys, scenario, family):
    """Each estimate is above 0.05 GiB (the base alone is 48 MiB of it)."""
    out = tmp_path / "o"
    assert main(["run", scenario, "--out", str(out), "--quiet", "--memory", "0.05"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    assert f"a functional run of {family} needs about " in err
    assert "but the limit is 0.05 GiB (--memory); allowed: smaller workload." in err


def test_a_timing_only_shmem_host_run_writes_no_payload_and_is_not_gated(tmp_path, capsys):
    from npusim.kernels.shmem_host.family import FAMILY

    p = _shmem_host(tmp_path, op="all", timing_only=True)
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--quiet", "--memory",
                 "0.01", "--workers", "1"]) == 0
    for timing_only, want in ((True, 0), (False, 1)):
        sc = load_scenario(_shmem_host(tmp_path, op="all", timing_only=timing_only))
        ins = FAMILY.op_inputs("get", sc.tiling, [], None)
        # PE 1's host_src holds 11 in its segment only in a functional run
        got = ins[1]["host_src"].reshape(2, 1000)
        assert not got[0].any() and (got[1] == want * 11).all()
        assert set(ins[1]) == {"host_src"}  # get reads no device_src
