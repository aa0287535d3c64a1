"""chip.arch: families choose their code path from the preset's chip (a CANN SoC name),
never from the preset's name. A user's copy of a shipped preset, under a name of its own,
runs as the original; a preset without the key, or with a value that is no chip, is
refused in one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from npusim.cli import main
from npusim.hw.config import ARCHS, CONFIG_DIR, load_hardware
from npusim.kernels.mc2.family import FAMILY as MC2
from npusim.scenario import load_scenario
from npusim.sim import simulate

SMALL = {"bs": 4, "h": 1024, "k": 2, "ep_world_size": 2, "experts_per_rank": 2,
         "dtype": "bfloat16", "routing": {"kind": "uniform", "seed": 3}}
WORKLOADS = {  # (the shipped preset the copy is made of, a small workload of the family)
    "mc2": ("ascend950", {"kernel": "mc2", "op": "dispatch_combine", "dispatch_quant": "int8"}),
    "mega_moe": ("ascend950", {"kernel": "mega_moe", "op": "mega_moe", "bs": 8, "ffn_dim": 512,
                               "mode": "e4m3", "inputs": "random"}),
    "deepep": ("atlas_a3", {"kernel": "deepep", "op": "dispatch_combine", "bs": 8, "k": 4,
                            "ep_world_size": 4, "experts_per_rank": 4}),
}
ALLOWED = "allowed: ascend910b, ascend910_93, ascend950"


def _copy(tmp: Path, preset: str, name: str, edit: Any = None) -> Path:
    """The shipped preset's file saved as <name>.yaml with `name: <name>` (what a user
    does), its chip section edited by `edit` if given."""
    doc = yaml.safe_load((CONFIG_DIR / f"{preset}.yaml").read_text())
    doc["name"] = name
    if edit is not None:
        edit(doc["chip"])
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _scenario(tmp: Path, hardware: str, workload: dict[str, Any], name: str = "s",
              **overrides: Any) -> Path:
    doc: dict[str, Any] = {"name": name, "hardware": hardware,
                           "workload": {**SMALL, **workload}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _figures(path: Path) -> tuple[list[Any], list[bytes]]:
    """Every op's span and every output byte of the scenario's run."""
    result = simulate(load_scenario(path))
    spans = [(op.op, op.start_ns, op.end_ns) for op in result.ops]
    outputs = [np.ascontiguousarray(v).tobytes() for op in result.ops for rank in op.outputs
               for _, v in sorted(rank.items())]
    return spans, outputs


def test_the_shipped_presets_name_their_chips():
    """The CANN short SoC versions (build.sh --soc / SOC_VERSION_LIST): 910B for the A2,
    910_93 for the A3 (910C), 950 for the 950."""
    chips = {n: load_hardware(n).chip.arch for n in ("atlas_a2", "atlas_a3", "ascend950")}
    assert chips == {"atlas_a2": "ascend910b", "atlas_a3": "ascend910_93",
                     "ascend950": "ascend950"}
    assert set(chips.values()) == set(ARCHS)


@pytest.mark.parametrize("family", sorted(WORKLOADS))
def test_a_renamed_copy_of_a_preset_runs_as_the_original(tmp_path, capsys, family):
    preset, workload = WORKLOADS[family]
    mine = _copy(tmp_path, preset, f"my_{family}")
    copied = _scenario(tmp_path, mine.name, workload, name="copied")
    shipped = _scenario(tmp_path, preset, workload, name="shipped")
    assert load_scenario(copied).hardware.name == f"my_{family}"
    assert main(["lint", str(copied)]) == 0
    assert main(["run", str(copied), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert _figures(copied) == _figures(shipped)


def test_mc2_takes_its_code_path_from_chip_arch(tmp_path):
    """An A3 copy named like a 950 still runs the A3's kernels (arch22), and the 950's
    code path follows the chip when the scenario overrides it."""
    mine = _copy(tmp_path, "atlas_a3", "ascend950_lookalike")
    sc = load_scenario(_scenario(tmp_path, mine.name, WORKLOADS["mc2"][1]))
    w = sc.workload
    assert MC2.tiling(w.shape, w.options, sc.hardware).arch == "arch22"
    over = load_scenario(_scenario(tmp_path, "atlas_a3", WORKLOADS["mc2"][1], name="o",
                                   **{"chip.arch": "ascend950"}))
    w = over.workload
    assert MC2.tiling(w.shape, w.options, over.hardware).arch == "arch35"


def test_mega_moe_on_another_chip_names_chip_arch(tmp_path, capsys):
    path = _scenario(tmp_path, "ascend950", WORKLOADS["mega_moe"][1],
                     **{"chip.arch": "ascend910_93"})
    assert main(["lint", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "hardware_overrides.chip.arch: ascend910_93: mega_moe runs on the Ascend 950" in err


@pytest.mark.parametrize("edit, says", [
    (lambda chip: chip.pop("arch"), f"chip.arch: missing; {ALLOWED}"),
    (lambda chip: chip.update(arch="ascend910"), "chip.arch: 'ascend910' (did you mean "),
    (lambda chip: chip["arch"].update(value="ascend910c"), "chip.arch: 'ascend910c'"),
])
def test_a_preset_without_a_known_chip_arch_is_refused_in_one_line(tmp_path, capsys, edit,
                                                                    says):
    mine = _copy(tmp_path, "ascend950", "my950", edit)
    path = _scenario(tmp_path, mine.name, WORKLOADS["mc2"][1])
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(mine) in err and says in err and ALLOWED in err
    assert not (tmp_path / "out").exists()


def test_chip_arch_provenance_names_the_value(tmp_path, capsys):
    """A name is sourced, and its figure starts with the name as the source writes it."""
    def calibrated(chip: dict[str, Any]) -> None:
        chip["arch"] = {"value": "ascend950", "assumed": {"why": "x", "range": [0, 1]}}

    mine = _copy(tmp_path, "ascend950", "my950", calibrated)
    assert main(["presets", "--explain", str(mine)]) == 2
    assert "chip.arch.assumed: a name is sourced" in capsys.readouterr().err


def test_a_chip_arch_its_figure_does_not_name_is_a_provenance_problem(tmp_path):
    from npusim.hw.config import preset_problems

    mine = _copy(tmp_path, "ascend950", "my950",
                 lambda chip: chip["arch"].update(value="ascend910_93"))
    figure = yaml.safe_load(mine.read_text())["chip"]["arch"]["sourced"]["figure"]
    assert figure.split()[0] == "ascend950"
    assert [p for p in preset_problems(str(mine), tmp_path) if p.startswith("chip.arch")] == [
        f"chip.arch: value 'ascend910_93' but the figure {figure!r} names 'ascend950'"]
