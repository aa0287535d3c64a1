"""Preset provenance: every value says where it comes from, and what it says holds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import InputError
from npusim.hw.config import (
    CONFIG_DIR,
    HardwareConfig,
    load_hardware,
    load_provenance,
    preset_names,
    preset_problems,
)
from npusim.hw.provenance import Figure, convert, parse_figure

ROOT = Path(__file__).resolve().parents[2]  # fit report paths are relative to it


def _preset_launch_ns(name: str) -> str:
    """kernel.launch_ns of a shipped preset as the messages print it (%g): the tests
    below edit it away from the preset, whatever the preset holds."""
    doc = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    return f"{doc['kernel']['launch_ns']['value']:g}"


def _fitted_launch_ns() -> tuple[str, str]:
    """The ascend950 launch_ns fit report and its fitted value (%g), read from the report."""
    doc = yaml.safe_load((ROOT / "configs" / "ascend950.yaml").read_text())
    report = doc["kernel"]["launch_ns"]["calibrated"]["fit"]
    params = json.loads((ROOT / report).read_text())["parameters"]
    fitted = next(p["fitted"] for p in params if "kernel.launch_ns" in p["keys"])
    return report, f"{fitted:g}"
EG = "fabric.levels.server.egress_gbps"  # the A3 die egress


FLAT_FABRIC = ("dies_per_package", "egress_gbps", "ingress_gbps", "link_latency_ns",
               "d2d_gbps", "d2d_latency_ns")
LEVEL_KEYS = {"pair": ("dies", "link_gbps", "latency_ns"),
              "die": ("dies", "egress_gbps", "ingress_gbps", "latency_ns")}


def numeric_keys(cls: type = HardwareConfig, prefix: str = "", name: str = "ascend950"
                 ) -> list[str]:
    """Every value field of the config, by dotted key (the name is not a value, a name
    with a unit is: chip.arch); the fabric's keys as the preset's form has them: flat, or
    per level by its sharing."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "fabric":
            out += fabric_keys(name)
        elif f.type in ("int", "float") or (f.type == "str" and "unit" in f.metadata):
            out.append(prefix + f.name)
        elif f.type.endswith(" | None"):  # an optional section: the keys of presets with it
            doc = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
            if f.name in doc:
                out += numeric_keys(globals_of(f.type.removesuffix(" | None")),
                                    f"{prefix}{f.name}.", name)
        elif f.type != "str":
            out += numeric_keys(globals_of(f.type.removesuffix(" | None")),
                                f"{prefix}{f.name}.", name)
    return out


def fabric_keys(name: str) -> list[str]:
    doc = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())["fabric"]
    if "levels" not in doc:
        return [f"fabric.{k}" for k in FLAT_FABRIC]
    out = []
    for level, body in doc["levels"].items():
        keys = LEVEL_KEYS.get(body["sharing"], ("dies", "latency_ns"))  # another's ports
        keys += ("uplink_gbps",) if "uplink_gbps" in body else ()
        out += [f"fabric.levels.{level}.{k}" for k in keys]
    return out


def globals_of(name: str) -> type:
    import npusim.hw.config as config

    return getattr(config, name)


def copy_preset(tmp_path: Path, name: str, edit) -> Path:
    doc = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    edit(doc)
    p = tmp_path / f"{name}_edited.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


@pytest.mark.parametrize("text,figure", [
    ("196 GB/s one way per die", Figure(196.0, 196.0, "GB/s")),
    ("1.65-1.8 GHz, SKU dependent", Figure(1.65, 1.8, "GHz")),
    ("~270 GB/s", Figure(270.0, 270.0, "GB/s")),
    ("256 B per repeat (8 x 32 B blocks)", Figure(256.0, 256.0, "B/repeat")),
    ("192 KiB per AIV", Figure(192.0, 192.0, "KiB")),
    ("48 cores per die", Figure(48.0, 48.0, "cores")),
])
def test_figures_parse_as_the_source_states_them(text, figure):
    assert parse_figure(text) == figure


