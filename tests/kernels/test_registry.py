"""The kernel-family registry and workload.kernel: the default family, the same report when
it is named explicitly, one-line errors for a misspelt family or another family's option,
and the family's declaration (its options drive validation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.kernels import registry
from npusim.report.build import build_report
from npusim.scenario import load_scenario
from npusim.sim import simulate

WORKLOAD = {"op": "dispatch_combine", "bs": 8, "h": 1024, "k": 4, "ep_world_size": 4,
            "experts_per_rank": 2, "dispatch_quant": "mxfp8", "combine_quant": "int8",
            "routing": {"kind": "uniform", "seed": 2}}


def _write(tmp: Path, name: str, **extra) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": "same", "workload": {**WORKLOAD, **extra}}))
    return p


def _report(path: Path) -> dict:
    rep = build_report(simulate(load_scenario(path)))
    rep["sim"].pop("wall_s")
    rep["scenario"].pop("source")
    return rep


def test_explicit_cann_sample_gives_the_default_report_byte_for_byte(tmp_path):
    default = _report(_write(tmp_path, "default"))
    explicit = _report(_write(tmp_path, "explicit", kernel="cann_sample"))
    assert json.dumps(default, sort_keys=True) == json.dumps(explicit, sort_keys=True)
    assert default["scenario"]["workload"]["kernel"] == "cann_sample"


def test_misspelt_family_is_one_line_exit_2(tmp_path, capsys):
    path = _write(tmp_path, "bad", kernel="can_sample")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload.kernel" in err
    assert "did you mean 'cann_sample'" in err
    assert ("allowed: cann_gelu, cann_sample, deepep, hixl, kv_offload, mc2, mega_moe, "
            "mega_moe_unfused, moe_layer, pypto_shmem, rms_norm_quant, shmem_classic, "
            "shmem_doubleplane, shmem_host, tilelang_shmem") in err
    assert not (tmp_path / "out").exists()


def test_an_option_of_another_family_names_it(tmp_path):
    other = tmp_path / "other.py"
    other.write_text(
        "from npusim.kernels.cann_sample.family import CannSample\n"
        "class Other(CannSample):\n"
        "    name = 'other'\n"
        "    options = ()\n"
        "    def tiling(self, shape, options, hw, timing_only=False):\n"
        "        return super().tiling(shape, {'dispatch_quant': 'none'}, hw, timing_only)\n"
        "FAMILY = Other()\n")
    path = tmp_path / "o.yaml"
    w = {k: v for k, v in WORKLOAD.items() if k != "combine_quant"}
    path.write_text(yaml.safe_dump({"name": "o", "workload": {**w, "kernel": "other.py"}}))
    with pytest.raises(InputError) as info:
        load_scenario(path)
    e = info.value
    assert e.key == "workload.dispatch_quant"
    # dispatch_quant is declared by both MoE built-in families
    assert "an option of kernel family cann_sample, mc2, not of other" in e.message
    assert ("families: cann_gelu, cann_sample, deepep, hixl, kv_offload, mc2, mega_moe, "
            "mega_moe_unfused, moe_layer, pypto_shmem, rms_norm_quant") in e.message


def test_family_options_are_validated_by_their_declaration(tmp_path):
    fam = registry.get("cann_sample")
    quant = next(o for o in fam.options if o.name == "dispatch_quant")
    with pytest.raises(InputError) as info:
        load_scenario(_write(tmp_path, "q", dispatch_quant="fp4"))
    assert info.value.key == "workload.dispatch_quant"
    assert info.value.message.endswith("allowed: " + ", ".join(quant.choices))
    w = load_scenario(_write(tmp_path, "ok")).workload
    assert w.options == {**fam.option_defaults(), "dispatch_quant": "mxfp8",
                         "combine_quant": "int8"}
    assert w.ops == fam.runs["dispatch_combine"]


def test_generic_keys_stay_generic(tmp_path):
    """bs, h, k, ... are the loader's; the family declares only its own options."""
    names = {o.name for o in registry.get("cann_sample").options}
    assert not names & {"op", "bs", "h", "k", "ep_world_size", "experts_per_rank", "dtype",
                        "routing", "timing_only", "shared_experts", "shared_expert_ranks"}


