"""Combinations of a shipped family's keys its kernels cannot run are refused at load, by
`npusim lint` and `npusim run` alike: exit 2, one line naming the key and the least value
that works, nothing written. Each once failed only in the run (a deadlock, a race, a
traceback) or ran on a placement the family does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from npusim.cli import main


def refused(tmp: Path, capsys: pytest.CaptureFixture[str], scenario: str, *sets: str) -> str:
    """The one line lint and run both print for `scenario` with `sets`; run leaves no
    output folder."""
    flags = [a for s in sets for a in ("--set", s)]
    assert main(["lint", scenario, *flags]) == 2
    lint = capsys.readouterr()
    out = tmp / "o"
    assert main(["run", scenario, "--out", str(out), "--quiet", *flags]) == 2
    run = capsys.readouterr()
    assert lint.out == run.out == "" and run.err == lint.err, (lint, run)
    assert run.err.count("\n") == 1 and run.err.startswith("npusim: error: "), run.err
    assert not out.exists()
    return run.err


SHMEM_HOST = "shmem_host/a3_all_2pe"


def test_shmem_host_refuses_more_pes_on_one_server_than_it_has_dies(tmp_path, capsys):
    # atlas_a3: host.dies 16, so PE 16 would sit on a die of the next server
    line = refused(tmp_path, capsys, SHMEM_HOST, "workload.pes=17")
    assert "workload.pes: 17 PEs on one server" in line
    assert "has 16 per server (host.dies); allowed: at most 16, or placement: across" in line


def test_shmem_host_refuses_peers_without_a_peer(tmp_path, capsys):
    line = refused(tmp_path, capsys, SHMEM_HOST, "workload.pes=1", "workload.targets=peers")
    assert "workload.pes: 1: with targets: peers" in line
    assert "allowed: at least 2, or targets: all or self" in line


def test_a_mix_kernel_needs_the_aiv_pair_of_one_block(tmp_path, capsys):
    # pypto_shmem launches min(aic.cores, aiv_cores // 2) blocks of 1 AIC + 2 AIV: with
    # one AIV that is no block at all
    line = refused(tmp_path, capsys, "frameworks/pypto_a3_w16_bs8",
                   "hardware_overrides.chip.aiv_cores=1")
    assert line.endswith("--set hardware_overrides.chip.aiv_cores: 1: pypto_shmem's dispatch "
                         "needs 2 AIV cores (0 blocks of 1 AIC + 2 AIV); allowed: at least 2\n")


def test_deepep_normal_mode_needs_a_core_for_each_of_notify_dispatchs_eight_outputs(
        tmp_path, capsys):
    # notify_dispatch.h builds total_recv_token .. r_in_srcrank_offset each on core 0..7:
    # with 7 cores one of them was never built (with fewer, a race or a deadlock)
    line = refused(tmp_path, capsys, "deepep/a2_normal_ep8_bs256",
                   "hardware_overrides.chip.aiv_cores=7")
    assert "--set hardware_overrides.chip.aiv_cores: 7: notify_dispatch builds its 8 " in line
    assert line.endswith("each on its own fixed core 0..7 (notify_dispatch.h); allowed: at "
                         "least 8\n")


@pytest.mark.parametrize("scenario", ["mc2/a3_v2_bs64_ep8_bs_mode", "mc2/950_v2_bs128_ep8"])
def test_mc2_fullmesh_v2_needs_a_count_core_beside_an_all_to_all_core(tmp_path, capsys,
                                                                     scenario):
    # aivUsedCumSum_ is at most C / 2: C = 1 leaves no core to receive the counts
    line = refused(tmp_path, capsys, scenario, "hardware_overrides.chip.aiv_cores=1")
    assert "--set hardware_overrides.chip.aiv_cores: 1: comm_alg fullmesh_v2 splits" in line
    assert line.endswith("no count core to receive the counts; allowed: at least 2\n")


@pytest.mark.parametrize("scenario, says, least", [
    ("frameworks/tilelang_a3_w16_bs8", "1: T.Kernel(ai_core_num) takes one AIC and two AIVs "
     "per block, 24 here; allowed: at least 48", 48),  # the scenario's ai_core_num: 24
    ("shmem_classic/a3_int32_ep2", "chip.aiv_cores 1 for block_dim = ep_world_size = 2 cores "
     "(core c serves rank c); allowed: at least 2", 2),
    (SHMEM_HOST, "1: 20 blocks of two AIVs need 40 AIV cores; allowed: at least 40", 40),
])
def test_one_aiv_core_names_the_least_count_that_works(tmp_path, capsys, scenario, says,
                                                       least):
    line = refused(tmp_path, capsys, scenario, "hardware_overrides.chip.aiv_cores=1")
    assert line.endswith(f"--set hardware_overrides.chip.aiv_cores: {says}\n")
    assert main(["lint", scenario, "--set", f"hardware_overrides.chip.aiv_cores={least}"]) == 0