@pytest.mark.parametrize("text,unit,scale,expected", [
    ("196 GB/s", "GB/s", 1.0, (196.0, 196.0)),
    ("192 KiB", "B", 1.0, (196608.0, 196608.0)),          # 192 x 1024
    ("1 GiB", "B", 1.0, (1073741824.0, 1073741824.0)),    # 2^30
    ("1.6 TB/s", "GB/s", 1.0, (1600.0, 1600.0)),
    ("392 GB/s per package", "GB/s", 0.5, (196.0, 196.0)),
    ("0.5 us", "ns", 1.0, (500.0, 500.0)),
])
def test_unit_conversions_by_hand(text, unit, scale, expected):
    assert convert(parse_figure(text), unit, scale) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["fast", "about GB/s", "5 parsecs", "GB/s 196"])
def test_a_figure_without_number_and_known_unit_is_refused(text):
    with pytest.raises(ValueError):
        parse_figure(text)


def test_a_figure_in_another_dimension_does_not_convert():
    with pytest.raises(ValueError, match="does not convert"):
        convert(parse_figure("196 GB/s"), "ns")


@pytest.mark.parametrize("name", preset_names())
def test_every_value_of_every_preset_has_provenance(name):
    entries = load_provenance(name)
    assert sorted(entries) == sorted(numeric_keys(name=name))
    missing = [k for k, (_, _, prov) in entries.items() if prov is None]
    assert missing == []


@pytest.mark.parametrize("name", preset_names())
def test_every_provenance_holds(name):
    """Sourced values are what their figure gives, calibrated ones are in their fit
    report, assumed ones inside their range (and equal to the preset they copy)."""
    assert preset_problems(name, ROOT) == []


def test_the_a3_die_fabric_is_what_cloudmatrix384_gives():
    """CloudMatrix384: 392 GB/s one way per Ascend 910C, two dies; one rank is a die."""
    package, server, supernode = load_hardware("atlas_a3").fabric.levels
    assert server.egress_gbps == 392 / 2 and server.ingress_gbps == 392 / 2
    assert package.dies == 2


def test_the_a3_levels_are_msmodelings_a3_interconnect():
    """msmodeling's A3_INTERCONNECT: grid (48, 8, 2); SIO 224 GB/s 0.2 us, inside a node
    196 GB/s 0.5 us; between nodes the server's ports and, from the CloudMatrix384 paper,
    under 1 us more than inside a node (the bound: 0.5 + 1.0 us)."""
    package, server, supernode = load_hardware("atlas_a3").fabric.levels
    assert (package.dies, server.dies, supernode.dies) == (2, 2 * 8, 2 * 8 * 48)
    assert (package.sharing, package.link_gbps, package.latency_ns) == ("pair", 224, 200)
    assert (server.sharing, server.egress_gbps, server.latency_ns) == ("die", 196, 500)
    assert (supernode.sharing, supernode.latency_ns) == ("server", 500 + 1000)
    assert supernode.uplink_gbps == 16 * 196  # non-blocking: every die of the server at once


def test_the_a2_is_a_full_mesh_of_28_gbps_links_and_roce():
    """A2: 8 cards, 7 HCCS links each of 56 GB/s both ways (392 GB/s per card; one way 196 =
    7 x 28), RoCE 25 GB/s per card (one 200GE port: 200 / 8), grid (128, 8); the 910B3's
    20 AIC + 40 AIV (catlass AscendC910B3 MaxBlock / MaxAivBlock), UB 192 KiB."""
    hw = load_hardware("atlas_a2")
    server, cluster = hw.fabric.levels
    assert (server.dies, server.sharing, server.link_gbps * 2) == (8, "pair", 56)
    assert server.link_gbps * 7 * 2 == 392
    assert (cluster.dies, cluster.sharing, cluster.egress_gbps) == (128 * 8, "die", 200 / 8)
    assert (hw.aic.cores, hw.chip.aiv_cores, hw.ub.bytes) == (20, 2 * 20, 192 * 1024)