OWN_OPTIONS = """
from npusim.kernels.cann_sample.family import CannSample
from npusim.kernels.family import Option
class Own(CannSample):
    name = "own"
    options = CannSample.options + (
        Option("chunk", "int", 8, "rows per put", lo=1, hi=64),
        Option("slack", "float", 0.5, "a fraction", lo=0.0, hi=1.0),
    )
    def tiling(self, shape, options, hw, timing_only=False):
        own = {k: v for k, v in options.items() if k not in ("chunk", "slack")}
        return super().tiling(shape, own, hw, timing_only)
FAMILY = Own()
"""


@pytest.mark.parametrize("key, value, expect", [
    ("chunk", 100, "100 is out of range; allowed: 1..64"),
    ("chunk", 2.5, "must be an integer 1..64, got 2.5"),
    ("slack", 1.5, "1.5 is out of range; allowed: [0, 1]"),
    ("slack", "x", "must be a number in [0, 1], got 'x'"),
])
def test_int_and_float_options_are_checked_by_range(tmp_path, key, value, expect):
    (tmp_path / "own.py").write_text(OWN_OPTIONS)
    with pytest.raises(InputError) as info:
        load_scenario(_write(tmp_path, "own", kernel="own.py", **{key: value}))
    assert (info.value.key, info.value.message) == (f"workload.{key}", expect)
    ok = load_scenario(_write(tmp_path, "fine", kernel="own.py", chunk=3)).workload
    assert (ok.chunk, ok.slack) == (3, 0.5)


def test_a_choice_default_outside_its_choices_is_an_incomplete_family(tmp_path):
    (tmp_path / "bad.py").write_text(OWN_OPTIONS.replace(
        'Option("chunk", "int", 8', 'Option("mode", "choice", "c", choices=("a", "b"), help=""'
    ).replace(', "rows per put", lo=1, hi=64', ''))
    with pytest.raises(InputError) as info:
        load_scenario(_write(tmp_path, "bad", kernel="bad.py"))
    assert info.value.key == "workload.kernel"
    assert "option 'mode': default 'c' is not one of its choices ['a', 'b']" in info.value.message


# A user family derived from one that declares nothing optional (cann_gelu), with one
# declaration or method changed: the registry refuses the disagreement in one line.
DECLARED = """
from npusim.kernels.cann_gelu.family import CannGelu, Gelu
class Profiled(Gelu):
    {kernel}
class Own(CannGelu):
    name = "own"
    ops = (Profiled(),)
    {family}
FAMILY = Own()
"""


@pytest.mark.parametrize("family, kernel, says", [
    ("references = True", "pass",
     "kernel family 'own' declares references = True but implements no reference_outputs"),
    ("def reference_outputs(self, kernel, tiling, inputs): return None", "pass",
     "kernel family 'own' implements reference_outputs but does not declare references"),
    ("chains = True", "pass",
     "kernel family 'own' declares chains = True but implements no next_reads"),
    ("def next_reads(self, *a): return b''", "pass",
     "kernel family 'own' implements next_reads but does not declare chains"),
    ("case_format = 'a folder'", "pass", "kernel family 'own' declares case_format = "
     "'a folder' but implements no case_misfit, read_case, write_case"),
    ("def read_case(self, *a): return []", "pass",
     "kernel family 'own' implements read_case but does not declare case_format"),
    ("sized_by_routing = True", "pass",
     "kernel family 'own' declares sized_by_routing = True but implements no size_by_routing"),
    ("def size_by_routing(self, *a): return None", "pass",
     "kernel family 'own' implements size_by_routing but does not declare sized_by_routing"),
    ("pass", "profiles = True",
     "kernel 'gelu' of family 'own' declares profiles = True but implements no fields"),
])
def test_a_declaration_the_class_does_not_keep_is_refused(tmp_path, family, kernel, says):
    path = tmp_path / "own.py"
    path.write_text(DECLARED.format(family=family, kernel=kernel))
    with pytest.raises(registry.FamilyError) as info:
        registry.from_file(path)
    assert str(info.value) == f"{path}: {says}"


