"""The SHMEM families' shape limits come from their kernels' sources and are refused at
lint in one line (exit 2) naming the key and the allowed range; the tiling the fit
checks read is built once, by the scenario, and carried into the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from npusim.cli import main
from npusim.kernels import registry
from npusim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"

# The bounds below are read off the sources, not off npusim:
# - DISPATCH_MAX_LOCAL_EXPERT_NUM = 1024 (hicann/shmem examples/dispatch/*/dispatch_kernel.h)
# - ACLSHMEM_MAX_AIV_PER_NPU = 48 (hicann/shmem include/host_device/shmem_common_types.h):
#   one core per rank, all in aclshmemi_barrier_core_soft's core sync pool
# - MegaMoE's 8 KiB TOKEN_SCALE_SIZE copy buffer holds Align32(Align256(H) + H / 32) B:
#   H = 7936 needs 7936 + 248 = 8184 -> 8192 B (fits); H = 7968 needs 8192 + 249 (does not)
# - no shared experts in the classic, TileLang or pyPTO kernels, nor in MegaMoE
CASES = [
    (
        "shmem_classic/a3_bs8_ep8.yaml",
        {"experts_per_rank": 1025},
        "workload.experts_per_rank",
        "1..1024",
    ),
    ("shmem_classic/950_bs8_ep8.yaml", {"ep_world_size": 49}, "workload.ep_world_size", "2..48"),
    (
        "shmem_doubleplane/a3_balanced_mte.yaml",
        {"experts_per_rank": 1025},
        "workload.experts_per_rank",
        "1..1024",
    ),
    ("mega_moe/w2_e4m3_random.yaml", {"h": 7968}, "workload.h", "1024..7936"),
    (
        "mega_moe/w2_e4m3_random.yaml",
        {"shared_experts": 1, "shared_expert_ranks": 1},
        "workload.shared_experts",
        "0..0",
    ),
    (
        "frameworks/tilelang_a3_w16_bs8.yaml",
        {"shared_experts": 1, "shared_expert_ranks": 1},
        "workload.shared_experts",
        "0..0",
    ),
    (
        "frameworks/pypto_a3_w16_bs8.yaml",
        {"shared_experts": 1, "shared_expert_ranks": 1},
        "workload.shared_experts",
        "0..0",
    ),
]


def _variant(tmp: Path, shipped: str, change: dict[str, Any]) -> Path:
    doc = yaml.safe_load((SCENARIOS / shipped).read_text())
    doc["workload"].update(change)
    p = tmp / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("shipped, change, key, allowed", CASES)
def test_a_shape_past_the_source_limit_is_one_line_at_lint(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shipped: str,
    change: dict[str, Any],
    key: str,
    allowed: str,
) -> None:
    p = _variant(tmp_path, shipped, change)
    assert main(["lint", str(p)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"{key}:" in err and f"allowed: {allowed} (kernel limit)" in err, err


def test_keys_the_source_leaves_open_say_they_are_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """classic's main.cpp asks bs only to be positive: its bound stays npusim's default."""
    p = _variant(tmp_path, "shmem_classic/a3_bs8_ep8.yaml", {"bs": 600})
    assert main(["lint", str(p)]) == 2
    err = capsys.readouterr().err
    assert "workload.bs:" in err and "(npusim's default limit)" in err, err


def test_the_shipped_scenarios_stay_within_the_limits(tmp_path: Path) -> None:
    for shipped in sorted({c[0] for c in CASES}):
        assert main(["lint", str(SCENARIOS / shipped)]) == 0


@pytest.mark.parametrize("shipped", sorted({c[0] for c in CASES}))
def test_the_tiling_is_built_once_and_carried(
    shipped: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader's fit checks and the run read one tiling: the family builds it once."""
    doc = yaml.safe_load((SCENARIOS / shipped).read_text())
    fam = registry.get(doc["workload"]["kernel"])
    calls = []
    built = type(fam).tiling

    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        calls.append(1)
        return built(self, *args, **kw)

    monkeypatch.setattr(type(fam), "tiling", counted)
    s = load_scenario(SCENARIOS / shipped)
    assert len(calls) == 1
    assert s.tiling is s.tiling and len(calls) == 1