def test_the_a2_clock_is_the_910b3_bf16_peak_over_its_cubes():
    """msmodeling's A2_313T_64G: 294.9 TFLOPS BF16 over 20 cube cores of 4096 MACs (2 flops
    each) per cycle is 1.8 GHz, to the profile's 0.1 TFLOPS."""
    hw = load_hardware("atlas_a2")
    tflops = hw.aic.cores * hw.aic.cube_fp16_macs_per_cycle * 2 * hw.chip.clock_ghz / 1000
    assert tflops == pytest.approx(294.9, abs=0.05)


def _calibrated_fits(name: str) -> dict[str, str]:
    """Every calibrated key of a shipped preset and the fit report it names."""
    return {key: prov.fields["fit"] for key, (_, _, prov) in load_provenance(name).items()
            if prov is not None and prov.kind == "calibrated"}


def test_the_a2_copies_no_value_fitted_on_the_a3():
    """No A2 value is calibrated by a fit of the A3's (its table is the A3's, not the A2's),
    and none of the keys the A3 fitted copies the A3 by same_as: each says why on its own."""
    a3_fits = _calibrated_fits("atlas_a3")
    assert a3_fits, "the A3 preset has fitted values to guard against"
    a2 = load_provenance("atlas_a2")
    by_a3_fit = [k for k, fit in _calibrated_fits("atlas_a2").items()
                 if fit in set(a3_fits.values())]
    copied = [k for k in a3_fits if k in a2 and a2[k][2] is not None
              and a2[k][2].fields.get("same_as") == "atlas_a3"]
    assert (by_a3_fit, copied) == ([], [])


def test_a_sourced_value_that_drifts_from_its_figure_fails(tmp_path):
    """The ffa8c23 regression: the A3 egress overwritten by a 950 figure, source kept."""
    def drift(doc):
        doc["fabric"]["levels"]["server"]["egress_gbps"]["value"] = 274.2

    p = copy_preset(tmp_path, "atlas_a3", drift)
    (problem,) = preset_problems(str(p), ROOT)
    assert problem.startswith(EG + ": value 274.2 GB/s")
    assert "gives 196 GB/s" in problem


def test_a_range_figure_holds_inside_and_fails_outside(tmp_path):
    def fast(doc):
        doc["chip"]["clock_ghz"]["value"] = 1.9  # the figure says 1.65-1.8 GHz

    p = copy_preset(tmp_path, "ascend950", fast)
    assert preset_problems(str(p), ROOT) == [
        "chip.clock_ghz: value 1.9 GHz but the figure '1.65-1.8 GHz, SKU dependent' gives "
        "1.65-1.8 GHz"]


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d["kernel"]["launch_ns"]["calibrated"].update(fit="reports/nope.fit.json"),
     "kernel.launch_ns: fit report reports/nope.fit.json is not readable JSON"),
    (lambda d: d["kernel"]["launch_ns"].update(value=9300),
     "kernel.launch_ns: value 9300 but {0} fitted {1}"),
    (lambda d: d["scalar"].update(loop_cycles={"value": 4.0, "calibrated": {
        "fit": "reports/calibration_ascend950.fit.json", "date": "2026-11-29", "method": "m"}}),
     "scalar.loop_cycles: reports/calibration_ascend950.fit.json did not fit "
     "scalar.loop_cycles"),
])
def test_a_calibrated_value_must_be_in_its_fit_report(tmp_path, edit, expected):
    p = copy_preset(tmp_path, "ascend950", edit)
    (problem,) = preset_problems(str(p), ROOT)
    assert problem.startswith(expected.format(*_fitted_launch_ns()))


def test_an_assumed_value_stays_in_its_range_and_equal_to_what_it_copies(tmp_path):
    def edit(doc):
        doc["scalar"]["loop_cycles"]["value"] = 40.0       # range [1, 20]
        doc["kernel"]["launch_ns"]["value"] = 9000.0       # same_as ascend950

    p = copy_preset(tmp_path, "atlas_a3", edit)
    assert preset_problems(str(p), ROOT) == [
        "scalar.loop_cycles: value 40 outside its plausible range [1, 20]",
        f"kernel.launch_ns: value 9000 but ascend950 has {_preset_launch_ns('ascend950')}"]