def test_a_kept_declaration_is_accepted_and_read_by_the_driver(tmp_path):
    path = tmp_path / "own.py"
    path.write_text(DECLARED.format(
        family="references = True\n    def reference_outputs(self, *a): return None",
        kernel="profiles = True\n    def fields(self, call): return {}"))
    fam = registry.from_file(path)
    assert (fam.references, fam.chains, fam.ops[0].profiles) == (True, False, True)


def test_the_built_in_declarations():
    """What each built-in family gives, as its sources have it: the MoE families with a
    dispatch -> combine chain declare both the reference and the digest; the single-kernel
    ones with a numpy reference only the reference; the SHMEM harness ports profile."""
    declared = {n: (registry.get(n).references, registry.get(n).chains) for n in registry.names()}
    chained = {"cann_sample", "deepep", "mc2", "pypto_shmem", "shmem_classic",
               "shmem_doubleplane", "tilelang_shmem"}
    assert {n for n, (r, c) in declared.items() if r and c} == chained
    assert {n for n, (r, c) in declared.items() if r and not c} == {"kv_offload", "mega_moe",
                                                                    "shmem_host"}
    assert not any(c and not r for r, c in declared.values())
    profiling = {n for n in registry.names() if any(k.profiles for k in registry.get(n).ops)}
    assert profiling == {"hixl", "shmem_classic", "shmem_doubleplane", "shmem_host"}
    assert [n for n in registry.names() if registry.get(n).case_format] == ["cann_sample"]


OWN_LIMITS = """
from dataclasses import replace
from npusim.kernels.common.limits import DEFAULT_LIMITS
from npusim.kernels.shmem_classic.family import ShmemClassic
class Own(ShmemClassic):
    name = "own"
    shape_limits = replace(DEFAULT_LIMITS, bs=(1, 2048), source="its own", why="own limit")
FAMILY = Own()
"""


@pytest.mark.parametrize("kernel, bs, says", [
    ("mc2", 600, "600 is out of range; allowed: 1..512 (kernel limit)"),
    ("cann_sample", 600, "600 is out of range; allowed: 1..512 (kernel limit)"),
    ("shmem_classic", 600, "600 is out of range; allowed: 1..512 (npusim's default limit)"),
    ("own.py", 4096, "4096 is out of range; allowed: 1..2048 (own limit)"),
])
def test_bs_is_held_to_the_limits_its_family_declares(tmp_path, kernel, bs, says):
    (tmp_path / "own.py").write_text(OWN_LIMITS)
    with pytest.raises(InputError) as info:
        load_scenario(_shape_only(tmp_path, kernel, bs))
    assert (info.value.key, info.value.message) == ("workload.bs", says)


def _shape_only(tmp: Path, kernel: str, bs: int, hardware: str = "ascend950",
                dtype: str = "float16") -> Path:
    """A scenario of the family with the generic keys only (its options: defaults)."""
    generic = {k: v for k, v in WORKLOAD.items() if "quant" not in k}
    p = tmp / "shape.yaml"
    p.write_text(yaml.safe_dump({"name": "shape", "hardware": hardware,
                                 "workload": {**generic, "kernel": kernel, "bs": bs,
                                              "dtype": dtype}}))
    return p


def test_a_family_with_a_larger_bs_limit_takes_it(tmp_path):
    """The V3 BS limit binds the families that declare it, not a family with its own."""
    (tmp_path / "own.py").write_text(OWN_LIMITS)
    assert load_scenario(_shape_only(tmp_path, "own.py", 1024)).workload.shape.BS == 1024
    deepep = _shape_only(tmp_path, "deepep", 4096, "atlas_a3", "bfloat16")
    assert load_scenario(deepep).workload.shape.BS == 4096


def test_shape_limits_must_be_declared_as_shape_limits(tmp_path):
    (tmp_path / "own.py").write_text(OWN_LIMITS.replace(
        'replace(DEFAULT_LIMITS, bs=(1, 2048), source="its own", why="own limit")', "(1, 2048)"))
    with pytest.raises(registry.FamilyError, match=r"declaration shape_limits = \[1, 2048\]; "
                       "allowed: a npusim.workload.shape.ShapeLimits"):
        registry.from_file(tmp_path / "own.py")