def test_an_assumed_copy_of_an_unknown_preset_is_a_problem(tmp_path):
    p = copy_preset(tmp_path, "atlas_a3",
                    lambda d: d["kernel"]["launch_ns"]["assumed"].update(same_as="ascend9"))
    (problem,) = preset_problems(str(p), ROOT)
    assert problem.startswith("kernel.launch_ns: same_as ascend9:")
    assert "unknown preset 'ascend9'" in problem


@pytest.mark.parametrize("edit,key,says", [
    (lambda e: e["sourced"].pop("conf"), EG + ".sourced.conf", "missing"),
    (lambda e: e["sourced"].update(conf="high"), EG + ".sourced.conf", "allowed"),
    (lambda e: e["sourced"].update(figure="lots"), EG + ".sourced.figure",
     "must start with a number"),
    (lambda e: e.update(assumed={"why": "x", "range": [1, 2]}), EG,
     "exactly one of"),
    (lambda e: e.update(origin="x"), EG + ".origin", "unknown key"),
    (lambda e: e.update(calibrated=e.pop("sourced")), EG + ".calibrated.doc",
     "unknown key"),
])
def test_a_malformed_provenance_is_a_one_line_error_naming_file_and_key(tmp_path, edit, key,
                                                                        says):
    p = copy_preset(tmp_path, "atlas_a3",
                    lambda d: edit(d["fabric"]["levels"]["server"]["egress_gbps"]))
    with pytest.raises(InputError) as info:
        load_hardware(str(p))
    assert info.value.key == key and str(p) in str(info.value) and says in str(info.value)
    assert "\n" not in str(info.value)


def test_overrides_stay_plain_dotted_keys_and_reports_plain_values():
    key = EG
    hw = load_hardware("atlas_a3", {key: 50})
    server = hw.fabric.levels[1]
    assert server.egress_gbps == 50.0 and server.ingress_gbps == 196.0
    assert hw.to_dict()["fabric"]["levels"]["server"]["egress_gbps"] == 50.0
    with pytest.raises(InputError, match=f"{key} is a single value") as info:
        load_hardware("atlas_a3", {f"{key}.value": 50})
    assert info.value.key == f"hardware_overrides.{key}.value"


def test_a_plain_valued_user_preset_still_loads(tmp_path):
    doc = yaml.safe_load((CONFIG_DIR / "ascend950.yaml").read_text())
    plain = {s: (v if not isinstance(v, dict) else
                 {k: e["value"] if isinstance(e, dict) else e for k, e in v.items()})
             for s, v in doc.items()}  # a string value (vector.model) is plain already
    p = tmp_path / "plain.yaml"
    p.write_text(yaml.safe_dump(plain))
    assert load_hardware(str(p)) == load_hardware("ascend950")
    assert preset_problems(str(p), ROOT)[0].endswith(": no provenance")


def test_presets_explain_prints_every_value_with_unit_and_provenance(capsys):
    assert main(["presets", "--explain", "atlas_a3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if not line.startswith(" ")}
    assert sorted(rows) == sorted(numeric_keys(name="atlas_a3"))
    assert rows[EG].split()[1:4] == ["196", "GB/s", "sourced"]
    assert rows["ub.bytes"].split()[1:3] == ["196608", "B"]
    assert rows["kernel.launch_ns"].split()[1:4] == [_preset_launch_ns("atlas_a3"), "ns",
                                                     "assumed"]
    assert '"392 GB/s one way per Ascend 910C package (two dies)"' in " ".join(out.split())


def test_presets_explain_of_an_unknown_preset_is_exit_2(capsys):
    assert main(["presets", "--explain", "ascend951"]) == 2
    assert "unknown preset 'ascend951'" in capsys.readouterr().err


def test_presets_still_lists_the_presets(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == preset_names()
